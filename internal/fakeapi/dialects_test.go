package fakeapi

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// reply is a response with its body read.
type reply struct {
	*http.Response
	body string
}

// request is what a test sends: a form charge, or a JSON body with headers.
type request struct {
	json   string
	header map[string]string
}

func send(t *testing.T, c *http.Client, api *API, rq request) reply {
	t.Helper()
	var resp *http.Response
	var err error
	if rq.json == "" && rq.header == nil {
		resp, err = c.PostForm(api.URL()+"/v1/charges", url.Values{"amount": {"2000"}})
	} else {
		req, rerr := http.NewRequest(http.MethodPost, api.URL()+"/v1/chat/completions", strings.NewReader(rq.json))
		require.NoError(t, rerr)
		req.Header.Set("Content-Type", "application/json")
		for k, v := range rq.header {
			req.Header.Set(k, v)
		}
		resp, err = c.Do(req)
	}
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return reply{resp, string(b)}
}

// limitHeaders is the sorted names of the headers a response carries,
// without those every response carries.
func limitHeaders(r reply) []string {
	var names []string
	for name := range r.Header {
		switch name {
		case "Content-Type", "Content-Length", "Date":
		default:
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

func num(t *testing.T, h http.Header, name string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(h.Get(name), 10, 64)
	require.NoError(t, err, "%s: %q", name, h.Get(name))
	return n
}

func decimal(t *testing.T, h http.Header, name string) float64 {
	t.Helper()
	f, err := strconv.ParseFloat(h.Get(name), 64)
	require.NoError(t, err, "%s: %q", name, h.Get(name))
	return f
}

// span is when the requests of a test were sent: a reset read back must
// fall between the first sent plus its delay and the last answered plus
// its delay, give or take the rounding up of the format.
type span struct{ from, to time.Time }

func (s span) epoch(t *testing.T, got time.Time, d, round time.Duration, name string) {
	t.Helper()
	lo, hi := s.from.Add(d).Add(-round), s.to.Add(d).Add(round)
	assert.True(t, !got.Before(lo) && !got.After(hi), "%s: %v not in [%v, %v]", name, got, lo, hi)
}

// dialectCase: two requests are accepted (ok is the second), then requests
// are sent until one is refused (refused).
type dialectCase struct {
	dialect Dialect
	limits  []Limit
	rq      request
	ok      []string // the headers of a 200, sorted
	refused []string // the headers of the refusal, sorted
	status  int      // of the refusal
	check   func(t *testing.T, ok, refused reply, s span)
}

func dialectCases() []dialectCase {
	hour := []Limit{Sliding(5, time.Hour)}
	openAI := []Limit{{Quota: 60, Rate: 1}, {Quota: 6000, Rate: 100, Unit: Tokens}}
	completion := request{json: `{"model":"m","max_tokens":600}`}
	return []dialectCase{
		{IETF, []Limit{Bucket(10, 10), Sliding(5, time.Hour)}, request{},
			[]string{"Ratelimit", "Ratelimit-Policy", "X-Ratelimit-Limit", "X-Ratelimit-Remaining"},
			[]string{"Ratelimit", "Ratelimit-Policy", "Retry-After", "X-Ratelimit-Limit", "X-Ratelimit-Remaining"},
			429, func(t *testing.T, ok, refused reply, _ span) {
				assert.Equal(t, `"requests-0";q=10;w=1, "requests-1";q=5;w=3600`, ok.Header.Get("RateLimit-Policy"))
				assert.Equal(t, `"requests-0";r=8;t=1, "requests-1";r=3;t=3600`, ok.Header.Get("RateLimit"))
				assert.EqualValues(t, 5, num(t, ok.Header, "X-RateLimit-Limit"), "the tighter limit")
				assert.EqualValues(t, 3, num(t, ok.Header, "X-RateLimit-Remaining"))
				assert.InDelta(t, 3600, num(t, refused.Header, "Retry-After"), 1)
				assert.Contains(t, refused.Header.Get("RateLimit"), `"requests-1";r=0;t=3600`)
			}},
		{IETFDraft, hour, request{},
			[]string{"Ratelimit-Limit", "Ratelimit-Remaining", "Ratelimit-Reset"},
			[]string{"Ratelimit-Limit", "Ratelimit-Remaining", "Ratelimit-Reset", "Retry-After"},
			429, func(t *testing.T, ok, refused reply, _ span) {
				assert.EqualValues(t, 5, num(t, ok.Header, "RateLimit-Limit"))
				assert.EqualValues(t, 3, num(t, ok.Header, "RateLimit-Remaining"))
				assert.EqualValues(t, 3600, num(t, ok.Header, "RateLimit-Reset"))
				assert.EqualValues(t, 0, num(t, refused.Header, "RateLimit-Remaining"))
				assert.InDelta(t, 3600, num(t, refused.Header, "Retry-After"), 1)
			}},
		{GitHub, hour, request{},
			[]string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "X-Ratelimit-Resource", "X-Ratelimit-Used"},
			[]string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "X-Ratelimit-Resource", "X-Ratelimit-Used"},
			403, func(t *testing.T, ok, refused reply, s span) {
				assert.EqualValues(t, 5, num(t, ok.Header, "X-RateLimit-Limit"))
				assert.EqualValues(t, 3, num(t, ok.Header, "X-RateLimit-Remaining"))
				assert.EqualValues(t, 2, num(t, ok.Header, "X-RateLimit-Used"))
				assert.Equal(t, "core", ok.Header.Get("X-RateLimit-Resource"))
				s.epoch(t, time.Unix(num(t, ok.Header, "X-RateLimit-Reset"), 0), time.Hour, time.Second, "reset")
				assert.EqualValues(t, 0, num(t, refused.Header, "X-RateLimit-Remaining"))
				assert.EqualValues(t, 5, num(t, refused.Header, "X-RateLimit-Used"))
				assert.Contains(t, refused.body, "API rate limit exceeded")
			}},
		{Okta, hour, request{},
			[]string{"X-Rate-Limit-Limit", "X-Rate-Limit-Remaining", "X-Rate-Limit-Reset"},
			[]string{"X-Rate-Limit-Limit", "X-Rate-Limit-Remaining", "X-Rate-Limit-Reset"},
			429, func(t *testing.T, ok, refused reply, s span) {
				assert.EqualValues(t, 5, num(t, ok.Header, "X-Rate-Limit-Limit"))
				assert.EqualValues(t, 3, num(t, ok.Header, "X-Rate-Limit-Remaining"))
				s.epoch(t, time.Unix(num(t, ok.Header, "X-Rate-Limit-Reset"), 0), time.Hour, time.Second, "reset")
				assert.EqualValues(t, 0, num(t, refused.Header, "X-Rate-Limit-Remaining"))
				s.epoch(t, time.Unix(num(t, refused.Header, "X-Rate-Limit-Reset"), 0), time.Hour, time.Second, "reset")
			}},
		{OpenAI, openAI, completion,
			[]string{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Requests",
				"X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Requests", "X-Ratelimit-Reset-Tokens"},
			[]string{"Retry-After", "Retry-After-Ms", "X-Ratelimit-Limit-Requests", "X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Requests",
				"X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Requests", "X-Ratelimit-Reset-Tokens", "X-Should-Retry"},
			429, func(t *testing.T, ok, refused reply, _ span) {
				checkOpenAI(t, ok, func(name string) time.Duration {
					d, err := time.ParseDuration(ok.Header.Get(name))
					require.NoError(t, err, "%s: %q", name, ok.Header.Get(name))
					return d
				})
				assert.EqualValues(t, 50, num(t, refused.Header, "X-RateLimit-Remaining-Requests"), "10 accepted")
				assert.Less(t, num(t, refused.Header, "X-RateLimit-Remaining-Tokens"), int64(600))
				ms := num(t, refused.Header, "Retry-After-Ms")
				assert.True(t, ms > 0 && ms <= 6000, "retry-after-ms %d: until 600 tokens are back at 100/s", ms)
				assert.Equal(t, (ms+999)/1000, num(t, refused.Header, "Retry-After"))
				assert.Equal(t, "true", refused.Header.Get("X-Should-Retry"))
				assert.Contains(t, refused.body, `"type":"tokens"`)
				assert.Contains(t, refused.body, `"code":"rate_limit_exceeded"`)
			}},
		{AzureOpenAI, openAI, completion,
			[]string{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Requests",
				"X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Requests", "X-Ratelimit-Reset-Tokens"},
			[]string{"Retry-After", "Retry-After-Ms", "X-Ratelimit-Limit-Requests", "X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Requests",
				"X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Requests", "X-Ratelimit-Reset-Tokens"},
			429, func(t *testing.T, ok, refused reply, _ span) {
				checkOpenAI(t, ok, func(name string) time.Duration {
					return time.Duration(num(t, ok.Header, name)) * time.Second
				})
				assert.Positive(t, num(t, refused.Header, "Retry-After"))
			}},
		{Anthropic, []Limit{
			{Quota: 50, Rate: 50.0 / 60},
			{Quota: 10000, Rate: 10000.0 / 60, Unit: Tokens},
			{Quota: 8000, Rate: 8000.0 / 60, Unit: InputTokens},
			{Quota: 2000, Rate: 2000.0 / 60, Unit: OutputTokens},
		}, request{json: `{"max_tokens":500}`, header: map[string]string{InputTokensHeader: "1000"}},
			anthropicHeaders(),
			append(anthropicHeaders(), "Retry-After", "X-Should-Retry"),
			429, func(t *testing.T, ok, refused reply, s span) {
				for _, c := range []struct {
					dim       string
					limit     int64
					remaining int64
					reset     time.Duration // until full after two requests
				}{
					{"requests", 50, 48, 2400 * time.Millisecond},
					{"tokens", 10000, 7000, 18 * time.Second},
					{"input-tokens", 8000, 6000, 15 * time.Second},
					{"output-tokens", 2000, 1000, 30 * time.Second},
				} {
					p := "anthropic-ratelimit-" + c.dim + "-"
					assert.Equal(t, c.limit, num(t, ok.Header, p+"limit"), p)
					assert.InDelta(t, c.remaining, num(t, ok.Header, p+"remaining"), float64(c.limit)/100, p)
					reset, err := time.Parse(time.RFC3339, ok.Header.Get(p+"reset"))
					require.NoError(t, err)
					s.epoch(t, reset, c.reset, time.Second, p+"reset")
				}
				assert.Less(t, num(t, refused.Header, "anthropic-ratelimit-output-tokens-remaining"), int64(500), "4 accepted")
				assert.Positive(t, num(t, refused.Header, "Retry-After"))
				assert.Equal(t, "true", refused.Header.Get("X-Should-Retry"))
				assert.Contains(t, refused.body, `"type":"rate_limit_error"`)
			}},
		{Reddit, []Limit{Sliding(5, 10*time.Minute)}, request{},
			[]string{"X-Ratelimit-Remaining", "X-Ratelimit-Reset", "X-Ratelimit-Used"},
			[]string{"Retry-After", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "X-Ratelimit-Used"},
			429, func(t *testing.T, ok, refused reply, _ span) {
				assert.EqualValues(t, 2, num(t, ok.Header, "X-Ratelimit-Used"))
				assert.Equal(t, "3.0", ok.Header.Get("X-Ratelimit-Remaining"))
				assert.EqualValues(t, 3, decimal(t, ok.Header, "X-Ratelimit-Remaining"))
				assert.EqualValues(t, 600, num(t, ok.Header, "X-Ratelimit-Reset"))
				assert.Equal(t, "0.0", refused.Header.Get("X-Ratelimit-Remaining"))
			}},
		{Discord, []Limit{Sliding(5, time.Minute).Named("global")}, request{},
			[]string{"X-Ratelimit-Bucket", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "X-Ratelimit-Reset-After"},
			[]string{"Retry-After", "X-Ratelimit-Bucket", "X-Ratelimit-Global", "X-Ratelimit-Limit", "X-Ratelimit-Remaining",
				"X-Ratelimit-Reset", "X-Ratelimit-Reset-After", "X-Ratelimit-Scope"},
			429, func(t *testing.T, ok, refused reply, s span) {
				assert.EqualValues(t, 5, num(t, ok.Header, "X-RateLimit-Limit"))
				assert.EqualValues(t, 3, num(t, ok.Header, "X-RateLimit-Remaining"))
				assert.Equal(t, "60.000", ok.Header.Get("X-RateLimit-Reset-After"))
				reset := decimal(t, ok.Header, "X-RateLimit-Reset")
				s.epoch(t, time.UnixMilli(int64(reset*1000+0.5)), time.Minute, time.Millisecond, "reset")
				assert.Regexp(t, `^[0-9a-f]{8}$`, ok.Header.Get("X-RateLimit-Bucket"))
				assert.Equal(t, "true", refused.Header.Get("X-RateLimit-Global"))
				assert.Equal(t, "global", refused.Header.Get("X-RateLimit-Scope"))
				var b struct {
					RetryAfter float64 `json:"retry_after"`
					Global     bool    `json:"global"`
				}
				require.NoError(t, json.Unmarshal([]byte(refused.body), &b))
				assert.True(t, b.Global)
				assert.InDelta(t, 60, b.RetryAfter, 1)
				assert.Equal(t, int64(b.RetryAfter+0.999), num(t, refused.Header, "Retry-After"))
			}},
		{Shopify, []Limit{Bucket(2, 3)}, request{},
			[]string{"X-Shopify-Shop-Api-Call-Limit"},
			[]string{"Retry-After", "X-Shopify-Shop-Api-Call-Limit"},
			429, func(t *testing.T, ok, refused reply, _ span) {
				assert.Equal(t, "2/3", ok.Header.Get("X-Shopify-Shop-Api-Call-Limit"))
				assert.Equal(t, "3/3", refused.Header.Get("X-Shopify-Shop-Api-Call-Limit"))
				ra := decimal(t, refused.Header, "Retry-After")
				assert.True(t, ra > 0 && ra <= 0.5, "Retry-After %v: until one call is back at 2/s", ra)
				assert.Regexp(t, `^\d+\.\d$`, refused.Header.Get("Retry-After"))
			}},
		{Jira, []Limit{Fixed(5, time.Hour).Named("tenant-app-quota")}, request{},
			[]string{"Beta-Ratelimit", "Beta-Ratelimit-Policy", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"},
			[]string{"Beta-Ratelimit", "Beta-Ratelimit-Policy", "Ratelimit-Reason", "Retry-After", "X-Ratelimit-Limit",
				"X-Ratelimit-Nearlimit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"},
			429, func(t *testing.T, ok, refused reply, s span) {
				assert.Equal(t, `"tenant-app-quota";q=5;w=3600`, ok.Header.Get("Beta-RateLimit-Policy"))
				assert.Regexp(t, `^"tenant-app-quota";r=3;t=\d+$`, ok.Header.Get("Beta-RateLimit"))
				assert.EqualValues(t, 5, num(t, ok.Header, "X-RateLimit-Limit"))
				assert.EqualValues(t, 3, num(t, ok.Header, "X-RateLimit-Remaining"))
				reset, err := time.Parse("2006-01-02T15:04Z", ok.Header.Get("X-RateLimit-Reset"))
				require.NoError(t, err, ok.Header.Get("X-RateLimit-Reset"))
				assert.True(t, reset.Equal(s.from.Truncate(time.Hour).Add(time.Hour)) || reset.Equal(s.to.Truncate(time.Hour).Add(time.Hour)),
					"the window's end, on the hour: %v", reset)
				assert.Equal(t, "true", refused.Header.Get("X-RateLimit-NearLimit"))
				assert.Equal(t, "jira-quota-tenant-based", refused.Header.Get("RateLimit-Reason"))
				assert.InDelta(t, reset.Sub(s.to).Seconds(), num(t, refused.Header, "Retry-After"), 2)
			}},
		{Salesforce, []Limit{Fixed(5, 24*time.Hour)}, request{},
			[]string{"Sforce-Limit-Info"},
			[]string{"Sforce-Limit-Info"},
			403, func(t *testing.T, ok, refused reply, _ span) {
				assert.Equal(t, "api-usage=2/5", ok.Header.Get("Sforce-Limit-Info"))
				assert.Equal(t, "api-usage=5/5", refused.Header.Get("Sforce-Limit-Info"))
				assert.Contains(t, refused.body, `"errorCode":"REQUEST_LIMIT_EXCEEDED"`)
			}},
		{HubSpot, []Limit{Sliding(5, 10*time.Second), Fixed(1000, 24*time.Hour)}, request{},
			[]string{"X-Hubspot-Ratelimit-Daily", "X-Hubspot-Ratelimit-Daily-Remaining", "X-Hubspot-Ratelimit-Secondly",
				"X-Hubspot-Ratelimit-Secondly-Remaining"},
			[]string{"X-Hubspot-Ratelimit-Daily", "X-Hubspot-Ratelimit-Daily-Remaining", "X-Hubspot-Ratelimit-Secondly",
				"X-Hubspot-Ratelimit-Secondly-Remaining"},
			429, func(t *testing.T, ok, refused reply, _ span) {
				assert.EqualValues(t, 5, num(t, ok.Header, "X-HubSpot-RateLimit-Secondly"))
				assert.EqualValues(t, 3, num(t, ok.Header, "X-HubSpot-RateLimit-Secondly-Remaining"))
				assert.EqualValues(t, 1000, num(t, ok.Header, "X-HubSpot-RateLimit-Daily"))
				assert.EqualValues(t, 998, num(t, ok.Header, "X-HubSpot-RateLimit-Daily-Remaining"))
				assert.EqualValues(t, 0, num(t, refused.Header, "X-HubSpot-RateLimit-Secondly-Remaining"))
				assert.EqualValues(t, 995, num(t, refused.Header, "X-HubSpot-RateLimit-Daily-Remaining"))
				assert.Contains(t, refused.body, `"policyName":"SECONDLY"`)
			}},
		{Zendesk, []Limit{Sliding(5, time.Minute)}, request{},
			[]string{"Ratelimit-Limit", "Ratelimit-Remaining", "Ratelimit-Reset", "X-Rate-Limit", "X-Rate-Limit-Remaining"},
			[]string{"Ratelimit-Limit", "Ratelimit-Remaining", "Ratelimit-Reset", "Retry-After", "X-Rate-Limit", "X-Rate-Limit-Remaining"},
			429, func(t *testing.T, ok, refused reply, _ span) {
				assert.EqualValues(t, 5, num(t, ok.Header, "X-Rate-Limit"))
				assert.EqualValues(t, 3, num(t, ok.Header, "X-Rate-Limit-Remaining"))
				assert.EqualValues(t, 5, num(t, ok.Header, "ratelimit-limit"))
				assert.EqualValues(t, 3, num(t, ok.Header, "ratelimit-remaining"))
				assert.EqualValues(t, 60, num(t, ok.Header, "ratelimit-reset"))
				assert.InDelta(t, 60, num(t, refused.Header, "Retry-After"), 1)
			}},
	}
}

func anthropicHeaders() []string {
	var names []string
	for _, dim := range []string{"Input-Tokens", "Output-Tokens", "Requests", "Tokens"} {
		for _, f := range []string{"Limit", "Remaining", "Reset"} {
			names = append(names, "Anthropic-Ratelimit-"+dim+"-"+f)
		}
	}
	return names
}

// checkOpenAI checks the OpenAI names after two completions of 600
// tokens: 60 requests refilled at 1/s, 6000 tokens at 100/s; reset reads
// a reset back.
func checkOpenAI(t *testing.T, ok reply, reset func(name string) time.Duration) {
	t.Helper()
	h := ok.Header
	assert.EqualValues(t, 60, num(t, h, "x-ratelimit-limit-requests"))
	assert.EqualValues(t, 58, num(t, h, "x-ratelimit-remaining-requests"))
	assert.EqualValues(t, 6000, num(t, h, "x-ratelimit-limit-tokens"))
	assert.InDelta(t, 4800, num(t, h, "x-ratelimit-remaining-tokens"), 100)
	for _, c := range []struct {
		name string
		full time.Duration // until full, right after the second request
	}{{"x-ratelimit-reset-requests", 2 * time.Second}, {"x-ratelimit-reset-tokens", 12 * time.Second}} {
		d := reset(c.name)
		assert.True(t, d > c.full-time.Second && d <= c.full, "%s: %v, want about %v", c.name, d, c.full)
	}
}

// TestDialects runs each dialect end to end and reads its headers back.
func TestDialects(t *testing.T) {
	cases := dialectCases()
	var covered []Dialect
	for _, c := range cases {
		covered = append(covered, c.dialect)
		t.Run(c.dialect.String(), func(t *testing.T) {
			api, cl := start(t, Config{Limits: c.limits, Dialect: c.dialect, Advertise: c.dialect == IETF})
			s := span{from: time.Now()}
			send(t, cl, api, c.rq)
			ok := send(t, cl, api, c.rq)
			require.Equal(t, http.StatusOK, ok.StatusCode)
			var refused reply
			for range 20 {
				if refused = send(t, cl, api, c.rq); refused.StatusCode != http.StatusOK {
					break
				}
			}
			s.to = time.Now()
			require.Equal(t, c.status, refused.StatusCode, refused.body)
			assert.Equal(t, c.ok, limitHeaders(ok), "the headers of a 200")
			assert.Equal(t, c.refused, limitHeaders(refused), "the headers of the refusal")
			c.check(t, ok, refused, s)

			st := api.Stats(time.Time{})
			assert.Equal(t, 1, st.Refused)
			assert.Equal(t, st.Requests-1, st.Accepted)
			if c.status == http.StatusForbidden {
				assert.Equal(t, 1, st.Forbidden)
				assert.Zero(t, st.Limited)
			} else {
				assert.Equal(t, 1, st.Limited)
			}
		})
	}
	for d := IETF; d < dialectEnd; d++ {
		assert.Contains(t, covered, d, "a case for every dialect")
	}
}

func TestDialectNames(t *testing.T) {
	assert.Equal(t, "GitHub", GitHub.String())
	assert.Equal(t, "Zendesk", Zendesk.String())
	assert.Equal(t, "Dialect(99)", Dialect(99).String())
	assert.Equal(t, "SlidingWindow", SlidingWindow.String())
	assert.Equal(t, "output-tokens", OutputTokens.String())
	assert.Equal(t, "ResetNext", ResetNext.String())
}

func TestFormats(t *testing.T) {
	now := time.Date(2026, 3, 26, 15, 12, 30, 250_000_000, time.UTC)
	for _, c := range []struct {
		f    resetFormat
		d    time.Duration
		want string
	}{
		{deltaSeconds, 1500 * time.Millisecond, "2"},
		{deltaSeconds, 0, "0"},
		{epochSeconds, 0, strconv.FormatInt(now.Unix()+1, 10)},
		{epochSeconds, 750 * time.Millisecond, strconv.FormatInt(now.Unix()+1, 10)},
		{goDuration, 6 * time.Minute, "6m0s"},
		{goDuration, 1500 * time.Millisecond, "1.5s"},
		{goDuration, 11*time.Millisecond + 1, "12ms"},
		{goDuration, 0, "0s"},
		{rfc3339, 10 * time.Second, "2026-03-26T15:12:41Z"},
		{isoMinutes, 47*time.Minute + 29*time.Second + 750*time.Millisecond, "2026-03-26T16:00Z"},
		{isoMinutes, 47 * time.Minute, "2026-03-26T16:00Z"},
	} {
		assert.Equal(t, c.want, c.f(now, c.d), "%v", c.d)
	}
	assert.Equal(t, "1", retrySeconds(0))
	assert.Equal(t, "64.570", decimalSeconds(64570*time.Millisecond))
	assert.Equal(t, 2.0, ceilTenths(1901*time.Millisecond))
}

// TestBucketReset: a bucket's reset is until full (GCRA) or until the next
// unit, as Config.BucketReset says.
func TestBucketReset(t *testing.T) {
	for _, c := range []struct {
		mode  ResetMode
		reset []int64 // RateLimit-Reset after each of 3 requests, the last refused
	}{
		{ResetFull, []int64{10, 20, 20}}, // 0.1/s, burst 2: 10 s a token
		{ResetNext, []int64{0, 10, 10}},
	} {
		t.Run(c.mode.String(), func(t *testing.T) {
			api, cl := start(t, Config{Limits: []Limit{Bucket(0.1, 2)}, Dialect: IETFDraft, BucketReset: c.mode})
			var got []int64
			for range 3 {
				got = append(got, num(t, send(t, cl, api, request{}).Header, "RateLimit-Reset"))
			}
			assert.Equal(t, c.reset, got)
		})
	}
}
