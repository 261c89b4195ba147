package fakeapi

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"
)

// Dialect is the provider whose rate-limit headers, refusal status and
// error bodies the API imitates, with the literal formats the providers
// send. Each writes the limits on every response (unless a storm is Bare);
// a dialect that reports one limit per dimension reports the one with the
// fewest units left, or the one that refused the request, and writes
// nothing for a dimension no limit counts (OpenAI's tokens without a
// Tokens limit). Counts are whole units: a bucket's limit is its capacity
// (Limit.Quota), except in the IETF dialect, which has always written a
// bucket's rate over w=1.
type Dialect int

const (
	// IETF writes, when Config.Advertise is set, RateLimit-Policy
	// ("name";q=..;w=.. per limit; a bucket's q is its rate, w=1),
	// RateLimit ("name";r=..;t=.. per limit, t in seconds),
	// X-RateLimit-Limit and X-RateLimit-Remaining. A refusal is 429 with
	// Retry-After in whole seconds, at least 1.
	IETF Dialect = iota
	// IETFDraft writes RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset (delta seconds). 429 with Retry-After.
	IETFDraft
	// GitHub writes x-ratelimit-limit, -remaining, -used, -reset (epoch
	// seconds) and -resource (the limit's name; "default" is "core"). A
	// refusal is 403 with remaining 0 and no Retry-After.
	GitHub
	// Okta writes the hyphenated X-Rate-Limit-Limit, -Remaining and -Reset
	// (epoch seconds), as X (Twitter) and Okta do. A refusal is 429 with no
	// Retry-After: the reset says when.
	Okta
	// OpenAI writes x-ratelimit-{limit,remaining,reset}-{requests,tokens}
	// with Go-style duration resets ("6m0s", "1.5s", "12ms"); a refusal is
	// 429 with retry-after (seconds), retry-after-ms and x-should-retry.
	OpenAI
	// AzureOpenAI writes OpenAI's names with resets in whole seconds; a
	// refusal is 429 with retry-after and retry-after-ms.
	AzureOpenAI
	// Anthropic writes anthropic-ratelimit-{requests,tokens,input-tokens,
	// output-tokens}-{limit,remaining,reset} with RFC 3339 resets; a
	// refusal is 429 with retry-after and x-should-retry.
	Anthropic
	// Reddit writes X-Ratelimit-Used, X-Ratelimit-Remaining as a decimal
	// ("999.0") and X-Ratelimit-Reset (delta seconds). 429 with Retry-After.
	Reddit
	// Discord writes X-RateLimit-Limit, -Remaining, -Reset (epoch seconds
	// with decimals), -Reset-After (seconds with decimals) and -Bucket; a
	// 429 adds X-RateLimit-Scope ("user", "global" for a limit named
	// "global", "shared" for a storm), X-RateLimit-Global for a global
	// limit, Retry-After and a JSON body with retry_after.
	Discord
	// Shopify writes X-Shopify-Shop-Api-Call-Limit as used/capacity
	// ("32/40"); a refusal is 429 with Retry-After in decimal seconds
	// ("2.0").
	Shopify
	// Jira writes Beta-RateLimit-Policy and Beta-RateLimit (the IETF
	// fields under a prefix), X-RateLimit-Limit, X-RateLimit-Remaining,
	// X-RateLimit-NearLimit ("true" under 20% left) and X-RateLimit-Reset
	// in ISO 8601 without seconds ("2026-03-26T16:00Z"); a refusal is 429
	// with Retry-After and RateLimit-Reason.
	Jira
	// Salesforce writes Sforce-Limit-Info ("api-usage=18/5000"); a refusal
	// is 403 REQUEST_LIMIT_EXCEEDED with no Retry-After.
	Salesforce
	// HubSpot writes X-HubSpot-RateLimit-Secondly and -Secondly-Remaining
	// for the shortest limit and, with two limits or more,
	// X-HubSpot-RateLimit-Daily and -Daily-Remaining for the longest; a
	// refusal is 429 with a body naming the policy and no Retry-After.
	HubSpot
	// Zendesk writes X-Rate-Limit, X-Rate-Limit-Remaining, ratelimit-limit,
	// ratelimit-remaining and ratelimit-reset (delta seconds). 429 with
	// Retry-After.
	Zendesk

	dialectEnd // not a dialect: one past the last
)

func (d Dialect) String() string {
	names := [...]string{"IETF", "IETFDraft", "GitHub", "Okta", "OpenAI", "AzureOpenAI", "Anthropic",
		"Reddit", "Discord", "Shopify", "Jira", "Salesforce", "HubSpot", "Zendesk"}
	if d.known() {
		return names[d]
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

func (d Dialect) known() bool { return d >= IETF && d < dialectEnd }

// refusalStatus is the status of a request over a limit.
func (d Dialect) refusalStatus() int {
	switch d {
	case GitHub, Salesforce:
		return http.StatusForbidden
	}
	return http.StatusTooManyRequests
}

// answer is how the API answers one request, and the state of its limits
// right after.
type answer struct {
	now        time.Time
	status     int
	cause      cause
	readings   []reading
	by         int           // the limit that refused, for causeRefused; else -1
	retryAfter time.Duration // causeRefused: until the request fits; causeStorm: Storm.RetryAfter
}

// binding is the reading a dialect reports for unit u: the limit that
// refused the request if it counts u, else the one with the fewest left.
func (a *answer) binding(u Unit) (reading, bool) {
	if a.cause == causeRefused && a.by >= 0 && a.readings[a.by].Unit == u {
		return a.readings[a.by], true
	}
	return tightest(a.readings, u)
}

// throttled reports whether the answer asks the caller to wait: a refusal
// or a storm.
func (a *answer) throttled() bool { return a.cause == causeRefused || a.cause == causeStorm }

// writeHeaders writes the answer's headers in the API's dialect.
func (api *API) writeHeaders(h http.Header, a *answer) {
	d := api.cfg.Dialect
	bare := a.cause == causeStorm && api.cfg.Storm.Bare
	if !bare && (d != IETF || api.cfg.Advertise) {
		d.writeLimits(h, a)
	}
	if a.throttled() && !(a.cause == causeRefused && api.cfg.NoRetryAfter) {
		d.writeRetry(h, a)
	}
	if a.cause == causeBilling && d == OpenAI {
		h.Set("X-Should-Retry", "false")
	}
}

// writeLimits writes the state of the limits.
func (d Dialect) writeLimits(h http.Header, a *answer) {
	switch d {
	case IETF:
		writeIETF(h, a, "")
		writeSingle(h, a, "X-RateLimit-Limit", "X-RateLimit-Remaining", "", ietfQuota, nil)
	case IETFDraft:
		writeSingle(h, a, "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset", quota, deltaSeconds)
	case GitHub:
		writeGitHub(h, a)
	case Okta:
		writeSingle(h, a, "X-Rate-Limit-Limit", "X-Rate-Limit-Remaining", "X-Rate-Limit-Reset", quota, epochSeconds)
	case OpenAI:
		writeOpenAI(h, a, goDuration)
	case AzureOpenAI:
		writeOpenAI(h, a, deltaSeconds)
	case Anthropic:
		writeAnthropic(h, a)
	case Reddit:
		writeReddit(h, a)
	case Discord:
		writeDiscord(h, a)
	case Shopify:
		if r, ok := a.binding(Requests); ok {
			h.Set("X-Shopify-Shop-Api-Call-Limit", fmt.Sprintf("%d/%d", r.used(), r.Quota))
		}
	case Jira:
		writeJira(h, a)
	case Salesforce:
		if r, ok := a.binding(Requests); ok {
			h.Set("Sforce-Limit-Info", fmt.Sprintf("api-usage=%d/%d", r.used(), r.Quota))
		}
	case HubSpot:
		writeHubSpot(h, a)
	case Zendesk:
		writeSingle(h, a, "X-Rate-Limit", "X-Rate-Limit-Remaining", "", quota, nil)
		writeSingle(h, a, "ratelimit-limit", "ratelimit-remaining", "ratelimit-reset", quota, deltaSeconds)
	}
}

// writeRetry writes what asks a throttled caller to wait: Retry-After and
// its kin. A refusal in GitHub, Okta, Salesforce and HubSpot carries none;
// a storm carries its RetryAfter in every dialect, unless it is zero.
func (d Dialect) writeRetry(h http.Header, a *answer) {
	wait := a.retryAfter
	if a.cause == causeStorm && wait == 0 {
		return
	}
	if a.cause == causeRefused {
		switch d {
		case GitHub, Okta, Salesforce, HubSpot:
			return
		}
	}
	switch d {
	case Shopify:
		h.Set("Retry-After", strconv.FormatFloat(math.Max(0.1, ceilTenths(wait)), 'f', 1, 64))
	case OpenAI, AzureOpenAI:
		h.Set("Retry-After", retrySeconds(wait))
		h.Set("Retry-After-Ms", strconv.FormatInt(ceilMillis(wait), 10))
	default:
		h.Set("Retry-After", retrySeconds(wait))
	}
	switch d {
	case OpenAI, Anthropic:
		h.Set("X-Should-Retry", "true")
	case Jira:
		if a.cause == causeRefused {
			h.Set("RateLimit-Reason", jiraReason(a.readings[a.by]))
		}
	}
}

// Formats of a reset or a wait, d from now.

type resetFormat func(now time.Time, d time.Duration) string

// deltaSeconds is d in whole seconds, rounded up.
func deltaSeconds(_ time.Time, d time.Duration) string {
	return strconv.FormatInt(ceilSeconds(d), 10)
}

// epochSeconds is the Unix time of now+d in whole seconds, rounded up.
func epochSeconds(now time.Time, d time.Duration) string {
	t := now.Add(d)
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return strconv.FormatInt(s, 10)
}

// goDuration is d as Go prints it, rounded up to the millisecond: "6m0s",
// "1.5s", "12ms", "0s".
func goDuration(_ time.Time, d time.Duration) string {
	return (time.Duration(ceilMillis(d)) * time.Millisecond).String()
}

// rfc3339 is now+d in RFC 3339, UTC, rounded up to the second.
func rfc3339(now time.Time, d time.Duration) string {
	return ceilTime(now.Add(d), time.Second).Format(time.RFC3339)
}

// isoMinutes is now+d in ISO 8601 without seconds, UTC, rounded up to the
// minute: "2026-03-26T16:00Z".
func isoMinutes(now time.Time, d time.Duration) string {
	return ceilTime(now.Add(d), time.Minute).Format("2006-01-02T15:04Z")
}

// retrySeconds is a Retry-After in whole seconds, rounded up, at least 1.
func retrySeconds(d time.Duration) string {
	return strconv.FormatInt(max(1, ceilSeconds(d)), 10)
}

// decimalSeconds is d in seconds with three decimals, rounded up.
func decimalSeconds(d time.Duration) string {
	return strconv.FormatFloat(float64(ceilMillis(d))/1000, 'f', 3, 64)
}

func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

func ceilTenths(d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	const tenth = 100 * time.Millisecond
	return float64((d+tenth-1)/tenth) / 10
}

// ceilTime is t in UTC rounded up to a multiple of unit.
func ceilTime(t time.Time, unit time.Duration) time.Time {
	u := t.UTC().Truncate(unit)
	if u.Before(t) {
		u = u.Add(unit)
	}
	return u
}
