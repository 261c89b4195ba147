package egress

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/egress-go/egress/internal/dialect"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sigCase is one response and the signal it must give.
type sigCase struct {
	name    string
	now     time.Time // zero: raNow()
	status  int       // zero: 200
	headers []string  // name, value, name, value, ...
	body    string
	want    Signal // Now, Status, Host and MaxWait are filled in
}

const sigMax = time.Hour // the cap of these tests

func sigResponse(status int, headers []string, body string) *http.Response {
	h := http.Header{}
	for i := 0; i+1 < len(headers); i += 2 {
		h.Add(headers[i], headers[i+1])
	}
	resp := &http.Response{StatusCode: status, Header: h, Body: http.NoBody}
	if body != "" {
		resp.Body = io.NopCloser(strings.NewReader(body))
	}
	return resp
}

func runSigCases(t *testing.T, c *signalConfig, host string, tests []sigCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now, status := tt.now, tt.status
			if now.IsZero() {
				now = raNow()
			}
			if status == 0 {
				status = http.StatusOK
			}
			got := c.readSignal(sigResponse(status, tt.headers, tt.body), host, now, now, sigMax)
			want := tt.want
			want.Now, want.SentAt, want.Status, want.Host, want.MaxWait = now, now, status, host, sigMax
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("headers %q:\ngot  %s\nwant %s", tt.headers, fmtSignal(got), fmtSignal(want))
			}
			checkSignal(t, &got)
		})
	}
}

func fmtSignal(s Signal) string {
	qs := s.Quotas
	s.Quotas = nil
	out := fmt.Sprintf("%+v", s)
	for _, q := range qs {
		out += fmt.Sprintf("\n\t%+v", q)
	}
	return out
}

// checkSignal checks what every signal must hold, whatever the response.
func checkSignal(t testing.TB, s *Signal) {
	t.Helper()
	max := s.maxWait()
	if s.RetryAfter < 0 || s.RetryAfter > max || (!s.HasRetryAfter && (s.RetryAfter != 0 || s.RetryAfterTooLong)) {
		t.Fatalf("RetryAfter %v (has %v, too long %v) outside [0, %v]", s.RetryAfter, s.HasRetryAfter, s.RetryAfterTooLong, max)
	}
	if s.Retry > RetryNo || s.Scope > ScopeBilling || s.cfg != nil {
		t.Fatalf("Retry %v, Scope %v, cfg %v", s.Retry, s.Scope, s.cfg)
	}
	if s.Scope == ScopeBilling && (s.Retry != RetryNo || s.HasRetryAfter || s.throttled()) {
		t.Fatalf("a billing error may be retried or paused: %+v", s)
	}
	for i, q := range s.Quotas {
		for _, v := range []struct {
			x   float64
			has bool
		}{{q.Limit, q.HasLimit}, {q.Remaining, q.HasRemaining}, {q.Used, q.HasUsed}} {
			if v.x < 0 || math.IsNaN(v.x) || math.IsInf(v.x, 0) || (!v.has && v.x != 0) {
				t.Fatalf("quota %d: bad count in %+v", i, q)
			}
		}
		if q.Reset < 0 || q.Reset > max || (!q.HasReset && q.Reset != 0) || q.Window < 0 || (q.HasWindow != (q.Window > 0)) {
			t.Fatalf("quota %d: bad reset or window in %+v", i, q)
		}
		if !q.HasLimit && !q.HasRemaining && !q.HasUsed && !q.HasReset {
			t.Fatalf("quota %d is empty", i)
		}
		for _, o := range s.Quotas[:i] {
			if o.Dimension == q.Dimension && o.Name == q.Name && o.Window == q.Window {
				t.Fatalf("two quotas of one dimension, name and window: %+v and %+v", o, q)
			}
		}
	}
}

func epochAt(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }

func TestDialectOpenAI(t *testing.T) {
	runSigCases(t, nil, "api.openai.com", []sigCase{
		{name: "requests and tokens", headers: []string{
			"x-ratelimit-limit-requests", "60", "x-ratelimit-limit-tokens", "150000",
			"x-ratelimit-remaining-requests", "59", "x-ratelimit-remaining-tokens", "149984",
			"x-ratelimit-reset-requests", "1s", "x-ratelimit-reset-tokens", "6m0s",
		}, want: Signal{Quotas: []Quota{
			{Dimension: Requests, Limit: 60, HasLimit: true, Remaining: 59, HasRemaining: true, Reset: time.Second, HasReset: true, Kind: ResetKindBucket},
			{Dimension: Tokens, Limit: 150000, HasLimit: true, Remaining: 149984, HasRemaining: true, Reset: 6 * time.Minute, HasReset: true, Kind: ResetKindBucket},
		}}},
		{name: "milliseconds", headers: []string{"x-ratelimit-reset-requests", "12ms", "x-ratelimit-reset-tokens", "9ms"},
			want: Signal{Quotas: []Quota{
				{Dimension: Requests, Reset: 12 * time.Millisecond, HasReset: true, Kind: ResetKindBucket},
				{Dimension: Tokens, Reset: 9 * time.Millisecond, HasReset: true, Kind: ResetKindBucket},
			}}},
		{name: "Groq duration", headers: []string{"x-ratelimit-remaining-tokens", "0", "x-ratelimit-reset-tokens", "2m59.56s"},
			want: Signal{Quotas: []Quota{{Dimension: Tokens, HasRemaining: true, Reset: 2*time.Minute + 59560*time.Millisecond, HasReset: true, Kind: ResetKindBucket}}}},
		{name: "Azure seconds and -1 sentinel", headers: []string{"x-ratelimit-limit-tokens", "-1", "x-ratelimit-remaining-tokens", "-1", "x-ratelimit-reset-tokens", "0"},
			want: Signal{Quotas: []Quota{{Dimension: Tokens, HasReset: true, Kind: ResetKindBucket}}}},
		{name: "Azure plain seconds", headers: []string{"x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "12"},
			want: Signal{Quotas: []Quota{{Dimension: Requests, HasRemaining: true, Reset: 12 * time.Second, HasReset: true, Kind: ResetKindBucket}}}},
		{name: "429 with retry-after-ms and retry-after", status: 429, headers: []string{"retry-after-ms", "1500", "retry-after", "1", "x-should-retry", "true"},
			want: Signal{RetryAfter: 1500 * time.Millisecond, HasRetryAfter: true, Retry: RetryYes}},
		{name: "retry-after-ms is read over the Retry-After it rounds up", status: 429, headers: []string{"retry-after-ms", "100", "retry-after", "1"},
			want: Signal{RetryAfter: 100 * time.Millisecond, HasRetryAfter: true}},
		{name: "an unreadable retry-after-ms leaves Retry-After", status: 429, headers: []string{"retry-after-ms", "soon", "retry-after", "2"},
			want: Signal{RetryAfter: 2 * time.Second, HasRetryAfter: true}},
		{name: "x-should-retry false", status: 500, headers: []string{"x-should-retry", "false"}, want: Signal{Retry: RetryNo}},
		{name: "retry-after-ms is not read on a 200", headers: []string{"retry-after-ms", "1500"}, want: Signal{}},
		{name: "insufficient_quota is a billing error", status: 429,
			headers: []string{"Content-Type", "application/json; charset=utf-8", "retry-after", "20", "x-should-retry", "true"},
			body:    `{"error": {"message": "You exceeded your current quota, please check your plan and billing details.", "type": "insufficient_quota", "param": null, "code": "insufficient_quota"}}`,
			want:    Signal{Scope: ScopeBilling, Retry: RetryNo}},
		{name: "a rate-limit 429 is not billing", status: 429,
			headers: []string{"Content-Type", "application/json", "retry-after", "20"},
			body:    `{"error": {"message": "Rate limit reached for requests", "type": "requests", "code": "rate_limit_exceeded"}}`,
			want:    Signal{RetryAfter: 20 * time.Second, HasRetryAfter: true}},
		{name: "insufficient_quota in a message only is not billing", status: 429,
			headers: []string{"Content-Type", "application/json"},
			body:    `{"error": {"message": "not insufficient_quota", "type": "requests"}}`, want: Signal{}},
		{name: "a text body is not read", status: 429, headers: []string{"Content-Type", "text/plain"},
			body: `{"error": {"type": "insufficient_quota"}}`, want: Signal{}},
	})
}

func TestDialectAnthropic(t *testing.T) {
	now := time.Date(2025, 8, 21, 12, 40, 0, 0, time.UTC)
	runSigCases(t, nil, "api.anthropic.com", []sigCase{
		{name: "requests", now: now, headers: []string{
			"anthropic-ratelimit-requests-limit", "1000", "anthropic-ratelimit-requests-remaining", "999",
			"anthropic-ratelimit-requests-reset", "2025-08-21T12:40:59Z",
		}, want: Signal{Quotas: []Quota{{Dimension: Requests, Limit: 1000, HasLimit: true, Remaining: 999, HasRemaining: true, Reset: 59 * time.Second, HasReset: true, Kind: ResetKindBucket}}}},
		{name: "all four dimensions", now: time.Date(2025, 6, 2, 15, 15, 0, 0, time.UTC), status: 429, headers: []string{
			"anthropic-ratelimit-requests-remaining", "49", "anthropic-ratelimit-tokens-remaining", "9000",
			"anthropic-ratelimit-input-tokens-limit", "40000", "anthropic-ratelimit-input-tokens-remaining", "0",
			"anthropic-ratelimit-input-tokens-reset", "2025-06-02T15:15:48Z",
			"anthropic-ratelimit-output-tokens-remaining", "8000", "anthropic-ratelimit-output-tokens-reset", "2025-06-02T15:15:01.5Z",
			"retry-after", "16", "x-should-retry", "true",
		}, want: Signal{RetryAfter: 16 * time.Second, HasRetryAfter: true, Retry: RetryYes, Quotas: []Quota{
			{Dimension: Requests, Remaining: 49, HasRemaining: true, Kind: ResetKindBucket},
			{Dimension: Tokens, Remaining: 9000, HasRemaining: true, Kind: ResetKindBucket},
			{Dimension: InputTokens, Limit: 40000, HasLimit: true, HasRemaining: true, Reset: 48 * time.Second, HasReset: true, Kind: ResetKindBucket},
			{Dimension: OutputTokens, Remaining: 8000, HasRemaining: true, Reset: 1500 * time.Millisecond, HasReset: true, Kind: ResetKindBucket},
		}}},
		{name: "reset in the past is 0", now: now, headers: []string{"anthropic-ratelimit-tokens-reset", "2025-06-02T15:15:48Z"},
			want: Signal{Quotas: []Quota{{Dimension: Tokens, HasReset: true, Kind: ResetKindBucket}}}},
		{name: "reset far ahead is capped", now: now, headers: []string{"anthropic-ratelimit-tokens-reset", "2035-06-02T15:15:48+02:00"},
			want: Signal{Quotas: []Quota{{Dimension: Tokens, Reset: sigMax, HasReset: true, Kind: ResetKindBucket}}}},
	})
}

func TestDialectGitHub(t *testing.T) {
	now := time.Unix(1372700873, 0).Add(-10 * time.Minute)
	core := func(remaining, used float64) Quota {
		return Quota{Dimension: Requests, Name: "core", Limit: 60, HasLimit: true, Remaining: remaining, HasRemaining: true,
			Used: used, HasUsed: true, Reset: 10 * time.Minute, HasReset: true, Kind: ResetKindWindow}
	}
	gh := func(remaining, used string) []string {
		return []string{"x-ratelimit-limit", "60", "x-ratelimit-remaining", remaining, "x-ratelimit-used", used,
			"x-ratelimit-reset", "1372700873", "x-ratelimit-resource", "core"}
	}
	runSigCases(t, nil, "api.github.com", []sigCase{
		{name: "ok", now: now, headers: gh("42", "18"), want: Signal{Quotas: []Quota{core(42, 18)}}},
		{name: "primary limit: 403 with remaining 0", now: now, status: 403, headers: gh("0", "60"),
			want: Signal{Throttling: true, Scope: ScopeQuota, Quotas: []Quota{core(0, 60)}}},
		{name: "primary limit: 429 with remaining 0", now: now, status: 429, headers: gh("0", "60"),
			want: Signal{Quotas: []Quota{core(0, 60)}}},
		{name: "secondary limit: 403 with retry-after", now: now, status: 403, headers: append(gh("41", "19"), "retry-after", "30"),
			want: Signal{Throttling: true, RetryAfter: 30 * time.Second, HasRetryAfter: true, Quotas: []Quota{core(41, 19)}}},
		{name: "a 403 with quota left is no throttle", now: now, status: 403, headers: gh("41", "19"),
			want: Signal{Quotas: []Quota{core(41, 19)}}},
		{name: "reset in the past", now: time.Unix(1372700873, 0).Add(time.Hour), headers: []string{"x-ratelimit-reset", "1372700873"},
			want: Signal{Quotas: []Quota{{Dimension: Requests, HasReset: true}}}},
	})
	s := (*signalConfig)(nil).readSignal(sigResponse(403, gh("0", "60"), ""), "api.github.com", now, now, sigMax)
	if !s.throttled() {
		t.Fatal("a 403 with remaining 0 is not throttled()")
	}
	if q, _, ok := s.requestQuota(); !ok || q.Remaining != 0 || q.Reset != 10*time.Minute {
		t.Fatalf("requestQuota() = %+v, %v", q, ok)
	}
}

func TestDialectHyphenated(t *testing.T) {
	xNow := time.Unix(1705420800, 0).Add(-15 * time.Minute)
	oktaNow := time.Unix(1609459200, 0).Add(-30 * time.Second)
	runSigCases(t, nil, "api.x.com", []sigCase{
		{name: "X", now: xNow, headers: []string{"x-rate-limit-limit", "900", "x-rate-limit-remaining", "847", "x-rate-limit-reset", "1705420800"},
			want: Signal{Quotas: []Quota{{Dimension: Requests, Limit: 900, HasLimit: true, Remaining: 847, HasRemaining: true, Reset: 15 * time.Minute, HasReset: true, Kind: ResetKindWindow}}}},
		{name: "Okta", now: oktaNow, headers: []string{"X-Rate-Limit-Limit", "1200", "X-Rate-Limit-Remaining", "1199", "X-Rate-Limit-Reset", "1609459200"},
			want: Signal{Quotas: []Quota{{Dimension: Requests, Limit: 1200, HasLimit: true, Remaining: 1199, HasRemaining: true, Reset: 30 * time.Second, HasReset: true, Kind: ResetKindWindow}}}},
		{name: "Zendesk: X-Rate-Limit and ratelimit-* merge into one quota", headers: []string{
			"X-Rate-Limit", "700", "X-Rate-Limit-Remaining", "699", "ratelimit-limit", "700", "ratelimit-remaining", "699", "ratelimit-reset", "41"},
			want: Signal{Quotas: []Quota{{Dimension: Requests, Limit: 700, HasLimit: true, Remaining: 699, HasRemaining: true, Reset: 41 * time.Second, HasReset: true}}}},
		{name: "Zendesk endpoint field", headers: []string{"zendesk-ratelimit-tickets-index", "total=100; remaining=99; resets=41"},
			want: Signal{Quotas: []Quota{{Dimension: Requests, Name: "Tickets-Index", Limit: 100, HasLimit: true, Remaining: 99, HasRemaining: true, Reset: 41 * time.Second, HasReset: true, Kind: ResetKindWindow}}}},
		{name: "Prisjakt's milliseconds read as seconds by default, capped", headers: []string{"X-Rate-Limit-Reset", "600000"},
			want: Signal{Quotas: []Quota{{Dimension: Requests, Reset: sigMax, HasReset: true}}}},
		{name: "Fastly", now: time.Unix(1452032384, 0).Add(-30 * time.Minute), headers: []string{"Fastly-RateLimit-Remaining", "999", "Fastly-RateLimit-Reset", "1452032384"},
			want: Signal{Quotas: []Quota{{Dimension: Requests, Remaining: 999, HasRemaining: true, Reset: 30 * time.Minute, HasReset: true, Kind: ResetKindWindow}}}},
	})
}

func TestDialectRedditDiscord(t *testing.T) {
	discordNow := time.Unix(1470173022, 0)
	runSigCases(t, nil, "oauth.reddit.com", []sigCase{
		{name: "Reddit decimal counts", headers: []string{"X-Ratelimit-Used", "997", "X-Ratelimit-Remaining", "3.0", "X-Ratelimit-Reset", "599"},
			want: Signal{Quotas: []Quota{{Dimension: Requests, Remaining: 3, HasRemaining: true, Used: 997, HasUsed: true, Reset: 599 * time.Second, HasReset: true, Kind: ResetKindWindow}}}},
		{name: "Reddit 999.0", headers: []string{"X-Ratelimit-Remaining", "999.0"},
			want: Signal{Quotas: []Quota{{Dimension: Requests, Remaining: 999, HasRemaining: true}}}},
		{name: "Reddit duplicated values", headers: []string{"X-Ratelimit-Remaining", "991, 98", "X-Ratelimit-Used", "9, 902"},
			want: Signal{Quotas: []Quota{{Dimension: Requests, Remaining: 98, HasRemaining: true, Used: 902, HasUsed: true, Kind: ResetKindWindow}}}},
		{name: "Discord headers", now: discordNow, headers: []string{"X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "0",
			"X-RateLimit-Reset", "1470173023.123", "X-RateLimit-Bucket", "abcd1234"},
			want: Signal{Quotas: []Quota{{Dimension: Requests, Name: "abcd1234", Limit: 5, HasLimit: true, HasRemaining: true, Reset: 1123 * time.Millisecond, HasReset: true, Kind: ResetKindWindow}}}},
		{name: "Discord reset-after before reset", now: discordNow, headers: []string{"X-RateLimit-Remaining", "0",
			"X-RateLimit-Reset", "1470173023.123", "X-RateLimit-Reset-After", "64.57"},
			want: Signal{Quotas: []Quota{{Dimension: Requests, HasRemaining: true, Reset: 64570 * time.Millisecond, HasReset: true}}}},
		{name: "Discord shared 429", status: 429, headers: []string{"Retry-After", "65", "X-RateLimit-Scope", "shared", "Content-Type", "application/json"},
			body: `{"message": "You are being rate limited.", "retry_after": 64.57, "global": false}`,
			want: Signal{RetryAfter: 65 * time.Second, HasRetryAfter: true, Scope: ScopeOther}},
		{name: "Discord user 429, body only", status: 429, headers: []string{"X-RateLimit-Scope", "user"},
			body: `{"message": "You are being rate limited.", "retry_after": 64.57, "global": false}`,
			want: Signal{RetryAfter: 64570 * time.Millisecond, HasRetryAfter: true, Scope: ScopeQuota}},
		{name: "Discord global 429", status: 429, headers: []string{"X-RateLimit-Global", "true", "X-RateLimit-Scope", "global", "Retry-After", "1"},
			want: Signal{RetryAfter: time.Second, HasRetryAfter: true, Scope: ScopeQuota}},
		{name: "Discord body retry_after beyond the cap", status: 429, body: `{"retry_after": 1e300}`,
			want: Signal{RetryAfter: sigMax, HasRetryAfter: true, RetryAfterTooLong: true}},
		{name: "Discord body retry_after negative", status: 429, body: `{"retry_after": -5, "global": true}`,
			want: Signal{Scope: ScopeQuota}},
	})
}

func TestDialectVendors(t *testing.T) {
	jiraNow := time.Date(2026, 3, 26, 15, 24, 53, 0, time.UTC)
	gitlabNow := time.Date(2021, 1, 5, 10, 59, 30, 0, time.UTC)
	runSigCases(t, nil, "vendor.example", []sigCase{
		{name: "Shopify", headers: []string{"X-Shopify-Shop-Api-Call-Limit", "32/40"},
			want: Signal{Quotas: []Quota{{Dimension: Requests, Limit: 40, HasLimit: true, Used: 32, HasUsed: true, Remaining: 8, HasRemaining: true, Window: 20 * time.Second, HasWindow: true, Kind: ResetKindBucket}}}},
		{name: "Shopify full, 429", status: 429, headers: []string{"X-Shopify-Shop-Api-Call-Limit", "40/40", "Retry-After", "2.0"},
			want: Signal{RetryAfter: 2 * time.Second, HasRetryAfter: true, Quotas: []Quota{{Dimension: Requests, Limit: 40, HasLimit: true, Used: 40, HasUsed: true, HasRemaining: true, Window: 20 * time.Second, HasWindow: true, Kind: ResetKindBucket}}}},
		{name: "Gorgias", status: 429, headers: []string{"X-Gorgias-Account-Api-Call-Limit", "10/40", "Retry-after", "5"},
			want: Signal{RetryAfter: 5 * time.Second, HasRetryAfter: true, Quotas: []Quota{{Dimension: Requests, Limit: 40, HasLimit: true, Used: 10, HasUsed: true, Remaining: 30, HasRemaining: true, Window: 20 * time.Second, HasWindow: true, Kind: ResetKindBucket}}}},
		{name: "Salesforce", headers: []string{"Sforce-Limit-Info", "api-usage=18/5000"},
			want: Signal{Quotas: []Quota{{Dimension: Requests, Name: "api-usage", Limit: 5000, HasLimit: true, Used: 18, HasUsed: true, Remaining: 4982, HasRemaining: true, Window: 24 * time.Hour, HasWindow: true, Kind: ResetKindWindow}}}},
		{name: "Salesforce, several", headers: []string{"Sforce-Limit-Info", "api-usage=10018/100000; api-bursts=1/750, per-app-api-usage=17/250(appName=sample-connected-app)"},
			want: Signal{Quotas: []Quota{
				{Dimension: Requests, Name: "api-usage", Limit: 100000, HasLimit: true, Used: 10018, HasUsed: true, Remaining: 89982, HasRemaining: true, Window: 24 * time.Hour, HasWindow: true, Kind: ResetKindWindow},
				{Dimension: Requests, Name: "api-bursts", Limit: 750, HasLimit: true, Used: 1, HasUsed: true, Remaining: 749, HasRemaining: true, Window: 24 * time.Hour, HasWindow: true, Kind: ResetKindWindow},
				{Dimension: Requests, Name: "per-app-api-usage", Limit: 250, HasLimit: true, Used: 17, HasUsed: true, Remaining: 233, HasRemaining: true, Window: 24 * time.Hour, HasWindow: true, Kind: ResetKindWindow},
			}}},
		{name: "HubSpot", headers: []string{"X-HubSpot-RateLimit-Daily", "250000", "X-HubSpot-RateLimit-Daily-Remaining", "249990",
			"X-HubSpot-RateLimit-Secondly", "10", "X-HubSpot-RateLimit-Secondly-Remaining", "9"},
			want: Signal{Quotas: []Quota{
				{Dimension: Requests, Name: "daily", Limit: 250000, HasLimit: true, Remaining: 249990, HasRemaining: true, Window: 24 * time.Hour, HasWindow: true, Kind: ResetKindWindow},
				{Dimension: Requests, Name: "secondly", Limit: 10, HasLimit: true, Remaining: 9, HasRemaining: true, Window: time.Second, HasWindow: true, Kind: ResetKindWindow},
			}}},
		{name: "HubSpot interval", headers: []string{"X-HubSpot-RateLimit-Interval-Milliseconds", "10000", "X-HubSpot-RateLimit-Max", "100", "X-HubSpot-RateLimit-Remaining", "99"},
			want: Signal{Quotas: []Quota{{Dimension: Requests, Name: "interval", Limit: 100, HasLimit: true, Remaining: 99, HasRemaining: true, Window: 10 * time.Second, HasWindow: true, Kind: ResetKindWindow}}}},
		{name: "Stripe lock_timeout", status: 429, headers: []string{"Stripe-Should-Retry", "true", "Content-Type", "application/json"},
			body: `{"error": {"code": "lock_timeout", "message": "This object cannot be accessed right now because another API request or Stripe process is currently accessing it.", "type": "invalid_request_error"}}`,
			want: Signal{Retry: RetryYes, Scope: ScopeOther, Reason: "lock_timeout"}},
		{name: "Stripe should not retry", status: 400, headers: []string{"Stripe-Should-Retry", "false"}, want: Signal{Retry: RetryNo}},
		{name: "Stripe rate reason", status: 429, headers: []string{"Stripe-Rate-Limited-Reason", "global-rate"},
			want: Signal{Scope: ScopeQuota, Reason: "global-rate"}},
		{name: "Stripe resource-specific", status: 429, headers: []string{"Stripe-Rate-Limited-Reason", "resource-specific"},
			want: Signal{Scope: ScopeOther, Reason: "resource-specific"}},
		{name: "Jira points quota", now: jiraNow, headers: []string{
			"Beta-Ratelimit-Policy", `"tenant-app-quota";q=100100;w=3600`, "Beta-Ratelimit", `"tenant-app-quota";r=17842;t=2107`,
			"X-Beta-Ratelimit-Reason", "jira-quota-tenant-based", "X-Beta-Ratelimit-Nearlimit", "true", "X-Beta-Ratelimit-Reset", "2026-03-26T16:00Z"},
			want: Signal{NearLimit: true, Reason: "jira-quota-tenant-based", Quotas: []Quota{
				{Dimension: Requests, Name: "tenant-app-quota", Limit: 100100, HasLimit: true, Window: time.Hour, HasWindow: true, Remaining: 17842, HasRemaining: true, Reset: 2107 * time.Second, HasReset: true},
				{Dimension: Requests, Reset: 2107 * time.Second, HasReset: true},
			}}},
		{name: "Jira burst", now: jiraNow, status: 429, headers: []string{"X-RateLimit-Limit", "350", "X-RateLimit-Remaining", "0",
			"X-RateLimit-NearLimit", "true", "RateLimit-Reason", "jira-burst-based", "X-RateLimit-Reset", "2026-03-26T16:00Z", "Retry-After", "5"},
			want: Signal{NearLimit: true, Reason: "jira-burst-based", RetryAfter: 5 * time.Second, HasRetryAfter: true, Quotas: []Quota{
				{Dimension: Requests, Limit: 350, HasLimit: true, HasRemaining: true, Reset: 2107 * time.Second, HasReset: true},
			}}},
		{name: "Cloudflare", headers: []string{"Ratelimit", `"default";r=50;t=30`, "Ratelimit-Policy", `"burst";q=100;w=60`},
			want: Signal{Quotas: []Quota{
				{Dimension: Requests, Name: "burst", Limit: 100, HasLimit: true, Window: time.Minute, HasWindow: true},
				{Dimension: Requests, Name: "default", Remaining: 50, HasRemaining: true, Reset: 30 * time.Second, HasReset: true},
			}}},
		{name: "IETF policies joined by name", headers: []string{"RateLimit-Policy", `"burst";q=100;w=1, "daily";q=1000;w=86400`,
			"RateLimit", `"burst";r=5;t=1, "daily";r=0;t=3600`},
			want: Signal{Quotas: []Quota{
				{Dimension: Requests, Name: "burst", Limit: 100, HasLimit: true, Window: time.Second, HasWindow: true, Remaining: 5, HasRemaining: true, Reset: time.Second, HasReset: true},
				{Dimension: Requests, Name: "daily", Limit: 1000, HasLimit: true, Window: 24 * time.Hour, HasWindow: true, HasRemaining: true, Reset: time.Hour, HasReset: true},
			}}},
		{name: "IETF policy in other units is skipped", headers: []string{"RateLimit-Policy", `"bytes";q=1000;w=1;qu="content-bytes"`}, want: Signal{}},
		{name: "IETF dictionary form", headers: []string{"RateLimit", `limit=10, remaining=1, reset=7`},
			want: Signal{Quotas: []Quota{{Dimension: Requests, Limit: 10, HasLimit: true, Remaining: 1, HasRemaining: true, Reset: 7 * time.Second, HasReset: true}}}},
		{name: "GitLab", now: gitlabNow, status: 429, headers: []string{"RateLimit-Limit", "60", "RateLimit-Name", "throttle_authenticated_web",
			"RateLimit-Observed", "67", "RateLimit-Remaining", "0", "RateLimit-Reset", "1609844400",
			"RateLimit-ResetTime", "Tue, 05 Jan 2021 11:00:00 GMT", "Retry-After", "30"},
			want: Signal{RetryAfter: 30 * time.Second, HasRetryAfter: true, Quotas: []Quota{
				{Dimension: Requests, Name: "throttle_authenticated_web", Limit: 60, HasLimit: true, Used: 67, HasUsed: true, HasRemaining: true, Reset: 30 * time.Second, HasReset: true},
			}}},
		{name: "GitLab reset time only", now: gitlabNow, headers: []string{"RateLimit-ResetTime", "Tue, 05 Jan 2021 11:00:00 GMT"},
			want: Signal{Quotas: []Quota{{Dimension: Requests, Reset: 30 * time.Second, HasReset: true}}}},
		{name: "Heroku", headers: []string{"Ratelimit-Remaining", "4499"},
			want: Signal{Quotas: []Quota{{Dimension: Requests, Remaining: 4499, HasRemaining: true}}}},
		{name: "503 with Retry-After", status: 503, headers: []string{"Retry-After", "Tue, 02 Jan 2024 03:05:35 GMT"},
			want: Signal{RetryAfter: 90 * time.Second, HasRetryAfter: true}},
		{name: "Retry-After beyond the cap", status: 429, headers: []string{"Retry-After", "7200"},
			want: Signal{RetryAfter: sigMax, HasRetryAfter: true, RetryAfterTooLong: true}},
		{name: "Retry-After at the cap", status: 429, headers: []string{"Retry-After", "3600"},
			want: Signal{RetryAfter: sigMax, HasRetryAfter: true}},
	})
}

// TestDialectHostile feeds every header egress reads values it must not
// read: each is ignored, nothing panics.
func TestDialectHostile(t *testing.T) {
	hostile := []string{"-1", "-0.5", "NaN", "nan", "Inf", "-Inf", "+5", "1e3", "0x10", "1_000", "", " ", "soon",
		"99999999999999999999999999999999", "1" + strings.Repeat("0", 400), "١٢٣", "\x00", "1.2.3", ".", "/", "1/", "/2",
		"-5/10", "5/-10", "=", "a=b=c", "6m0s0", "-6m0s", "+1s", "99999999999h", "2025-13-45T99:99:99Z", "2026-03-26T16:00",
		`"`, `"unterminated`, ";;;", ",,,", "true false", "tru", "q=-1;w=0", `"a";r=NaN;t=-1`, "api-usage=", "total=;remaining=x"}
	for _, name := range allSignalHeaders() {
		for _, v := range hostile {
			for _, status := range []int{200, 403, 429, 503} {
				s := (*signalConfig)(nil).readSignal(sigResponse(status, []string{name, v}, ""), "h", raNow(), raNow(), sigMax)
				checkSignal(t, &s)
				if len(s.Quotas) > 0 || s.HasRetryAfter || s.Scope != ScopeUnknown || s.Retry != RetryDefault || s.NearLimit || s.Throttling {
					// Only a value that reads as something may say something.
					if !readsAsSomething(v) {
						t.Fatalf("%s: %q (status %d) was read: %s", name, v, status, fmtSignal(s))
					}
				}
			}
		}
	}
}

// readsAsSomething lists the hostile values that hold a usable part: a
// count or reset as its first member, a leading zero-length duration...
func readsAsSomething(v string) bool {
	switch v {
	case "99999999999999999999999999999999", "1" + strings.Repeat("0", 400), "true false":
		return true
	}
	return false
}

// allSignalHeaders are the names of every header a built-in reader reads:
// retryReader's and internal/dialect's.
func allSignalHeaders() []string {
	return append([]string{hRetryAfter, hRetryAfterMs, hShouldRetry}, dialect.Headers()...)
}

// TestRequestQuotaSameLimitTwice: two reports of the same limit and
// remaining (Jira's Beta-RateLimit, reset in seconds, and X-RateLimit-Reset,
// in whole minutes) are one limit: the finer is read. Two different limits
// with as much left both must come back: the later reset.
func TestRequestQuotaSameLimitTwice(t *testing.T) {
	beta := Quota{Name: "default", Limit: 20, HasLimit: true, Remaining: 0, HasRemaining: true,
		Reset: time.Second, HasReset: true, Window: time.Second, HasWindow: true}
	minutes := Quota{Limit: 20, HasLimit: true, Remaining: 0, HasRemaining: true, Reset: 43 * time.Second, HasReset: true}
	for _, order := range [][]Quota{{beta, minutes}, {minutes, beta}} {
		s := Signal{Quotas: order}
		q, _, ok := s.requestQuota()
		require.True(t, ok)
		assert.Equal(t, time.Second, q.Reset, "the same limit sent twice: the one that states its window")
	}
	other := minutes
	other.Limit = 5000 // an hourly quota with nothing left either
	for _, order := range [][]Quota{{beta, other}, {other, beta}} {
		s := Signal{Quotas: order}
		q, _, _ := s.requestQuota()
		assert.Equal(t, 43*time.Second, q.Reset, "two limits: the later reset")
	}
	early := minutes
	early.Reset = 40 * time.Second
	s := Signal{Quotas: []Quota{minutes, early}}
	q, _, _ := s.requestQuota()
	assert.Equal(t, 40*time.Second, q.Reset, "the same limit, neither with a window: the earlier reset")
}

func TestDialectHeaderNamesAreCanonical(t *testing.T) {
	for _, h := range append(allSignalHeaders(), dialect.ResetHeaders[:]...) {
		if c := http.CanonicalHeaderKey(h); c != h {
			t.Errorf("%q is not canonical (%q): its lookup would miss", h, c)
		}
		if !dialect.MaySignal(http.Header{h: {"1"}}) {
			t.Errorf("%q would be passed over by MaySignal", h)
		}
	}
}

// TestDialectMirrors: internal/dialect's Quota, Dimension, Kind, Scope,
// Retry and BodyPeekLimit are the root's Quota, Dimension, ResetKind,
// Scope, RetryDecision and BodyPeekLimit, value for value and field for
// field, and found adds every field the readers found to the Signal.
func TestDialectMirrors(t *testing.T) {
	assert.Equal(t,
		[]Dimension{Requests, Tokens, InputTokens, OutputTokens, Points},
		[]Dimension{Dimension(dialect.Requests), Dimension(dialect.Tokens), Dimension(dialect.InputTokens),
			Dimension(dialect.OutputTokens), Dimension(dialect.Points)})
	assert.Equal(t,
		[]ResetKind{ResetKindUnknown, ResetKindWindow, ResetKindBucket},
		[]ResetKind{ResetKind(dialect.KindUnknown), ResetKind(dialect.KindWindow), ResetKind(dialect.KindBucket)})
	assert.Equal(t,
		[]Scope{ScopeUnknown, ScopeQuota, ScopeOther, ScopeBilling},
		[]Scope{Scope(dialect.ScopeUnknown), Scope(dialect.ScopeQuota), Scope(dialect.ScopeOther), Scope(dialect.ScopeBilling)})
	assert.Equal(t,
		[]RetryDecision{RetryDefault, RetryYes, RetryNo},
		[]RetryDecision{RetryDecision(dialect.RetryDefault), RetryDecision(dialect.RetryYes), RetryDecision(dialect.RetryNo)})

	assert.Equal(t, BodyPeekLimit, dialect.BodyPeekLimit)

	dq := dialect.Quota{Dimension: dialect.Tokens, Name: "tpm", Limit: 10, HasLimit: true, Remaining: 3, HasRemaining: true,
		Reset: 2 * time.Second, HasReset: true, Window: time.Minute, HasWindow: true, Used: 7, HasUsed: true,
		Kind: dialect.KindBucket}
	var r dialect.Reading
	for range 3 { // past the quotas a Reading keeps in place
		r.AddQuota(dq)
		dq.Name += "'"
	}
	r.AddRetryAfter(time.Second)
	r.AddRetryAfter(3 * time.Second)
	r.SetScope(dialect.ScopeOther)
	r.SetScope(dialect.ScopeQuota)
	r.SetRetry(dialect.RetryYes)
	r.SetReason("first")
	r.SetReason("second")
	r.SetNearLimit()
	var s Signal
	s.found(&r)
	require.Len(t, s.Quotas, 3)
	for i, q := range s.Quotas {
		want, got := reflect.ValueOf(r.Quota(i)), reflect.ValueOf(q)
		require.Equal(t, want.NumField(), got.NumField(), "as many fields")
		for k := range want.NumField() {
			name := want.Type().Field(k).Name
			f := got.FieldByName(name)
			require.True(t, f.IsValid(), "dialect.Quota.%s is a field of Quota", name)
			require.False(t, f.IsZero(), "Quota.%s is copied (the test sets every field)", name)
			assert.EqualValues(t, want.Field(k).Interface(), f.Interface(), "Quota.%s", name)
		}
	}
	assert.Equal(t, 3*time.Second, s.RetryAfter, "the longest wait")
	assert.Equal(t, ScopeQuota, s.Scope, "the more cautious scope")
	assert.Equal(t, RetryYes, s.Retry)
	assert.Equal(t, "first", s.Reason)
	assert.True(t, s.NearLimit)
}
