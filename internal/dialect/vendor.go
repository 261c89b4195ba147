package dialect

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/egress-go/egress/internal/field"
)

// The built-in readers of single providers' dialects.

// discordReader reads what Discord adds to the X-RateLimit-* family (read by
// xRateLimitReader): X-RateLimit-Scope (user and global: ScopeQuota;
// shared, a shared resource's limit: ScopeOther), X-RateLimit-Global: true
// (ScopeQuota), and a 429's JSON body: retry_after (seconds, decimals) and
// global.
type discordReader struct{}

func (discordReader) read(resp *http.Response, s *Reading) {
	h := resp.Header
	switch scope := field.FirstToken(h[hXRateLimitScope]); {
	case strings.EqualFold(scope, "user"), strings.EqualFold(scope, "global"):
		s.SetScope(ScopeQuota)
	case strings.EqualFold(scope, "shared"):
		s.SetScope(ScopeOther)
	}
	if global, _ := field.AnyBool(h[hXRateLimitGlobal]); global {
		s.SetScope(ScopeQuota)
	}
	if b := jsonErrorPrefix(resp, "retry_after"); b != nil {
		var body struct {
			RetryAfter *float64 `json:"retry_after"`
			Global     *bool    `json:"global"`
		}
		_ = json.Unmarshal(b, &body) // a field of the wrong type leaves the others read
		if body.RetryAfter != nil {
			if d, ok := field.SecondsToWait(*body.RetryAfter, s.ParseCap()); ok {
				s.AddRetryAfter(d)
			}
		}
		if body.Global != nil && *body.Global {
			s.SetScope(ScopeQuota)
		}
	}
}

// callLimitReader reads the "used/capacity" call limits of leaky-bucket
// providers: Shopify's X-Shopify-Shop-Api-Call-Limit ("32/40") and
// Gorgias's X-Gorgias-Account-Api-Call-Limit ("10/40"). No reset is sent,
// and the header does not state the leak rate; both providers document a
// bucket that empties in 20 seconds (Shopify REST: 40 at 2/s, 80 at 4/s,
// shopify.dev "REST Admin API rate limits"; Gorgias: "40 requests in a 20
// second window", 80 with OAuth2, developers.gorgias.com "Limitations"),
// so the quota's window is callLimitWindow: the capacity over it is the
// leak rate, advertised.
type callLimitReader struct{}

// callLimitWindow is the time a used/capacity bucket takes to empty (see
// callLimitReader). A plan that leaks faster is paced below its rate
// (Gorgias's enterprise accounts: a 10-second window); one that leaks
// slower is paced above it: its counts then empty the limiter's bucket
// (Decision.drain) and its refusals hold the key, but lower nothing while
// the advertised rate is believed. WithoutAdvertisedLimits turns the pace
// off, and discovery finds the rate.
const callLimitWindow = 20 * time.Second

func (callLimitReader) read(resp *http.Response, s *Reading) {
	for _, name := range [...]string{hShopifyCallLimit, hGorgiasCallLimit} {
		for _, v := range resp.Header[name] {
			for more := true; more; {
				var m string
				m, v, more = field.CutList(v)
				if used, capacity, ok := field.Pair(m); ok {
					q := pairQuota(used, capacity)
					q.Kind = KindBucket
					q.Window, q.HasWindow = callLimitWindow, true
					s.AddQuota(q)
				}
			}
		}
	}
}

// salesforceReader reads Salesforce's Sforce-Limit-Info:
// "api-usage=18/5000; per-app-api-usage=17/250(appName=app)", one Quota per
// named pair, each over a window of a day (the count is of a rolling 24
// hours; no reset is sent: see Quota.impliedReset), counted as a window's.
type salesforceReader struct{}

func (salesforceReader) read(resp *http.Response, s *Reading) {
	for _, v := range resp.Header[hSforceLimitInfo] {
		for v != "" {
			var m string
			m, v = cutMember(v)
			name, val, ok := strings.Cut(m, "=")
			if !ok {
				continue
			}
			if i := strings.IndexByte(val, '('); i >= 0 {
				val = val[:i] // "(appName=...)"
			}
			if used, capacity, ok := field.Pair(val); ok {
				q := pairQuota(used, capacity)
				q.Name = strings.TrimSpace(name)
				q.Window, q.HasWindow, q.Kind = 24*time.Hour, true, KindWindow
				s.AddQuota(q)
			}
		}
	}
}

// hubSpotReader reads HubSpot's X-HubSpot-RateLimit-Daily and
// -Daily-Remaining (Name "daily", a window of a day: it runs midnight to
// midnight in the account's time zone), -Secondly and -Secondly-Remaining
// (Name "secondly", a one-second window), and -Interval-Milliseconds, -Max
// and -Remaining (Name "interval", the window the milliseconds state), each
// counted as a window's. No reset is sent: see Quota.impliedReset.
type hubSpotReader struct{}

func (hubSpotReader) read(resp *http.Response, s *Reading) {
	h := resp.Header
	addCounts(s, Quota{Name: "daily", Window: 24 * time.Hour, HasWindow: true, Kind: KindWindow}, h[hHubSpotDaily], h[hHubSpotDailyRemaining])
	addCounts(s, Quota{Name: "secondly", Window: time.Second, HasWindow: true, Kind: KindWindow}, h[hHubSpotSecondly], h[hHubSpotSecondlyRemaining])
	q := Quota{Name: "interval", Kind: KindWindow}
	if ms, ok := field.Lowest(h[hHubSpotIntervalMs]); ok && ms > 0 && ms < 1e12 {
		q.Window, q.HasWindow = time.Duration(ms*float64(time.Millisecond)), true
	}
	addCounts(s, q, h[hHubSpotMax], h[hHubSpotRemaining])
}

// addCounts adds q, a requests quota, with the limit and remaining counts
// the values state, if they state either.
func addCounts(s *Reading, q Quota, limit, remaining []string) {
	if len(limit) == 0 && len(remaining) == 0 {
		return
	}
	q.Limit, q.HasLimit = field.Lowest(limit)
	q.Remaining, q.HasRemaining = field.Lowest(remaining)
	if q.HasLimit || q.HasRemaining {
		s.AddQuota(q)
	}
}

// stripeReader reads Stripe's Stripe-Should-Retry (RetryYes, RetryNo),
// Stripe-Rate-Limited-Reason (the Reason; resource-specific is ScopeOther,
// the global and endpoint rate and concurrency limits ScopeQuota), and a
// 429's JSON body whose error code is lock_timeout: a lock on one object,
// worth a retry, saying nothing about the quota (ScopeOther).
type stripeReader struct{}

func (stripeReader) read(resp *http.Response, s *Reading) {
	h := resp.Header
	if yes, no := field.AnyBool(h[StripeShouldRetry]); no {
		s.SetRetry(RetryNo)
	} else if yes {
		s.SetRetry(RetryYes)
	}
	if reason := field.FirstToken(h[hStripeReason]); reason != "" {
		s.SetReason(reason)
		switch strings.ToLower(reason) {
		case "resource-specific":
			s.SetScope(ScopeOther)
		case "global-rate", "endpoint-rate", "global-concurrency", "endpoint-concurrency":
			s.SetScope(ScopeQuota)
		}
	}
	if b := jsonErrorPrefix(resp, "lock_timeout"); b != nil {
		var body struct {
			Error struct {
				Code any `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal(b, &body) // a field of the wrong type leaves the others read
		if body.Error.Code == "lock_timeout" {
			s.SetScope(ScopeOther)
			s.SetReason("lock_timeout")
		}
	}
}

// jiraReader reads what Atlassian's Jira adds to the X-RateLimit-* family
// and its Beta-RateLimit fields (read by xRateLimitReader and ietfReader):
// X-RateLimit-NearLimit and X-Beta-RateLimit-NearLimit (NearLimit),
// RateLimit-Reason and X-Beta-RateLimit-Reason (the Reason), and
// X-Beta-RateLimit-Reset (ISO 8601 without seconds, "2026-03-26T16:00Z").
type jiraReader struct{}

func (jiraReader) read(resp *http.Response, s *Reading) {
	h := resp.Header
	if near, _ := field.AnyBool(h[hXRateLimitNearLimit]); near {
		s.SetNearLimit()
	}
	if near, _ := field.AnyBool(h[hXBetaRateLimitNearLimit]); near {
		s.SetNearLimit()
	}
	if reason := field.FirstToken(h[hRateLimitReason]); reason != "" {
		s.SetReason(reason)
	}
	if reason := field.FirstToken(h[hXBetaRateLimitReason]); reason != "" {
		s.SetReason(reason)
	}
	if d, ok := field.LatestReset(h[hXBetaRateLimitReset], s.ResetUnit(hXBetaRateLimitReset), s.Now(), s.MaxWait()); ok {
		s.AddQuota(Quota{Dimension: Requests, Reset: d, HasReset: true})
	}
}

// zendeskReader reads Zendesk's per-endpoint fields, such as
// zendesk-ratelimit-tickets-index: "total=100; remaining=99; resets=41"
// (resets in seconds from now), one Quota each, named after the field
// ("Tickets-Index"). Zendesk's other headers are the X-Rate-Limit and
// ratelimit-* families.
type zendeskReader struct{}

func (zendeskReader) read(resp *http.Response, s *Reading) {
	for name, values := range resp.Header {
		if len(name) <= len(zendeskPrefix) || !strings.HasPrefix(name, zendeskPrefix) {
			continue
		}
		q := Quota{Dimension: Requests, Name: name[len(zendeskPrefix):], Kind: KindWindow}
		for _, v := range values {
			for v != "" {
				var m string
				m, v = cutMember(v)
				key, val, _ := strings.Cut(m, "=")
				q = addZendeskMember(q, strings.ToLower(strings.TrimSpace(key)), val, s.MaxWait())
			}
		}
		s.AddQuota(q)
	}
}

// addZendeskMember records one member of a Zendesk field, keeping the most
// restrictive value of each key.
func addZendeskMember(q Quota, key, val string, max time.Duration) Quota {
	switch key {
	case "total":
		if n, ok := field.Amount(val); ok && (!q.HasLimit || n < q.Limit) {
			q.Limit, q.HasLimit = n, true
		}
	case "remaining":
		if n, ok := field.Amount(val); ok && (!q.HasRemaining || n < q.Remaining) {
			q.Remaining, q.HasRemaining = n, true
		}
	case "resets":
		if d, ok := field.Seconds(val, max); ok && (!q.HasReset || d > q.Reset) {
			q.Reset, q.HasReset = d, true
		}
	}
	return q
}

// cutMember cuts v at its first ';' or ',': the member before, and the
// rest after (Salesforce's and Zendesk's lists take either).
func cutMember(v string) (m, rest string) {
	if i := strings.IndexAny(v, ";,"); i >= 0 {
		return v[:i], v[i+1:]
	}
	return v, ""
}
