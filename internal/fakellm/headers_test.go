package fakellm

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// headerStep is one request and the exact headers of its response; a
// header wanted "" must be absent.
type headerStep struct {
	advance time.Duration // of the fake clock, before the request
	path    string
	body    string
	status  int
	headers map[string]string
}

func runHeaders(t *testing.T, cfg Config, start time.Time, steps []headerStep) {
	t.Helper()
	_, url, cl, fc := serveFake(t, cfg, start)
	for i, st := range steps {
		fc.Advance(st.advance)
		resp, body := post(t, cl, url+st.path, st.body)
		require.Equal(t, st.status, resp.StatusCode, "step %d: %s", i, body)
		for name, want := range st.headers {
			assert.Equal(t, want, resp.Header.Get(name), "step %d: %s", i, name)
			if want == "" {
				assert.NotContains(t, resp.Header, http.CanonicalHeaderKey(name), "step %d", i)
			}
		}
	}
}

// TestOpenAIHeaders: the literal values, as OpenAI writes them: counts,
// and resets as Go durations rounded up to the millisecond.
func TestOpenAIHeaders(t *testing.T) {
	chat := chatBody(prompt16, 100, false) // 16 + 100 tokens up front
	t.Run("token bucket", func(t *testing.T) {
		runHeaders(t, Config{RPM: 60, TPM: 150000, Output: Uniform(0.5, 0.5)}, t0, []headerStep{
			{0, ChatCompletionsPath, chat, 200, map[string]string{
				"x-ratelimit-limit-requests":     "60",
				"x-ratelimit-limit-tokens":       "150000",
				"x-ratelimit-remaining-requests": "59",
				"x-ratelimit-remaining-tokens":   "149884",
				"x-ratelimit-reset-requests":     "1s",
				"x-ratelimit-reset-tokens":       "47ms", // 116 tokens at 2500 per second: 46.4ms
				"retry-after":                    "",
				"retry-after-ms":                 "",
			}},
			{0, ChatCompletionsPath, chat, 200, map[string]string{
				"x-ratelimit-remaining-requests": "58",
				"x-ratelimit-remaining-tokens":   "149818", // the first was refunded 50
				"x-ratelimit-reset-requests":     "2s",
				"x-ratelimit-reset-tokens":       "73ms", // 182 tokens: 72.8ms
			}},
			{500 * ms, ChatCompletionsPath, chat, 200, map[string]string{
				"x-ratelimit-remaining-requests": "57", // 58.5 - 1
				"x-ratelimit-reset-requests":     "2.5s",
				"x-ratelimit-remaining-tokens":   "149884", // full again before this one
				"x-ratelimit-reset-tokens":       "47ms",
			}},
		})
	})
	t.Run("fixed window", func(t *testing.T) {
		runHeaders(t, Config{RPM: 10, TPM: 1000, Enforcement: FixedWindow, Minute: 10 * time.Minute}, t0.Add(4*time.Minute), []headerStep{
			{0, ChatCompletionsPath, chat, 200, map[string]string{
				"x-ratelimit-remaining-requests": "9",
				"x-ratelimit-reset-requests":     "6m0s",
				"x-ratelimit-reset-tokens":       "6m0s",
			}},
			{90 * time.Second, ChatCompletionsPath, chat, 200, map[string]string{
				"x-ratelimit-remaining-requests": "8",
				"x-ratelimit-reset-requests":     "4m30s",
			}},
		})
	})
	t.Run("sliding window, no token limit", func(t *testing.T) {
		runHeaders(t, Config{RPM: 3, Enforcement: SlidingWindow, Minute: 1500 * ms}, t0, []headerStep{
			{0, ChatCompletionsPath, chat, 200, map[string]string{
				"x-ratelimit-limit-requests":     "3",
				"x-ratelimit-remaining-requests": "2",
				"x-ratelimit-reset-requests":     "1.5s",
				"x-ratelimit-limit-tokens":       "",
				"x-ratelimit-remaining-tokens":   "",
				"x-ratelimit-reset-tokens":       "",
			}},
			{12 * ms, ChatCompletionsPath, chat, 200, map[string]string{
				"x-ratelimit-remaining-requests": "1",
				"x-ratelimit-reset-requests":     "1.5s",
			}},
			{1488 * ms, ChatCompletionsPath, chat, 200, map[string]string{
				"x-ratelimit-remaining-requests": "1", // the first is back
				"x-ratelimit-reset-requests":     "1.5s",
			}},
			{1488 * ms, ChatCompletionsPath, chat, 200, map[string]string{
				"x-ratelimit-remaining-requests": "1",
				"x-ratelimit-reset-requests":     "1.5s",
			}},
			{0, ChatCompletionsPath, chat, 200, map[string]string{
				"x-ratelimit-remaining-requests": "0",
				"x-ratelimit-reset-requests":     "1.5s",
			}},
			{0, ChatCompletionsPath, chat, 429, map[string]string{
				"x-ratelimit-remaining-requests": "0",
				"retry-after-ms":                 "12", // the oldest, 12ms apart from the next, ends first
				"retry-after":                    "1",
			}},
		})
	})
}

// TestOpenAIRefusal: the 429's headers and its exact body.
func TestOpenAIRefusal(t *testing.T) {
	_, url, cl, _ := serveFake(t, Config{RPM: 100, TPM: 30000, Output: Uniform(1, 1)}, t0)
	body := chatBody(prompt16, 1184, false) // 1200 tokens up front, and in the end
	for range 25 {
		resp, b := post(t, cl, url+ChatCompletionsPath, body)
		require.Equal(t, 200, resp.StatusCode, b)
	}
	resp, b := post(t, cl, url+ChatCompletionsPath, body)
	require.Equal(t, 429, resp.StatusCode)
	want := map[string]string{
		"x-ratelimit-limit-requests":     "100",
		"x-ratelimit-limit-tokens":       "30000",
		"x-ratelimit-remaining-requests": "75",
		"x-ratelimit-remaining-tokens":   "0",
		"x-ratelimit-reset-requests":     "15s",
		"x-ratelimit-reset-tokens":       "1m0s",
		"retry-after-ms":                 "2400", // 1200 tokens at 500 per second
		"retry-after":                    "3",
		"content-type":                   "application/json",
	}
	for name, v := range want {
		assert.Equal(t, v, resp.Header.Get(name), name)
	}
	assert.Equal(t, `{"error":{"message":"Rate limit reached for gpt-4o in organization org-fakellm on tokens per min (TPM): `+
		`Limit 30000, Used 30000, Requested 1200. Please try again in 2.4s. `+
		`Visit https://platform.openai.com/account/rate-limits to learn more.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`+"\n", b)
}

// TestOpenAIRequestsRefusal: a refusal by RPM says so.
func TestOpenAIRequestsRefusal(t *testing.T) {
	_, url, cl, _ := serveFake(t, Config{RPM: 3, TPM: 30000}, t0)
	for range 3 {
		post(t, cl, url+ChatCompletionsPath, chatBody("hi", 10, false))
	}
	resp, b := post(t, cl, url+ChatCompletionsPath, chatBody("hi", 10, false))
	require.Equal(t, 429, resp.StatusCode)
	assert.Equal(t, "20000", resp.Header.Get("retry-after-ms"))
	assert.Equal(t, "20", resp.Header.Get("retry-after"))
	assert.JSONEq(t, `{"error":{"message":"Rate limit reached for gpt-4o in organization org-fakellm on requests per min (RPM): `+
		`Limit 3, Used 3, Requested 1. Please try again in 20s. Visit https://platform.openai.com/account/rate-limits to learn more.",`+
		`"type":"requests","param":null,"code":"rate_limit_exceeded"}}`, b)
}

// TestAnthropicHeaders: anthropic-ratelimit-* with RFC 3339 resets rounded
// up to the second; tokens-* is the most restrictive token limit; a 429
// carries retry-after in seconds and Anthropic's error.
func TestAnthropicHeaders(t *testing.T) {
	start := time.Date(2025, 8, 21, 12, 40, 0, 0, time.UTC)
	runHeaders(t, Config{RPM: 50, InputTPM: 40000, OutputTPM: 8000, Output: Uniform(1, 1)}, start, []headerStep{
		{0, MessagesPath, claudeBody(prompt16, 100, false), 200, map[string]string{
			"anthropic-ratelimit-requests-limit":          "50",
			"anthropic-ratelimit-requests-remaining":      "49",
			"anthropic-ratelimit-requests-reset":          "2025-08-21T12:40:02Z", // 1.2s, rounded up
			"anthropic-ratelimit-input-tokens-limit":      "40000",
			"anthropic-ratelimit-input-tokens-remaining":  "39984",
			"anthropic-ratelimit-input-tokens-reset":      "2025-08-21T12:40:01Z", // 24ms
			"anthropic-ratelimit-output-tokens-limit":     "8000",
			"anthropic-ratelimit-output-tokens-remaining": "7900",
			"anthropic-ratelimit-output-tokens-reset":     "2025-08-21T12:40:01Z", // 750ms
			"anthropic-ratelimit-tokens-limit":            "8000",
			"anthropic-ratelimit-tokens-remaining":        "7900",
			"anthropic-ratelimit-tokens-reset":            "2025-08-21T12:40:01Z",
			"x-ratelimit-limit-requests":                  "",
		}},
		{0, MessagesPath, claudeBody(prompt16, 8000, false), 429, map[string]string{
			"anthropic-ratelimit-output-tokens-remaining": "7900",
			"retry-after":    "1", // 100 output tokens at 8000 per minute: 750ms
			"retry-after-ms": "",
		}},
		{2 * time.Second, MessagesPath, claudeBody(prompt16, 8000, false), 200, map[string]string{
			"anthropic-ratelimit-output-tokens-remaining": "0",
			"anthropic-ratelimit-output-tokens-reset":     "2025-08-21T12:41:02Z",
		}},
	})
	_, url, cl, _ := serveFake(t, Config{OutputTPM: 8000}, start)
	post(t, cl, url+MessagesPath, claudeBody(prompt16, 8000, false))
	resp, b := post(t, cl, url+MessagesPath, claudeBody(prompt16, 8000, false))
	require.Equal(t, 429, resp.StatusCode)
	assert.JSONEq(t, `{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed the rate limit `+
		`for your organization (org-fakellm) of 8,000 output tokens per minute. For details, refer to: https://docs.claude.com/en/api/rate-limits. `+
		`You can see the response headers for current usage. Please reduce the prompt length or the maximum tokens requested, or try again later."}}`, b)
}

// TestHeadersOff: the limit headers and the retry headers can each be
// left out.
func TestHeadersOff(t *testing.T) {
	cases := []struct {
		name               string
		cfg                Config
		limits, retryAfter bool
	}{
		{"both", Config{RPM: 1}, true, true},
		{"no limit headers", Config{RPM: 1, OmitLimitHeaders: true}, false, true},
		{"no retry-after", Config{RPM: 1, OmitRetryAfter: true}, true, false},
		{"neither", Config{RPM: 1, OmitLimitHeaders: true, OmitRetryAfter: true}, false, false},
	}
	for _, c := range cases {
		for _, path := range []string{ChatCompletionsPath, MessagesPath} {
			t.Run(c.name+path, func(t *testing.T) {
				_, url, cl, _ := serveFake(t, c.cfg, t0)
				body := chatBody("hi", 10, false)
				ok, _ := post(t, cl, url+path, body)
				refused, _ := post(t, cl, url+path, body)
				require.Equal(t, 200, ok.StatusCode)
				require.Equal(t, 429, refused.StatusCode)
				for _, resp := range []*http.Response{ok, refused} {
					assert.Equal(t, c.limits, hasPrefix(resp.Header, "X-Ratelimit-", "Anthropic-Ratelimit-"))
				}
				assert.Equal(t, c.retryAfter, refused.Header.Get("retry-after") != "")
				assert.Equal(t, c.retryAfter && path == ChatCompletionsPath, refused.Header.Get("retry-after-ms") != "")
			})
		}
	}
}

func hasPrefix(h http.Header, prefixes ...string) bool {
	for name := range h {
		for _, p := range prefixes {
			if strings.HasPrefix(name, p) {
				return true
			}
		}
	}
	return false
}
