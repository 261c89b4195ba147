// Package field reads the values of HTTP fields (headers) that carry rate
// limits: delays in seconds and milliseconds, counts and amounts, resets in
// any unit, timestamps and HTTP-dates, Retry-After (RFC 9110 §10.2.3), and
// the members of structured fields (RFC 8941/9651: RateLimit,
// RateLimit-Policy).
//
// It owns the grammar of a value and nothing more: which header means what,
// for which provider, is egress's dialect readers' (dialect*.go), which
// build on it. It imports only the standard library, and no package of
// egress.
//
// Every value is hostile input: a function here never panics, never
// returns a negative duration and never returns one above its caller's cap,
// and returns ok false for a value it cannot read.
//
// Which parsers, and why these: the module keeps to four dependencies
// (x/time/rate, go-redis, cenkalti/backoff, testify), so the standard
// library is the well-kept parser at hand. Durations go to
// time.ParseDuration, timestamps to time.Parse (HTTP-dates in the three
// layouts of net/http's ParseTime), counts to strconv.ParseFloat, each after
// a shape check that turns away what those parsers accept but a header must
// not carry (signs, exponents, NaN, Inf, hex, underscores). Structured
// fields are split by the small lenient reader here (Members): the standard
// library has none, a structured-fields module would be a fifth dependency,
// and a strict parser would turn away the near-miss values providers send
// (a bare `50;w=60`, Jira's `Beta-` fields, mixed-case keys), where egress
// reads what it can and ignores the rest. Delays in seconds are read by
// decimal, exactly to the nanosecond and saturating, where a float would
// round and overflow.
//
// (The package is its own so that its fuzz targets run in a binary of the
// standard library alone: a fuzzer checks every instrumented edge after
// each input, and in egress's own test binary, with net/http and go-redis,
// it ran about a tenth as many inputs a second.)
package field

import (
	"math"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// Unit is the unit of a reset value (egress.ResetUnit, whose constants
// these are).
type Unit uint8

// The units of reset values.
const (
	UnitAuto         Unit = iota // by its shape: a duration, a number by its size, or a timestamp
	UnitDeltaSeconds             // seconds from now, decimals allowed
	UnitDeltaMillis              // milliseconds from now
	UnitEpochSeconds             // a Unix time in seconds
	UnitEpochMillis              // a Unix time in milliseconds
	UnitDuration                 // a Go-style duration
	UnitTimestamp                // an RFC 3339 or ISO 8601 time, or an HTTP-date
)

// httpDates are the layouts of an HTTP-date (RFC 9110 §5.6.7), as
// net/http's ParseTime reads them: IMF-fixdate, RFC 850 and asctime.
var httpDates = [...]string{"Mon, 02 Jan 2006 15:04:05 GMT", time.RFC850, time.ANSIC}

// httpDate reads an HTTP-date, as net/http's ParseTime does.
func httpDate(s string) (t time.Time, err error) {
	for _, layout := range httpDates {
		if t, err = time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return t, err
}

// RetryAfter returns the wait that Retry-After header values ask for,
// relative to now, capped at max (max > 0; a max <= 0 caps every wait at 0).
// ok is false when no value is usable.
//
// A value is delta-seconds ("120"; a non-negative decimal such as "1.5" is
// accepted too) or an HTTP-date in any of the three formats of
// http.ParseTime (IMF-fixdate, RFC 850, asctime). A date in the past means a
// wait of 0. A number too large to represent is capped at max; signs,
// exponents, NaN, Inf and other garbage are rejected. Surrounding whitespace
// is ignored, and a comma-joined list inside one value is read member by
// member. Among several usable values the largest wins: when a provider
// contradicts itself, waiting longer is the safe reading.
func RetryAfter(values []string, now time.Time, max time.Duration) (wait time.Duration, ok bool) {
	max = nonNegativeWait(max)
	for _, v := range values {
		if d, found := retryAfterValue(v, now, max); found && (!ok || d > wait) {
			wait, ok = d, true
		}
	}
	return wait, ok
}

// retryAfterValue reads one Retry-After field value: a single delta-seconds
// or HTTP-date, or else a comma-joined list of them (the largest wins).
// An HTTP-date contains a comma itself, so a list member that is not usable
// alone is retried joined with the next one.
func retryAfterValue(v string, now time.Time, max time.Duration) (time.Duration, bool) {
	if d, ok := retryAfterOne(v, now, max); ok {
		return d, true
	}
	if !strings.Contains(v, ",") {
		return 0, false
	}
	parts := strings.Split(v, ",")
	var wait time.Duration
	found := false
	for i := 0; i < len(parts); i++ {
		d, ok := retryAfterOne(parts[i], now, max)
		if !ok && i+1 < len(parts) {
			if d, ok = retryAfterOne(parts[i]+","+parts[i+1], now, max); ok {
				i++
			}
		}
		if ok && (!found || d > wait) {
			wait, found = d, true
		}
	}
	return wait, found
}

// retryAfterOne reads a single delta-seconds or HTTP-date, capped at max.
func retryAfterOne(s string, now time.Time, max time.Duration) (time.Duration, bool) {
	s = strings.TrimSpace(s)
	if d, ok := Seconds(s, max); ok {
		return d, true
	}
	if t, err := httpDate(s); err == nil {
		return clampWait(t.Sub(now), max), true
	}
	return 0, false
}

// DictMember splits a dictionary-form member such as `remaining=1`.
// A quoted item ("default") is never one.
func DictMember(item string) (key, val string, ok bool) {
	if strings.HasPrefix(item, `"`) {
		return "", "", false
	}
	key, val, ok = strings.Cut(item, "=")
	return strings.ToLower(strings.TrimSpace(key)), Unquote(strings.TrimSpace(val)), ok
}

// Policy reads a list of quota policies: RateLimit-Policy members such
// as `"default";q=50;w=1`, or limit members such as `50`, `50;w=60` whose
// item is the quota. Among the members with a window, the lowest rate q/w
// wins; without any, the lowest bare quota, with no window.
func Policy(values []string) (limit int64, window time.Duration, hasLimit, hasWindow bool) {
	for _, m := range Members(values) {
		q, ok := count(m.Param("q"))
		if !ok {
			q, ok = count(m.Item)
		}
		if !ok {
			continue
		}
		w, okW := PolicyWindow(m.Param("w"))
		switch {
		case okW && (!hasWindow || lowerQuotaRate(q, w, limit, window)):
			limit, window, hasLimit, hasWindow = q, w, true, true
		case !okW && !hasWindow && (!hasLimit || q < limit):
			limit, hasLimit = q, true
		}
	}
	return limit, window, hasLimit, hasWindow
}

// lowerQuotaRate reports whether q1 per w1 is a lower rate than q2 per w2, that is
// q1·w2 < q2·w1, compared exactly in 128 bits. All arguments are >= 0.
func lowerQuotaRate(q1 int64, w1 time.Duration, q2 int64, w2 time.Duration) bool {
	hi1, lo1 := bits.Mul64(uint64(q1), uint64(w2))
	hi2, lo2 := bits.Mul64(uint64(q2), uint64(w1))
	return hi1 < hi2 || (hi1 == hi2 && lo1 < lo2)
}

// PolicyWindow reads a policy window in seconds (decimals allowed). A window
// of zero or one too long for a time.Duration is not usable.
func PolicyWindow(s string) (time.Duration, bool) {
	whole, nanos, overflow, ok := decimal(s)
	if !ok || overflow || whole > uint64(math.MaxInt64/time.Second)-1 {
		return 0, false
	}
	w := time.Duration(whole)*time.Second + time.Duration(nanos)
	return w, w > 0
}

// Thresholds of the epoch-or-delay rule for Reset headers.
const (
	epochMillisFrom  = 1_000_000_000_000 // 1e12: epoch milliseconds from here on
	epochSecondsFrom = 1_000_000_000     // 1e9 s after the epoch: 2001-09-09
)

// resetFromNumber reads the number of a Reset header as a time from now in
// [0, max]: >= 1e12 is epoch milliseconds, >= 1e9 epoch seconds, anything
// smaller seconds from now (decimals allowed). A number that overflows 64
// bits is not usable.
func resetFromNumber(s string, now time.Time, max time.Duration) (time.Duration, bool) {
	whole, nanos, overflow, ok := decimal(s)
	if !ok || overflow {
		return 0, false
	}
	switch {
	case whole >= epochMillisFrom:
		// whole/1000 < 2^64/1000 fits an int64, and time.Unix takes it.
		sec := int64(whole / 1000)
		nsec := int64(whole%1000)*int64(time.Millisecond) + nanos/1000
		return clampWait(time.Unix(sec, nsec).Sub(now), max), true
	case whole >= epochSecondsFrom:
		return clampWait(time.Unix(int64(whole), nanos).Sub(now), max), true
	default:
		return capSeconds(whole, nanos, max), true
	}
}

// Seconds reads a non-negative decimal number of seconds ("120",
// "1.5", ".5", "2.") as a duration capped at max; a number too large for 64
// bits is capped too. Signs, exponents, NaN, Inf and empty strings are not
// usable. Surrounding whitespace is ignored.
func Seconds(s string, max time.Duration) (time.Duration, bool) {
	whole, nanos, overflow, ok := decimal(s)
	if !ok {
		return 0, false
	}
	if overflow {
		return max, true
	}
	return capSeconds(whole, nanos, max), true
}

// capSeconds is whole seconds plus nanos as a duration, capped at max >= 0.
func capSeconds(whole uint64, nanos int64, max time.Duration) time.Duration {
	if whole > uint64(max/time.Second) {
		return max
	}
	d := time.Duration(whole) * time.Second
	if time.Duration(nanos) > max-d {
		return max
	}
	return d + time.Duration(nanos)
}

// decimal reads a non-negative decimal number: digits, optionally a dot
// and more digits, with at least one digit in all, and surrounding
// whitespace ignored. whole is its integer part (saturated, with overflow
// set, when it does not fit 64 bits); nanos is its fraction in billionths,
// truncated.
func decimal(s string) (whole uint64, nanos int64, overflow, ok bool) {
	s = strings.TrimSpace(s)
	intPart, frac, _ := strings.Cut(s, ".")
	if intPart == "" && frac == "" || !digitsOnly(intPart) || !digitsOnly(frac) {
		return 0, 0, false, false
	}
	for i := 0; i < len(intPart); i++ {
		hi, lo := bits.Mul64(whole, 10)
		sum, carry := bits.Add64(lo, uint64(intPart[i]-'0'), 0)
		if hi != 0 || carry != 0 {
			return math.MaxUint64, 0, true, true
		}
		whole = sum
	}
	for i := 0; i < 9; i++ {
		nanos *= 10
		if i < len(frac) {
			nanos += int64(frac[i] - '0')
		}
	}
	return whole, nanos, false, true
}

// count reads a non-negative integer count (digits only, surrounding
// whitespace and double quotes ignored). Negative, fractional, empty and
// overflowing numbers are not usable.
func count(s string) (int64, bool) {
	s = Unquote(strings.TrimSpace(s))
	if s == "" || !digitsOnly(s) {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// digitsOnly reports whether s is only ASCII digits (true for "").
func digitsOnly(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// Member is one member of a structured-field list (RFC 8941), read
// leniently: the item as written, and its parameters.
type Member struct {
	Item   string
	params []string // "key=value" pieces after the item, as written
}

// param returns the value of the parameter key (matched without regard to
// case; the first wins), unquoted, or "" when absent.
func (m Member) Param(key string) string {
	for _, p := range m.params {
		k, v, _ := strings.Cut(p, "=")
		if strings.EqualFold(strings.TrimSpace(k), key) {
			return Unquote(strings.TrimSpace(v))
		}
	}
	return ""
}

// Members splits field values into list members at commas and each
// member into its item and parameters at semicolons, outside quoted strings.
func Members(values []string) []Member {
	var members []Member
	for _, v := range values {
		for _, raw := range split(v, ',') {
			parts := split(raw, ';')
			item := strings.TrimSpace(parts[0])
			if item == "" && len(parts) == 1 {
				continue
			}
			members = append(members, Member{Item: item, params: parts[1:]})
		}
	}
	return members
}

// split splits s at every sep outside a double-quoted string
// (in which a backslash escapes the next byte). An unterminated string runs
// to the end. It always returns at least one piece.
func split(s string, sep byte) []string {
	var parts []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == sep:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	return append(parts, s[start:])
}

// Unquote strips the double quotes of a structured-field string and its
// backslash escapes; anything else comes back as it is.
func Unquote(s string) string {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return s
	}
	s = s[1 : len(s)-1]
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// clampWait clamps d into [0, max].
func clampWait(d, max time.Duration) time.Duration {
	return min(nonNegativeWait(d), max)
}

// nonNegativeWait returns d, or 0 when d is negative.
func nonNegativeWait(d time.Duration) time.Duration {
	if d < 0 {
		return 0
	}
	return d
}

// CutList returns the first comma-separated member of v and the rest;
// more is false when v held no comma. It costs no allocation, unlike
// strings.Split.
func CutList(v string) (member, rest string, more bool) {
	return strings.Cut(v, ",")
}

// Amount reads a non-negative count, decimals allowed ("42", "999.0",
// "0.5"), surrounding whitespace and double quotes ignored. A sign, an
// exponent, NaN, Inf, hex, an empty string or a number too large for a
// float64 is not usable.
func Amount(s string) (float64, bool) {
	s = Unquote(strings.TrimSpace(s))
	intPart, frac, _ := strings.Cut(s, ".")
	if intPart == "" && frac == "" || !digitsOnly(intPart) || !digitsOnly(frac) {
		return 0, false
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

// Lowest reads counts from every value and every comma-separated
// member and returns the lowest usable one: a provider that repeats a
// header ("991, 98") is read at its most restrictive.
func Lowest(values []string) (n float64, ok bool) {
	for _, v := range values {
		for more := true; more; {
			var m string
			m, v, more = CutList(v)
			if c, usable := Amount(m); usable && (!ok || c < n) {
				n, ok = c, true
			}
		}
	}
	return n, ok
}

// Highest is Lowest's twin for counts of what was spent.
func Highest(values []string) (n float64, ok bool) {
	for _, v := range values {
		for more := true; more; {
			var m string
			m, v, more = CutList(v)
			if c, usable := Amount(m); usable && (!ok || c > n) {
				n, ok = c, true
			}
		}
	}
	return n, ok
}

// parseBool reads "true" or "false" in any case; anything else is not
// usable.
func parseBool(s string) (v, ok bool) {
	s = strings.TrimSpace(s)
	switch {
	case strings.EqualFold(s, "true"):
		return true, true
	case strings.EqualFold(s, "false"):
		return false, true
	}
	return false, false
}

// AnyBool reads boolean values, comma-joined or repeated, and reports
// whether any member said true and whether any said false.
func AnyBool(values []string) (sawTrue, sawFalse bool) {
	for _, v := range values {
		for more := true; more; {
			var m string
			m, v, more = CutList(v)
			if b, ok := parseBool(m); ok {
				sawTrue = sawTrue || b
				sawFalse = sawFalse || !b
			}
		}
	}
	return sawTrue, sawFalse
}

// FirstToken returns the first non-empty member of the values, trimmed
// and unquoted, or "".
func FirstToken(values []string) string {
	for _, v := range values {
		for more := true; more; {
			var m string
			m, v, more = CutList(v)
			if m = Unquote(strings.TrimSpace(m)); m != "" {
				return m
			}
		}
	}
	return ""
}

// Pair reads a "used/capacity" pair such as Shopify's "32/40".
func Pair(s string) (used, capacity float64, ok bool) {
	a, b, found := strings.Cut(s, "/")
	if !found {
		return 0, 0, false
	}
	used, okU := Amount(a)
	capacity, okC := Amount(b)
	return used, capacity, okU && okC
}

// LatestReset reads reset values in unit and returns the latest reset,
// relative to now and capped at max. Each value is read whole first; when
// that fails, member by member at commas, a member that is not usable
// alone being retried joined with the next (an HTTP-date holds a comma).
func LatestReset(values []string, unit Unit, now time.Time, max time.Duration) (d time.Duration, ok bool) {
	for _, v := range values {
		if r, usable := Reset(v, unit, now, max); usable {
			if !ok || r > d {
				d, ok = r, true
			}
			continue
		}
		for more := true; more; {
			var m string
			m, v, more = CutList(v)
			r, usable := Reset(m, unit, now, max)
			if !usable && more {
				next, rest, nextMore := CutList(v)
				// Re-joining allocates, but only for a value that is
				// neither one reset nor a list of them.
				if r, usable = Reset(m+","+next, unit, now, max); usable {
					v, more = rest, nextMore
				}
			}
			if usable && (!ok || r > d) {
				d, ok = r, true
			}
		}
	}
	return d, ok
}

// epochSecondsCeiling bounds an epoch in seconds that is read as a date:
// 1e11 s is in the year 5138; anything later is "far in the future", and
// time.Unix would overflow on the largest values.
const epochSecondsCeiling = 100_000_000_000

// Reset reads one reset value in unit as a time from now in [0, max].
func Reset(s string, unit Unit, now time.Time, max time.Duration) (time.Duration, bool) {
	s = Unquote(strings.TrimSpace(s))
	max = nonNegativeWait(max)
	switch unit {
	case UnitAuto:
		if _, _, _, ok := decimal(s); ok {
			return resetFromNumber(s, now, max)
		}
		if d, ok := goDuration(s, max); ok {
			return d, true
		}
		return Timestamp(s, now, max)
	case UnitDeltaSeconds:
		return Seconds(s, max)
	case UnitDeltaMillis:
		whole, nanos, overflow, ok := decimal(s)
		if !ok {
			return 0, false
		}
		if overflow {
			return max, true
		}
		return capSeconds(whole/1000, int64(whole%1000)*int64(time.Millisecond)+nanos/1000, max), true
	case UnitEpochSeconds:
		whole, nanos, overflow, ok := decimal(s)
		if !ok {
			return 0, false
		}
		if overflow || whole >= epochSecondsCeiling {
			return max, true
		}
		return clampWait(time.Unix(int64(whole), nanos).Sub(now), max), true
	case UnitEpochMillis:
		whole, nanos, overflow, ok := decimal(s)
		if !ok {
			return 0, false
		}
		if overflow || whole/1000 >= epochSecondsCeiling {
			return max, true
		}
		t := time.Unix(int64(whole/1000), int64(whole%1000)*int64(time.Millisecond)+nanos/1000)
		return clampWait(t.Sub(now), max), true
	case UnitDuration:
		return goDuration(s, max)
	case UnitTimestamp:
		return Timestamp(s, now, max)
	}
	return 0, false
}

// goDuration reads a Go-style duration ("6m0s", "1.5s", "12ms",
// "2m59.56s") with time.ParseDuration, capped at max. A sign is not
// usable (a wait is never negative, and "+" is no header's spelling), nor is
// a duration too long for time.Duration.
func goDuration(s string, max time.Duration) (time.Duration, bool) {
	if s == "" || s[0] == '+' || s[0] == '-' {
		return 0, false
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, false
	}
	return min(d, max), true
}

// Timestamp layouts beyond RFC 3339: Jira's ISO 8601 without seconds.
const isoMinutes = "2006-01-02T15:04Z07:00"

// Timestamp reads an RFC 3339 time (fractional seconds allowed), an ISO
// 8601 time without seconds ("2026-03-26T16:00Z") or an HTTP-date, as a
// time from now in [0, max].
func Timestamp(s string, now time.Time, max time.Duration) (time.Duration, bool) {
	if len(s) < 10 {
		return 0, false
	}
	var t time.Time
	var err error
	if s[0] >= '0' && s[0] <= '9' {
		if t, err = time.Parse(time.RFC3339, s); err != nil {
			t, err = time.Parse(isoMinutes, s)
		}
	} else {
		t, err = httpDate(s)
	}
	if err != nil {
		return 0, false
	}
	return clampWait(t.Sub(now), max), true
}

// SecondsToWait turns a float number of seconds, as a JSON body gives it,
// into a wait capped at max; a negative, NaN or infinite number is not
// usable.
func SecondsToWait(v float64, max time.Duration) (time.Duration, bool) {
	if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	max = nonNegativeWait(max)
	if v >= max.Seconds() {
		return max, true
	}
	return min(time.Duration(math.Round(v*float64(time.Second))), max), true
}

// MillisToWait reads retry-after-ms values ("1500", "12.5"): the largest,
// capped at max.
func MillisToWait(values []string, max time.Duration) (d time.Duration, ok bool) {
	return LatestReset(values, UnitDeltaMillis, time.Time{}, max)
}
