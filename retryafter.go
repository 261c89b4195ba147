package egress

import (
	"math"
	"math/bits"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// This file reads the Retry-After header of a 429 or 503 (RFC 9110
// §10.2.3), and holds the lenient readers of header numbers, resets and
// structured-field members (draft-ietf-httpapi-ratelimit-headers' RateLimit
// and RateLimit-Policy) that the dialect readers (dialect*.go) build on.
//
// Every header is hostile input: the functions here never panic, never
// return a negative duration and never return one above the caller's cap.

// parseRetryAfter returns the wait that Retry-After header values ask for,
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
func parseRetryAfter(values []string, now time.Time, max time.Duration) (wait time.Duration, ok bool) {
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
	if d, ok := headerSeconds(s, max); ok {
		return d, true
	}
	if t, err := http.ParseTime(s); err == nil {
		return clampWait(t.Sub(now), max), true
	}
	return 0, false
}

// dictMember splits a dictionary-form member such as `remaining=1`.
// A quoted item ("default") is never one.
func dictMember(item string) (key, val string, ok bool) {
	if strings.HasPrefix(item, `"`) {
		return "", "", false
	}
	key, val, ok = strings.Cut(item, "=")
	return strings.ToLower(strings.TrimSpace(key)), sfUnquote(strings.TrimSpace(val)), ok
}

// parsePolicy reads a list of quota policies: RateLimit-Policy members such
// as `"default";q=50;w=1`, or limit members such as `50`, `50;w=60` whose
// item is the quota. Among the members with a window, the lowest rate q/w
// wins; without any, the lowest bare quota, with no window.
func parsePolicy(values []string) (limit int64, window time.Duration, hasLimit, hasWindow bool) {
	for _, m := range sfMembers(values) {
		q, ok := headerCount(m.param("q"))
		if !ok {
			q, ok = headerCount(m.item)
		}
		if !ok {
			continue
		}
		w, okW := policyWindow(m.param("w"))
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

// policyWindow reads a policy window in seconds (decimals allowed). A window
// of zero or one too long for a time.Duration is not usable.
func policyWindow(s string) (time.Duration, bool) {
	whole, nanos, overflow, ok := headerDecimal(s)
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
	whole, nanos, overflow, ok := headerDecimal(s)
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

// headerSeconds reads a non-negative decimal number of seconds ("120",
// "1.5", ".5", "2.") as a duration capped at max; a number too large for 64
// bits is capped too. Signs, exponents, NaN, Inf and empty strings are not
// usable. Surrounding whitespace is ignored.
func headerSeconds(s string, max time.Duration) (time.Duration, bool) {
	whole, nanos, overflow, ok := headerDecimal(s)
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

// headerDecimal reads a non-negative decimal number: digits, optionally a dot
// and more digits, with at least one digit in all, and surrounding
// whitespace ignored. whole is its integer part (saturated, with overflow
// set, when it does not fit 64 bits); nanos is its fraction in billionths,
// truncated.
func headerDecimal(s string) (whole uint64, nanos int64, overflow, ok bool) {
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

// headerCount reads a non-negative integer count (digits only, surrounding
// whitespace and double quotes ignored). Negative, fractional, empty and
// overflowing numbers are not usable.
func headerCount(s string) (int64, bool) {
	s = sfUnquote(strings.TrimSpace(s))
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

// sfMember is one member of a structured-field list (RFC 8941), read
// leniently: the item as written, and its parameters.
type sfMember struct {
	item   string
	params []string // "key=value" pieces after the item, as written
}

// param returns the value of the parameter key (matched without regard to
// case; the first wins), unquoted, or "" when absent.
func (m sfMember) param(key string) string {
	for _, p := range m.params {
		k, v, _ := strings.Cut(p, "=")
		if strings.EqualFold(strings.TrimSpace(k), key) {
			return sfUnquote(strings.TrimSpace(v))
		}
	}
	return ""
}

// sfMembers splits field values into list members at commas and each
// member into its item and parameters at semicolons, outside quoted strings.
func sfMembers(values []string) []sfMember {
	var members []sfMember
	for _, v := range values {
		for _, raw := range sfSplit(v, ',') {
			parts := sfSplit(raw, ';')
			item := strings.TrimSpace(parts[0])
			if item == "" && len(parts) == 1 {
				continue
			}
			members = append(members, sfMember{item: item, params: parts[1:]})
		}
	}
	return members
}

// sfSplit splits s at every sep outside a double-quoted string
// (in which a backslash escapes the next byte). An unterminated string runs
// to the end. It always returns at least one piece.
func sfSplit(s string, sep byte) []string {
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

// sfUnquote strips the double quotes of a structured-field string and its
// backslash escapes; anything else comes back as it is.
func sfUnquote(s string) string {
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
