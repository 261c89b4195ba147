package fakeapi

import (
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStorm: a seeded share of the requests within the limits is
// throttled with the storm's Retry-After; the throttled spend nothing, and
// their headers show the real remaining.
func TestStorm(t *testing.T) {
	const n, share, seed = 200, 0.3, 11
	api, c := start(t, Config{
		Limits: []Limit{Fixed(n, time.Hour)}, Dialect: IETFDraft, Seed: seed,
		Storm: Storm{Share: share, RetryAfter: 2 * time.Second},
	})
	rng := rand.New(rand.NewPCG(seed, seed))
	accepted := 0
	for i := range n {
		r := send(t, c, api, request{})
		if rng.Float64() < share {
			require.Equal(t, http.StatusTooManyRequests, r.StatusCode, "request %d", i)
			assert.Equal(t, "2", r.Header.Get("Retry-After"))
			assert.EqualValues(t, n-accepted, num(t, r.Header, "RateLimit-Remaining"), "nothing spent")
			assert.Contains(t, r.body, "rate_limit_error")
			continue
		}
		require.Equal(t, http.StatusOK, r.StatusCode, "request %d", i)
		accepted++
		assert.EqualValues(t, n-accepted, num(t, r.Header, "RateLimit-Remaining"))
	}
	st := api.Stats(time.Time{})
	assert.Equal(t, accepted, st.Accepted)
	assert.Equal(t, n-accepted, st.Storms)
	assert.Equal(t, n-accepted, st.Limited)
	assert.Zero(t, st.Refused)
	assert.InDelta(t, share*n, st.Storms, 0.3*share*n)
}

func TestStormShapes(t *testing.T) {
	cases := []struct {
		name    string
		cfg     Config
		status  int
		headers []string
		body    string
		check   func(t *testing.T, r reply)
	}{
		{"bare", Config{Limits: []Limit{Fixed(5, time.Hour)}, Dialect: GitHub,
			Storm: Storm{Share: 1, RetryAfter: 30 * time.Second, Bare: true}},
			429, []string{"Retry-After"}, "secondary rate limit", func(t *testing.T, r reply) {
				assert.Equal(t, "30", r.Header.Get("Retry-After"))
			}},
		{"GitHub secondary", Config{Limits: []Limit{Fixed(5, time.Hour)}, Dialect: GitHub,
			Storm: Storm{Share: 1, RetryAfter: 30 * time.Second}},
			429, []string{"Retry-After", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "X-Ratelimit-Resource", "X-Ratelimit-Used"},
			"secondary rate limit", func(t *testing.T, r reply) {
				assert.EqualValues(t, 5, num(t, r.Header, "X-RateLimit-Remaining"), "the quota has room")
			}},
		{"lock timeout", Config{Rate: 10, Burst: 10, Storm: Storm{Share: 1, LockTimeout: true}},
			429, nil, `"code":"lock_timeout"`, nil},
		{"load shedding 503", Config{Rate: 10, Burst: 10, Advertise: true, Storm: Storm{Share: 1, Status: 503, RetryAfter: 1500 * time.Millisecond}},
			503, []string{"Ratelimit", "Ratelimit-Policy", "Retry-After", "X-Ratelimit-Limit", "X-Ratelimit-Remaining"},
			"temporarily unavailable", func(t *testing.T, r reply) {
				assert.Equal(t, "2", r.Header.Get("Retry-After"), "whole seconds, rounded up")
				assert.Equal(t, `"default";r=10;t=0`, r.Header.Get("RateLimit"))
			}},
		{"Discord shared", Config{Limits: []Limit{Sliding(5, time.Minute)}, Dialect: Discord, Storm: Storm{Share: 1, RetryAfter: 2 * time.Second}},
			429, []string{"Retry-After", "X-Ratelimit-Bucket", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset",
				"X-Ratelimit-Reset-After", "X-Ratelimit-Scope"},
			`"retry_after":2.000`, func(t *testing.T, r reply) {
				assert.Equal(t, "shared", r.Header.Get("X-RateLimit-Scope"))
			}},
		{"OpenAI", Config{Limits: []Limit{{Quota: 60, Rate: 1}}, Dialect: OpenAI, Storm: Storm{Share: 1, RetryAfter: 1500 * time.Millisecond}},
			429, []string{"Retry-After", "Retry-After-Ms", "X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests",
				"X-Ratelimit-Reset-Requests", "X-Should-Retry"},
			"rate_limit_exceeded", func(t *testing.T, r reply) {
				assert.Equal(t, "1500", r.Header.Get("Retry-After-Ms"))
				assert.Equal(t, "2", r.Header.Get("Retry-After"))
				assert.Equal(t, "60", r.Header.Get("X-RateLimit-Remaining-Requests"))
			}},
		{"Shopify", Config{Limits: []Limit{Bucket(2, 40)}, Dialect: Shopify, Storm: Storm{Share: 1, RetryAfter: 2 * time.Second}},
			429, []string{"Retry-After", "X-Shopify-Shop-Api-Call-Limit"}, "Exceeded", func(t *testing.T, r reply) {
				assert.Equal(t, "2.0", r.Header.Get("Retry-After"))
				assert.Equal(t, "0/40", r.Header.Get("X-Shopify-Shop-Api-Call-Limit"))
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			api, cl := start(t, c.cfg)
			for range 3 {
				r := send(t, cl, api, request{})
				assert.Equal(t, c.status, r.StatusCode)
				assert.Equal(t, c.headers, limitHeaders(r))
				assert.Contains(t, r.body, c.body)
				if c.check != nil {
					c.check(t, r)
				}
			}
			st := api.Stats(time.Time{})
			assert.Equal(t, 3, st.Storms)
			assert.Zero(t, st.Refused+st.Accepted)
			if c.status == 503 {
				assert.Equal(t, 3, st.Unavailable)
			} else {
				assert.Equal(t, 3, st.Limited)
			}
		})
	}
}

// TestStormOnlyWithinLimits: over the limit, the refusal is the limit's,
// not the storm's.
func TestStormOnlyWithinLimits(t *testing.T) {
	api, c := start(t, Config{Rate: 0.01, Burst: 2, Storm: Storm{Share: 0.5, RetryAfter: time.Hour}, Seed: 1})
	for range 40 {
		send(t, c, api, request{})
	}
	st := api.Stats(time.Time{})
	assert.Equal(t, 2, st.Accepted, "the storm never spends the burst; it is spent once")
	assert.Positive(t, st.Storms)
	assert.Positive(t, st.Refused)
	assert.Equal(t, 40, st.Accepted+st.Storms+st.Refused)
	assert.Equal(t, st.Storms+st.Refused, st.Limited)
}

// TestInsufficientQuota: OpenAI's billing error on a share of the
// requests, before the limits, spending nothing, never to be retried.
func TestInsufficientQuota(t *testing.T) {
	t.Run("all", func(t *testing.T) {
		api, c := start(t, Config{Limits: []Limit{{Quota: 60, Rate: 1}}, Dialect: OpenAI, InsufficientQuota: 1})
		for range 3 {
			r := send(t, c, api, request{})
			assert.Equal(t, http.StatusTooManyRequests, r.StatusCode)
			assert.Contains(t, r.body, `"type":"insufficient_quota"`)
			assert.Contains(t, r.body, `"code":"insufficient_quota"`)
			assert.Equal(t, "false", r.Header.Get("X-Should-Retry"))
			assert.Empty(t, r.Header.Get("Retry-After"))
			assert.Empty(t, r.Header.Get("Retry-After-Ms"))
			assert.Equal(t, "60", r.Header.Get("X-RateLimit-Remaining-Requests"), "nothing spent")
		}
		st := api.Stats(time.Time{})
		assert.Equal(t, 3, st.Billing)
		assert.Equal(t, 3, st.Limited)
		assert.Zero(t, st.Refused+st.Storms)
	})
	t.Run("share", func(t *testing.T) {
		const n, share, seed = 100, 0.2, 5
		api, c := start(t, Config{Rate: 1e6, Burst: n, InsufficientQuota: share, Seed: seed})
		rng := rand.New(rand.NewPCG(seed, seed))
		for i := range n {
			want := http.StatusOK
			if rng.Float64() < share {
				want = http.StatusTooManyRequests
			}
			assert.Equal(t, want, send(t, c, api, request{}).StatusCode, "request %d", i)
		}
		st := api.Stats(time.Time{})
		assert.Equal(t, st.Limited, st.Billing)
		assert.Equal(t, n, st.Accepted+st.Billing)
	})
}

// TestTokenCost: a request's tokens come from the headers or the JSON
// body's max_tokens; a JSON POST must be a JSON object.
func TestTokenCost(t *testing.T) {
	api, c := start(t, Config{Limits: []Limit{
		Fixed(100, time.Hour),
		Fixed(10000, time.Hour).Of(InputTokens),
		Fixed(10000, time.Hour).Of(OutputTokens),
	}, Dialect: Anthropic})
	remaining := func(r reply) (in, out int64) {
		return num(t, r.Header, "anthropic-ratelimit-input-tokens-remaining"), num(t, r.Header, "anthropic-ratelimit-output-tokens-remaining")
	}
	for _, s := range []struct {
		name    string
		rq      request
		in, out int64 // remaining after
		status  int
	}{
		{"max_tokens", request{json: `{"max_tokens":300}`}, 10000, 9700, 200},
		{"headers", request{json: `{}`, header: map[string]string{InputTokensHeader: "1000", OutputTokensHeader: "50"}}, 9000, 9650, 200},
		{"the header wins over the body", request{json: `{"max_tokens":999}`, header: map[string]string{OutputTokensHeader: "50"}}, 9000, 9600, 200},
		{"bad header counts 0", request{json: `{}`, header: map[string]string{InputTokensHeader: "-5"}}, 9000, 9600, 200},
		{"form charge costs no tokens", request{}, 9000, 9600, 200},
		{"too many output tokens", request{json: `{"max_tokens":9601}`}, 9000, 9600, 429},
		{"not JSON", request{json: `{"max_tokens":`}, 9000, 9600, 400},
	} {
		r := send(t, c, api, s.rq)
		assert.Equal(t, s.status, r.StatusCode, s.name)
		in, out := remaining(r)
		assert.Equal(t, s.in, in, s.name)
		assert.Equal(t, s.out, out, s.name)
	}
}

// TestJSONGetNeedsNoBody: reads are valid without a body, JSON or not.
func TestJSONGetNeedsNoBody(t *testing.T) {
	api, c := start(t, Config{Rate: 10, Burst: 10})
	req, err := http.NewRequest(http.MethodGet, api.URL()+"/v1/models", strings.NewReader(""))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestConcurrentLimits: callers at once against several limits and a
// storm; the counts are exact and no limit is overrun (for -race).
func TestConcurrentLimits(t *testing.T) {
	const quota, callers, each = 50, 8, 25
	api, c := start(t, Config{
		Limits:  []Limit{Bucket(1e6, 1000), Fixed(quota, time.Hour), Sliding(quota+10, time.Hour)},
		Dialect: GitHub, Storm: Storm{Share: 0.2, RetryAfter: time.Second}, Seed: 3,
	})
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[int]int{}
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				r := send(t, c, api, request{})
				mu.Lock()
				got[r.StatusCode]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	st := api.Stats(time.Time{})
	assert.Equal(t, callers*each, st.Requests)
	assert.Equal(t, quota, st.Accepted, "exactly the fixed window's quota")
	assert.Equal(t, got[200], st.Accepted)
	assert.Equal(t, got[429], st.Limited)
	assert.Equal(t, got[403], st.Forbidden)
	assert.Equal(t, st.Forbidden, st.Refused)
	assert.Equal(t, st.Limited, st.Storms)
	assert.Equal(t, st.Requests, st.Accepted+st.Refused+st.Storms)
}
