package egress

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The value parsers the built-in readers share, over the helpers of
// retryafter.go. Each returns ok false for a value it cannot read; none
// panics, none returns a negative duration or one above its cap.
//
// Which parsers, and why these: the module keeps to four dependencies
// (x/time/rate, go-redis, cenkalti/backoff, testify), so the standard
// library is the well-kept parser at hand. Durations go to
// time.ParseDuration, timestamps to time.Parse and http.ParseTime, counts to
// strconv.ParseFloat, each after a shape check that turns away what those
// parsers accept but a header must not carry (signs, exponents, NaN, Inf,
// hex, underscores). Structured fields (RFC 8941/9651) are split by the small
// lenient reader of retryafter.go (sfMembers): the standard library has none,
// a structured-fields module would be a fifth dependency, and a strict
// parser would turn away the near-miss values providers send (a bare
// `50;w=60`, Jira's `Beta-` fields, mixed-case keys), where egress reads
// what it can and ignores the rest. Delays in seconds are read by
// headerDecimal, exactly to the nanosecond and saturating, where a float
// would round and overflow.

// Header names, in the canonical form of http.CanonicalHeaderKey, so that a
// lookup is a plain map index and costs no allocation.
const (
	hRetryAfter   = "Retry-After"
	hRetryAfterMs = "Retry-After-Ms"
	hShouldRetry  = "X-Should-Retry"

	hRateLimit           = "Ratelimit"
	hRateLimitPolicy     = "Ratelimit-Policy"
	hBetaRateLimit       = "Beta-Ratelimit"
	hBetaRateLimitPolicy = "Beta-Ratelimit-Policy"
	hRateLimitLimit      = "Ratelimit-Limit"
	hRateLimitRemaining  = "Ratelimit-Remaining"
	hRateLimitReset      = "Ratelimit-Reset"
	hRateLimitResetTime  = "Ratelimit-Resettime"
	hRateLimitName       = "Ratelimit-Name"
	hRateLimitObserved   = "Ratelimit-Observed"

	hXRateLimitLimit      = "X-Ratelimit-Limit"
	hXRateLimitRemaining  = "X-Ratelimit-Remaining"
	hXRateLimitUsed       = "X-Ratelimit-Used"
	hXRateLimitReset      = "X-Ratelimit-Reset"
	hXRateLimitResetAfter = "X-Ratelimit-Reset-After"
	hXRateLimitResource   = "X-Ratelimit-Resource"
	hXRateLimitBucket     = "X-Ratelimit-Bucket"
	hXRateLimitGlobal     = "X-Ratelimit-Global"
	hXRateLimitScope      = "X-Ratelimit-Scope"

	hXRateLimitHyphen          = "X-Rate-Limit"
	hXRateLimitHyphenLimit     = "X-Rate-Limit-Limit"
	hXRateLimitHyphenRemaining = "X-Rate-Limit-Remaining"
	hXRateLimitHyphenReset     = "X-Rate-Limit-Reset"
	hFastlyRemaining           = "Fastly-Ratelimit-Remaining"
	hFastlyReset               = "Fastly-Ratelimit-Reset"

	hXRateLimitLimitRequests     = "X-Ratelimit-Limit-Requests"
	hXRateLimitLimitTokens       = "X-Ratelimit-Limit-Tokens"
	hXRateLimitRemainingRequests = "X-Ratelimit-Remaining-Requests"
	hXRateLimitRemainingTokens   = "X-Ratelimit-Remaining-Tokens"
	hXRateLimitResetRequests     = "X-Ratelimit-Reset-Requests"
	hXRateLimitResetTokens       = "X-Ratelimit-Reset-Tokens"

	hAnthropicRequestsLimit     = "Anthropic-Ratelimit-Requests-Limit"
	hAnthropicRequestsRemaining = "Anthropic-Ratelimit-Requests-Remaining"
	hAnthropicRequestsReset     = "Anthropic-Ratelimit-Requests-Reset"
	hAnthropicTokensLimit       = "Anthropic-Ratelimit-Tokens-Limit"
	hAnthropicTokensRemaining   = "Anthropic-Ratelimit-Tokens-Remaining"
	hAnthropicTokensReset       = "Anthropic-Ratelimit-Tokens-Reset"
	hAnthropicInputLimit        = "Anthropic-Ratelimit-Input-Tokens-Limit"
	hAnthropicInputRemaining    = "Anthropic-Ratelimit-Input-Tokens-Remaining"
	hAnthropicInputReset        = "Anthropic-Ratelimit-Input-Tokens-Reset"
	hAnthropicOutputLimit       = "Anthropic-Ratelimit-Output-Tokens-Limit"
	hAnthropicOutputRemaining   = "Anthropic-Ratelimit-Output-Tokens-Remaining"
	hAnthropicOutputReset       = "Anthropic-Ratelimit-Output-Tokens-Reset"

	hShopifyCallLimit = "X-Shopify-Shop-Api-Call-Limit"
	hGorgiasCallLimit = "X-Gorgias-Account-Api-Call-Limit"
	hSforceLimitInfo  = "Sforce-Limit-Info"

	hHubSpotDaily             = "X-Hubspot-Ratelimit-Daily"
	hHubSpotDailyRemaining    = "X-Hubspot-Ratelimit-Daily-Remaining"
	hHubSpotSecondly          = "X-Hubspot-Ratelimit-Secondly"
	hHubSpotSecondlyRemaining = "X-Hubspot-Ratelimit-Secondly-Remaining"
	hHubSpotIntervalMs        = "X-Hubspot-Ratelimit-Interval-Milliseconds"
	hHubSpotMax               = "X-Hubspot-Ratelimit-Max"
	hHubSpotRemaining         = "X-Hubspot-Ratelimit-Remaining"

	hStripeShouldRetry = "Stripe-Should-Retry"
	hStripeReason      = "Stripe-Rate-Limited-Reason"

	hXRateLimitNearLimit     = "X-Ratelimit-Nearlimit"
	hXBetaRateLimitNearLimit = "X-Beta-Ratelimit-Nearlimit"
	hRateLimitReason         = "Ratelimit-Reason"
	hXBetaRateLimitReason    = "X-Beta-Ratelimit-Reason"
	hXBetaRateLimitReset     = "X-Beta-Ratelimit-Reset"

	zendeskPrefix = "Zendesk-Ratelimit-"
)

// cutList returns the first comma-separated member of v and the rest;
// more is false when v held no comma. It costs no allocation, unlike
// strings.Split.
func cutList(v string) (member, rest string, more bool) {
	return strings.Cut(v, ",")
}

// parseAmount reads a non-negative count, decimals allowed ("42", "999.0",
// "0.5"), surrounding whitespace and double quotes ignored. A sign, an
// exponent, NaN, Inf, hex, an empty string or a number too large for a
// float64 is not usable.
func parseAmount(s string) (float64, bool) {
	s = sfUnquote(strings.TrimSpace(s))
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

// lowestAmount reads counts from every value and every comma-separated
// member and returns the lowest usable one: a provider that repeats a
// header ("991, 98") is read at its most restrictive.
func lowestAmount(values []string) (n float64, ok bool) {
	for _, v := range values {
		for more := true; more; {
			var m string
			m, v, more = cutList(v)
			if c, usable := parseAmount(m); usable && (!ok || c < n) {
				n, ok = c, true
			}
		}
	}
	return n, ok
}

// highestAmount is lowestAmount's twin for counts of what was spent.
func highestAmount(values []string) (n float64, ok bool) {
	for _, v := range values {
		for more := true; more; {
			var m string
			m, v, more = cutList(v)
			if c, usable := parseAmount(m); usable && (!ok || c > n) {
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

// anyBool reads boolean values, comma-joined or repeated, and reports
// whether any member said true and whether any said false.
func anyBool(values []string) (sawTrue, sawFalse bool) {
	for _, v := range values {
		for more := true; more; {
			var m string
			m, v, more = cutList(v)
			if b, ok := parseBool(m); ok {
				sawTrue = sawTrue || b
				sawFalse = sawFalse || !b
			}
		}
	}
	return sawTrue, sawFalse
}

// firstToken returns the first non-empty member of the values, trimmed
// and unquoted, or "".
func firstToken(values []string) string {
	for _, v := range values {
		for more := true; more; {
			var m string
			m, v, more = cutList(v)
			if m = sfUnquote(strings.TrimSpace(m)); m != "" {
				return m
			}
		}
	}
	return ""
}

// parsePair reads a "used/capacity" pair such as Shopify's "32/40".
func parsePair(s string) (used, capacity float64, ok bool) {
	a, b, found := strings.Cut(s, "/")
	if !found {
		return 0, 0, false
	}
	used, okU := parseAmount(a)
	capacity, okC := parseAmount(b)
	return used, capacity, okU && okC
}

// pairQuota is the quota a "used/capacity" pair says: Remaining is what is
// left of the capacity, never below 0.
func pairQuota(used, capacity float64) Quota {
	return Quota{
		Dimension: Requests,
		Limit:     capacity, HasLimit: true,
		Used: used, HasUsed: true,
		Remaining: max(capacity-used, 0), HasRemaining: true,
	}
}

// latestReset reads reset values in unit and returns the latest reset,
// relative to now and capped at max. Each value is read whole first; when
// that fails, member by member at commas, a member that is not usable
// alone being retried joined with the next (an HTTP-date holds a comma).
func latestReset(values []string, unit ResetUnit, now time.Time, max time.Duration) (d time.Duration, ok bool) {
	for _, v := range values {
		if r, usable := parseReset(v, unit, now, max); usable {
			if !ok || r > d {
				d, ok = r, true
			}
			continue
		}
		for more := true; more; {
			var m string
			m, v, more = cutList(v)
			r, usable := parseReset(m, unit, now, max)
			if !usable && more {
				next, rest, nextMore := cutList(v)
				// Re-joining allocates, but only for a value that is
				// neither one reset nor a list of them.
				if r, usable = parseReset(m+","+next, unit, now, max); usable {
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

// parseReset reads one reset value in unit as a time from now in [0, max].
func parseReset(s string, unit ResetUnit, now time.Time, max time.Duration) (time.Duration, bool) {
	s = sfUnquote(strings.TrimSpace(s))
	max = nonNegativeWait(max)
	switch unit {
	case ResetAuto:
		if _, _, _, ok := headerDecimal(s); ok {
			return resetFromNumber(s, now, max)
		}
		if d, ok := goDuration(s, max); ok {
			return d, true
		}
		return timestamp(s, now, max)
	case ResetDeltaSeconds:
		return headerSeconds(s, max)
	case ResetDeltaMillis:
		whole, nanos, overflow, ok := headerDecimal(s)
		if !ok {
			return 0, false
		}
		if overflow {
			return max, true
		}
		return capSeconds(whole/1000, int64(whole%1000)*int64(time.Millisecond)+nanos/1000, max), true
	case ResetEpochSeconds:
		whole, nanos, overflow, ok := headerDecimal(s)
		if !ok {
			return 0, false
		}
		if overflow || whole >= epochSecondsCeiling {
			return max, true
		}
		return clampWait(time.Unix(int64(whole), nanos).Sub(now), max), true
	case ResetEpochMillis:
		whole, nanos, overflow, ok := headerDecimal(s)
		if !ok {
			return 0, false
		}
		if overflow || whole/1000 >= epochSecondsCeiling {
			return max, true
		}
		t := time.Unix(int64(whole/1000), int64(whole%1000)*int64(time.Millisecond)+nanos/1000)
		return clampWait(t.Sub(now), max), true
	case ResetDuration:
		return goDuration(s, max)
	case ResetTimestamp:
		return timestamp(s, now, max)
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

// timestamp reads an RFC 3339 time (fractional seconds allowed), an ISO
// 8601 time without seconds ("2026-03-26T16:00Z") or an HTTP-date, as a
// time from now in [0, max].
func timestamp(s string, now time.Time, max time.Duration) (time.Duration, bool) {
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
		t, err = http.ParseTime(s)
	}
	if err != nil {
		return 0, false
	}
	return clampWait(t.Sub(now), max), true
}

// secondsToWait turns a float number of seconds, as a JSON body gives it,
// into a wait capped at max; a negative, NaN or infinite number is not
// usable.
func secondsToWait(v float64, max time.Duration) (time.Duration, bool) {
	if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	max = nonNegativeWait(max)
	if v >= max.Seconds() {
		return max, true
	}
	return min(time.Duration(math.Round(v*float64(time.Second))), max), true
}

// millisToWait reads retry-after-ms values ("1500", "12.5"): the largest,
// capped at max.
func millisToWait(values []string, max time.Duration) (d time.Duration, ok bool) {
	return latestReset(values, ResetDeltaMillis, time.Time{}, max)
}
