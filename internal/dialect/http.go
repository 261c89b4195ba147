package dialect

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/egress-go/egress/internal/field"
)

// The built-in readers of the generic dialects: Retry-After and its kin,
// the IETF RateLimit fields (and their older draft, and Jira's Beta-
// prefix), and the X-RateLimit-* families. docs/dialects.md lists what
// each reads.

// ietfReader reads the structured fields of draft-ietf-httpapi-ratelimit-
// headers: field (RateLimit: `"burst";r=5;t=1`) and policy
// (RateLimit-Policy: `"burst";q=100;w=1`), one Quota per policy, joined by
// name; the older dictionary form of the field (`limit=10, remaining=1,
// reset=7`) and the older integer form of the policy (`10;w=1`) too. Jira
// sends the same fields under a Beta- prefix. The quotas count requests:
// a policy whose qu= names another unit is skipped.
type ietfReader struct{ field, policy string }

func (r ietfReader) read(resp *http.Response, s *Reading) {
	fields, policies := resp.Header[r.field], resp.Header[r.policy]
	if len(fields) == 0 && len(policies) == 0 {
		return
	}
	var quotas []Quota
	for _, m := range field.Members(policies) {
		name := field.Unquote(m.Item)
		q, ok := field.Amount(m.Param("q"))
		if !ok { // the older integer form: the item is the quota
			name = ""
			q, ok = field.Amount(m.Item)
		}
		if unit := m.Param("qu"); !ok || unit != "" && !strings.EqualFold(unit, "requests") {
			continue
		}
		w, okW := field.PolicyWindow(m.Param("w"))
		quotas = append(quotas, Quota{Name: name, Limit: q, HasLimit: true, Window: w, HasWindow: okW})
	}
	max := s.MaxWait()
	var dict Quota
	for _, m := range field.Members(fields) {
		if key, val, ok := field.DictMember(m.Item); ok {
			dict = addDictQuota(dict, key, val, max)
			continue
		}
		name := field.Unquote(m.Item)
		rem, okR := field.Amount(m.Param("r"))
		t, okT := field.Seconds(m.Param("t"), max)
		if !okR && !okT {
			continue
		}
		i := policyNamed(quotas, name)
		if i < 0 {
			quotas = append(quotas, Quota{Name: name})
			i = len(quotas) - 1
		}
		q := &quotas[i]
		q.Remaining, q.HasRemaining = rem, okR
		q.Reset, q.HasReset = t, okT
	}
	quotas = append(quotas, dict)
	for _, q := range quotas {
		s.AddQuota(q)
	}
}

// policyNamed returns the index of the quota named name that no field
// member has filled yet, or -1. An unnamed member joins no policy.
func policyNamed(quotas []Quota, name string) int {
	if name == "" {
		return -1
	}
	for i, q := range quotas {
		if q.Name == name && !q.HasRemaining && !q.HasReset {
			return i
		}
	}
	return -1
}

// addDictQuota records one member of the RateLimit field's older
// dictionary form, keeping the most restrictive value of each key.
func addDictQuota(q Quota, key, val string, max time.Duration) Quota {
	switch key {
	case "limit":
		if n, ok := field.Amount(val); ok && (!q.HasLimit || n < q.Limit) {
			q.Limit, q.HasLimit = n, true
		}
	case "remaining":
		if n, ok := field.Amount(val); ok && (!q.HasRemaining || n < q.Remaining) {
			q.Remaining, q.HasRemaining = n, true
		}
	case "reset":
		if d, ok := field.Seconds(val, max); ok && (!q.HasReset || d > q.Reset) {
			q.Reset, q.HasReset = d, true
		}
	}
	return q
}

// draftReader reads the older IETF draft's RateLimit-Limit, -Remaining and
// -Reset (GitLab, Heroku, Zendesk's lowercase ratelimit-*), with GitLab's
// RateLimit-Name, -Observed (used) and -ResetTime (an HTTP-date), into one
// Quota. A limit list such as "10, 10;w=1, 1000;w=3600" gives the policy
// with the lowest rate and its window. The reset is read by the shape rule
// (GitLab sends epoch seconds, Zendesk seconds from now).
type draftReader struct{}

func (draftReader) read(resp *http.Response, s *Reading) {
	h := resp.Header
	limit, remaining, reset := h[hRateLimitLimit], h[hRateLimitRemaining], h[hRateLimitReset]
	observed, resetTime := h[hRateLimitObserved], h[hRateLimitResetTime]
	if len(limit) == 0 && len(remaining) == 0 && len(reset) == 0 && len(observed) == 0 && len(resetTime) == 0 {
		return
	}
	q := Quota{Dimension: Requests, Name: field.FirstToken(h[hRateLimitName])}
	var l int64
	l, q.Window, q.HasLimit, q.HasWindow = field.Policy(limit)
	q.Limit = float64(l)
	q.Remaining, q.HasRemaining = field.Lowest(remaining)
	q.Used, q.HasUsed = field.Highest(observed)
	q.Reset, q.HasReset = field.LatestReset(reset, s.ResetUnit(hRateLimitReset), s.Now(), s.MaxWait())
	if !q.HasReset {
		q.Reset, q.HasReset = field.LatestReset(resetTime, s.ResetUnit(hRateLimitResetTime), s.Now(), s.MaxWait())
	}
	s.AddQuota(q)
}

// xRateLimitReader reads the X-RateLimit-* family: Limit (a count, or a
// policy such as "50;w=60"), Remaining (decimals allowed: Reddit's
// "999.0"), Used, Reset-After (seconds from now, Discord) before Reset (the
// shape rule: epoch seconds at GitHub and Discord, seconds from now at
// Reddit, ISO 8601 at Jira), and the quota's name from GitHub's Resource or
// Discord's Bucket. Those names, or Used, mark a window server. Then the
// hyphenated X-Rate-Limit-* family (X, Okta, Zendesk's X-Rate-Limit,
// Prisjakt) and Fastly-RateLimit-*, each a Quota of its own.
type xRateLimitReader struct{}

func (xRateLimitReader) read(resp *http.Response, s *Reading) {
	h := resp.Header
	max := s.MaxWait()
	limit, remaining, used := h[hXRateLimitLimit], h[hXRateLimitRemaining], h[hXRateLimitUsed]
	reset, after := h[hXRateLimitReset], h[hXRateLimitResetAfter]
	if len(limit) > 0 || len(remaining) > 0 || len(used) > 0 || len(reset) > 0 || len(after) > 0 {
		q := Quota{Dimension: Requests}
		var l int64
		l, q.Window, q.HasLimit, q.HasWindow = field.Policy(limit)
		q.Limit = float64(l)
		q.Remaining, q.HasRemaining = field.Lowest(remaining)
		q.Used, q.HasUsed = field.Highest(used)
		q.Reset, q.HasReset = field.LatestReset(after, resetUnitOr(s, hXRateLimitResetAfter, field.UnitDeltaSeconds), s.Now(), max)
		if !q.HasReset {
			q.Reset, q.HasReset = field.LatestReset(reset, s.ResetUnit(hXRateLimitReset), s.Now(), max)
		}
		if q.Name = field.FirstToken(h[hXRateLimitResource]); q.Name == "" {
			q.Name = field.FirstToken(h[hXRateLimitBucket])
		}
		if q.Name != "" || q.HasUsed {
			q.Kind = KindWindow
		}
		s.AddQuota(q)
	}

	limit, remaining, reset = h[hXRateLimitHyphenLimit], h[hXRateLimitHyphenRemaining], h[hXRateLimitHyphenReset]
	if len(limit) == 0 {
		limit = h[hXRateLimitHyphen]
	}
	if len(limit) > 0 || len(remaining) > 0 || len(reset) > 0 {
		q := Quota{Dimension: Requests}
		q.Limit, q.HasLimit = field.Lowest(limit)
		q.Remaining, q.HasRemaining = field.Lowest(remaining)
		q.Reset, q.HasReset = field.LatestReset(reset, s.ResetUnit(hXRateLimitHyphenReset), s.Now(), max)
		if q.HasReset && absoluteReset(reset, s.ResetUnit(hXRateLimitHyphenReset)) {
			// A reset given as a time (Okta's and X's epoch seconds) is
			// the end of a window: a bucket's "until full" is a delay.
			q.Kind = KindWindow
		}
		s.AddQuota(q)
	}

	remaining, reset = h[hFastlyRemaining], h[hFastlyReset]
	if len(remaining) > 0 || len(reset) > 0 {
		q := Quota{Dimension: Requests, Kind: KindWindow}
		q.Remaining, q.HasRemaining = field.Lowest(remaining)
		q.Reset, q.HasReset = field.LatestReset(reset, s.ResetUnit(hFastlyReset), s.Now(), max)
		s.AddQuota(q)
	}
}

// absoluteReset reports whether a reset header's first value, read in
// unit, is a point in time (an epoch or a timestamp) rather than a delay.
func absoluteReset(values []string, unit field.Unit) bool {
	switch unit {
	case field.UnitEpochSeconds, field.UnitEpochMillis, field.UnitTimestamp:
		return true
	case field.UnitAuto:
		if len(values) == 0 {
			return false
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(values[0]), 64)
		return err == nil && v >= 1e9
	}
	return false
}

// resetUnitOr returns the unit set for header, or def when none is.
func resetUnitOr(s *Reading, header string, def field.Unit) field.Unit {
	if u := s.ResetUnit(header); u != field.UnitAuto {
		return u
	}
	return def
}
