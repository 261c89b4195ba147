package fakeapi

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// The dialects' header writers. Each reads the limits from the answer and
// writes nothing for a dimension no limit counts.

// quota is a limit's quota as a count: a bucket's capacity, a window's N.
func quota(r reading) string { return strconv.Itoa(r.Quota) }

// ietfQuota is a limit's quota as the IETF dialect has always written it:
// a bucket's rate per second (over w=1), a window's N.
func ietfQuota(r reading) string {
	if r.Kind == TokenBucket {
		return strconv.FormatFloat(r.Rate, 'f', -1, 64)
	}
	return quota(r)
}

// ietfWindow is the w of a limit's IETF policy, in whole seconds: 1 for a
// bucket (its quota is its rate), the window rounded up for a window.
func ietfWindow(r reading) int64 {
	if r.Kind == TokenBucket {
		return 1
	}
	return ceilSeconds(r.Window)
}

// writeIETF writes every limit in the IETF structured fields, under prefix.
func writeIETF(h http.Header, a *answer, prefix string) {
	var policies, states []string
	for _, r := range a.readings {
		policies = append(policies, fmt.Sprintf(`"%s";q=%s;w=%d`, r.Name, ietfQuota(r), ietfWindow(r)))
		states = append(states, fmt.Sprintf(`"%s";r=%d;t=%d`, r.Name, r.remaining, ceilSeconds(r.reset)))
	}
	h.Set(prefix+"RateLimit-Policy", strings.Join(policies, ", "))
	h.Set(prefix+"RateLimit", strings.Join(states, ", "))
}

// writeSingle writes the binding request limit in three headers; an empty
// name is left out.
func writeSingle(h http.Header, a *answer, limit, remaining, reset string, q func(reading) string, f resetFormat) {
	r, ok := a.binding(Requests)
	if !ok {
		return
	}
	h.Set(limit, q(r))
	h.Set(remaining, strconv.Itoa(r.remaining))
	if reset != "" {
		h.Set(reset, f(a.now, r.reset))
	}
}

func writeGitHub(h http.Header, a *answer) {
	r, ok := a.binding(Requests)
	if !ok {
		return
	}
	resource := r.Name
	if resource == "default" {
		resource = "core"
	}
	h.Set("X-Ratelimit-Limit", quota(r))
	h.Set("X-Ratelimit-Remaining", strconv.Itoa(r.remaining))
	h.Set("X-Ratelimit-Used", strconv.Itoa(r.used()))
	h.Set("X-Ratelimit-Reset", epochSeconds(a.now, r.reset))
	h.Set("X-Ratelimit-Resource", resource)
}

// writeOpenAI writes the requests and tokens dimensions, resets in f.
func writeOpenAI(h http.Header, a *answer, f resetFormat) {
	for _, dim := range []struct {
		unit Unit
		name string
	}{{Requests, "requests"}, {Tokens, "tokens"}} {
		if r, ok := a.binding(dim.unit); ok {
			h.Set("X-Ratelimit-Limit-"+dim.name, quota(r))
			h.Set("X-Ratelimit-Remaining-"+dim.name, strconv.Itoa(r.remaining))
			h.Set("X-Ratelimit-Reset-"+dim.name, f(a.now, r.reset))
		}
	}
}

func writeAnthropic(h http.Header, a *answer) {
	for _, u := range []Unit{Requests, Tokens, InputTokens, OutputTokens} {
		if r, ok := a.binding(u); ok {
			p := "Anthropic-Ratelimit-" + u.String() + "-"
			h.Set(p+"Limit", quota(r))
			h.Set(p+"Remaining", strconv.Itoa(r.remaining))
			h.Set(p+"Reset", rfc3339(a.now, r.reset))
		}
	}
}

func writeReddit(h http.Header, a *answer) {
	r, ok := a.binding(Requests)
	if !ok {
		return
	}
	h.Set("X-Ratelimit-Used", strconv.Itoa(r.used()))
	h.Set("X-Ratelimit-Remaining", strconv.FormatFloat(float64(r.remaining), 'f', 1, 64))
	h.Set("X-Ratelimit-Reset", deltaSeconds(a.now, r.reset))
}

func writeDiscord(h http.Header, a *answer) {
	r, ok := a.binding(Requests)
	if !ok {
		return
	}
	h.Set("X-Ratelimit-Limit", quota(r))
	h.Set("X-Ratelimit-Remaining", strconv.Itoa(r.remaining))
	h.Set("X-Ratelimit-Reset", decimalEpoch(a, r))
	h.Set("X-Ratelimit-Reset-After", decimalSeconds(r.reset))
	h.Set("X-Ratelimit-Bucket", bucketID(r.Name))
	if a.status != http.StatusTooManyRequests || !a.throttled() {
		return
	}
	switch {
	case a.cause == causeStorm:
		h.Set("X-Ratelimit-Scope", "shared")
	case r.Name == "global":
		h.Set("X-Ratelimit-Global", "true")
		h.Set("X-Ratelimit-Scope", "global")
	default:
		h.Set("X-Ratelimit-Scope", "user")
	}
}

// decimalEpoch is the Unix time of the reset in seconds with three
// decimals, rounded up to the millisecond.
func decimalEpoch(a *answer, r reading) string {
	ms := a.now.Add(r.reset).UnixNano()
	ms = (ms + 999_999) / 1_000_000
	return strconv.FormatFloat(float64(ms)/1000, 'f', 3, 64)
}

// bucketID is an opaque id for a limit, as Discord's buckets have.
func bucketID(name string) string {
	f := fnv.New32a()
	f.Write([]byte(name))
	return fmt.Sprintf("%08x", f.Sum32())
}

func writeJira(h http.Header, a *answer) {
	writeIETF(h, a, "Beta-")
	r, ok := a.binding(Requests)
	if !ok {
		return
	}
	h.Set("X-Ratelimit-Limit", quota(r))
	h.Set("X-Ratelimit-Remaining", strconv.Itoa(r.remaining))
	if r.remaining*5 < r.Quota {
		h.Set("X-Ratelimit-Nearlimit", "true")
	}
	h.Set("X-Ratelimit-Reset", isoMinutes(a.now, r.reset))
}

// jiraReason is the RateLimit-Reason of a refusal by r.
func jiraReason(r reading) string {
	if r.Kind == TokenBucket {
		return "jira-burst-based"
	}
	return "jira-quota-tenant-based"
}

// hubSpotPolicies are the request limits HubSpot reports: the shortest
// as secondly and, with two or more, the longest as daily.
func hubSpotPolicies(rs []reading) (secondly, daily *reading) {
	var reqs []reading
	for _, r := range rs {
		if r.Unit == Requests {
			reqs = append(reqs, r)
		}
	}
	if len(reqs) == 0 {
		return nil, nil
	}
	slices.SortStableFunc(reqs, func(x, y reading) int { return cmp.Compare(x.span(), y.span()) })
	secondly = &reqs[0]
	if len(reqs) > 1 {
		daily = &reqs[len(reqs)-1]
	}
	return secondly, daily
}

func writeHubSpot(h http.Header, a *answer) {
	secondly, daily := hubSpotPolicies(a.readings)
	if secondly != nil {
		h.Set("X-Hubspot-Ratelimit-Secondly", quota(*secondly))
		h.Set("X-Hubspot-Ratelimit-Secondly-Remaining", strconv.Itoa(secondly.remaining))
	}
	if daily != nil {
		h.Set("X-Hubspot-Ratelimit-Daily", quota(*daily))
		h.Set("X-Hubspot-Ratelimit-Daily-Remaining", strconv.Itoa(daily.remaining))
	}
}
