package egress

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/egress-go/egress/internal/usage"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Bodies as the providers send them (OpenAI's chat completions, plain and
// streamed with stream_options.include_usage; Anthropic's messages, plain
// and streamed).
const (
	openAIBody = `{"id":"chatcmpl-abc","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"usage: {\"x\": 1}"},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}`
	openAIStream = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n" +
		"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":7,\"total_tokens\":19}}\n\n" +
		"data: [DONE]\n\n"
	shopifyBody = `{"data":{"products":{"edges":[]}},"extensions":{"cost":{"requestedQueryCost":52,"actualQueryCost":12,` +
		`"throttleStatus":{"maximumAvailable":1000.0,"currentlyAvailable":988,"restoreRate":50.0}}}}`
	anthropicBody   = `{"id":"msg_1","type":"message","content":[{"type":"text","text":"Hi"}],"usage":{"input_tokens":25,"cache_creation_input_tokens":5,"cache_read_input_tokens":100,"output_tokens":13}}`
	anthropicStream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":15}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
)

// TestUsageScan: the usage of each body, read whole and split at every
// byte (the key, a number, an object across two reads).
func TestUsageScan(t *testing.T) {
	est := Cost{Requests: 1, Tokens: 500, InputTokens: 100, OutputTokens: 400}
	for _, tc := range []struct {
		name, body string
		want       Cost
		found      bool
	}{
		{"openai", openAIBody, Cost{Requests: 1, Tokens: 29, InputTokens: 19, OutputTokens: 10}, true},
		{"openai stream", openAIStream, Cost{Requests: 1, Tokens: 19, InputTokens: 12, OutputTokens: 7}, true},
		{"anthropic", anthropicBody, Cost{Requests: 1, Tokens: 43, InputTokens: 30, OutputTokens: 13}, true},
		{"anthropic stream", anthropicStream, Cost{Requests: 1, Tokens: 40, InputTokens: 25, OutputTokens: 15}, true},
		{"no usage", `{"object":"charge","status":"succeeded"}`, est, false},
		{"usage null", `{"usage":null}`, est, false},
		{"usage a string", `{"note":"usage","usage":"n/a"}`, est, false},
		{"negative counts", `{"usage":{"prompt_tokens":-5}}`, est, false},
		{"too long", `{"usage":{"x":"` + strings.Repeat("a", usage.MaxObject) + `","prompt_tokens":3}}`, est, false},
		{"only output", `{"usage":{"output_tokens":8}}`, Cost{Requests: 1, Tokens: 500, InputTokens: 100, OutputTokens: 8}, true},
		{"shopify graphql", shopifyBody, Cost{Requests: 1, Tokens: 500, InputTokens: 100, OutputTokens: 400, Points: 12}, true},
		{"shopify cost at the end", `{"actualQueryCost":7.5`, Cost{Requests: 1, Tokens: 500, InputTokens: 100, OutputTokens: 400, Points: 8}, true},
		{"shopify cost null", `{"actualQueryCost":null}`, est, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for split := 0; split <= len(tc.body); split++ {
				var s usage.Scan
				s.Feed([]byte(tc.body[:split]))
				s.Feed([]byte(tc.body[split:]))
				got, found := scanCost(&s, est)
				require.Equal(t, tc.found, found, "split at %d", split)
				require.Equal(t, tc.want, got, "split at %d", split)
			}
			var s usage.Scan // a byte at a time
			for i := range len(tc.body) {
				s.Feed([]byte{tc.body[i]})
			}
			got, _ := scanCost(&s, est)
			assert.Equal(t, tc.want, got, "a byte at a time")
		})
	}
}

// llmServer answers each request with body, or 429 when throttled says so.
func llmServer(t *testing.T, body string, status func() int) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if st := status(); st != http.StatusOK {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(st)
			fmt.Fprint(w, `{"error":{"type":"tokens","code":"rate_limit_exceeded"}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, line := range strings.SplitAfter(body, "\n\n") {
			fmt.Fprint(w, line)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestTransportSettlesUsage: a Transport WithCosts settles each attempt's
// tokens from its response: a streamed body at its end (the caller reads
// it intact), a 429 at 0 tokens, a body closed early at its estimate.
func TestTransportSettlesUsage(t *testing.T) {
	lim, err := NewLimits(WindowOf(Requests, 100, time.Hour), WindowOf(Tokens, 1000, time.Hour))
	require.NoError(t, err)
	status := http.StatusOK
	srv := llmServer(t, openAIStream, func() int { return status })
	tr, err := New(nil, WithLimiter(lim), WithCosts(func(*http.Request) Cost { return Cost{Requests: 1, Tokens: 300} }))
	require.NoError(t, err)
	client := &http.Client{Transport: tr}
	used := func() int {
		lim.mu.Lock()
		defer lim.mu.Unlock()
		return lim.states[1].M[strings.TrimPrefix(srv.URL, "http://")].log.Sum
	}

	resp, err := client.Post(srv.URL, "application/json", strings.NewReader(`{"max_tokens":300}`))
	require.NoError(t, err)
	assert.Equal(t, 300, used(), "the estimate, until the body's end")
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, openAIStream, string(b), "the caller reads the body intact")
	assert.Equal(t, 19, used(), "settled at the usage's total_tokens")

	status = http.StatusTooManyRequests
	resp, err = client.Get(srv.URL)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 19, used(), "a refusal spent no tokens")

	status = http.StatusOK
	resp, err = client.Get(srv.URL)
	require.NoError(t, err)
	resp.Body.Close() // before its end: the estimate stands
	assert.Equal(t, 319, used())
}

func TestWithCostsValidates(t *testing.T) {
	tb, err := NewTokenBucket(PerSecond(1), 1)
	require.NoError(t, err)
	lim, err := NewLimits(WindowOf(Tokens, 10, time.Second))
	require.NoError(t, err)
	est := func(*http.Request) Cost { return Cost{Requests: 1} }
	for _, tc := range []struct {
		opts []Option
		want string
	}{
		{[]Option{WithCosts(nil), WithLimiter(lim)}, "WithCosts nil"},
		{[]Option{WithCosts(est), WithLimiter(tb)}, "WithCosts: limiter *egress.TokenBucket: must count costs in dimensions"},
		{[]Option{WithCosts(est)}, "WithCosts: limiter <nil>"},
		{[]Option{WithCosts(est), WithLimiter(lim), WithCostFunc(unitCost)}, "WithCosts with WithCostFunc"},
	} {
		_, err := New(nil, tc.opts...)
		require.ErrorIs(t, err, ErrInvalidConfig)
		assert.Contains(t, err.Error(), tc.want)
	}
	tr, err := New(nil, WithLimiter(lim), WithCosts(func(*http.Request) Cost { return Cost{Requests: 1, Tokens: -2} }))
	require.NoError(t, err)
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://127.0.0.1:1/", nil)
	_, err = tr.RoundTrip(req)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "WithCosts returned -2 tokens")
}

func TestLLMCost(t *testing.T) {
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"Say hello."}],"max_tokens":50}`
	req, err := http.NewRequest(http.MethodPost, "https://api.openai.com/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	in := (len(body) + 3) / 4
	assert.Equal(t, Cost{Requests: 1, InputTokens: in, OutputTokens: 50, Tokens: in + 50}, LLMCost(req))
	rest, err := io.ReadAll(req.Body)
	require.NoError(t, err)
	assert.Equal(t, body, string(rest), "the request's own body is not read")

	req, _ = http.NewRequest(http.MethodPost, "https://api.anthropic.com/v1/messages", strings.NewReader(`{"max_completion_tokens":7,"max_tokens":9}`))
	assert.Equal(t, 7, LLMCost(req).OutputTokens, "OpenAI's newer name first")
	req, _ = http.NewRequest(http.MethodPost, "https://x/", strings.NewReader(`not json`))
	assert.Equal(t, Cost{Requests: 1, InputTokens: 2, Tokens: 2}, LLMCost(req))
	req, _ = http.NewRequest(http.MethodGet, "https://x/", nil)
	assert.Equal(t, Cost{Requests: 1}, LLMCost(req), "no body: the request only")
	req, _ = http.NewRequest(http.MethodPost, "https://x/", io.NopCloser(strings.NewReader(body)))
	assert.Equal(t, Cost{Requests: 1}, LLMCost(req), "no GetBody: the body is the caller's, unread")
}

// slowEnd answers with contentType and body, flushed, and ends the body only
// after a pause: a caller that closes at the end of the content does so
// before it reads io.EOF. With status 429 it sends OpenAI's tokens headers
// with nothing remaining.
func slowEnd(t *testing.T, contentType, body string, status int) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", contentType)
		if status != http.StatusOK {
			w.Header().Set("x-ratelimit-limit-tokens", "1000")
			w.Header().Set("x-ratelimit-remaining-tokens", "0")
			w.Header().Set("x-ratelimit-reset-tokens", "30s")
			w.WriteHeader(status)
		}
		fmt.Fprint(w, body)
		w.(http.Flusher).Flush()
		select {
		case <-time.After(200 * time.Millisecond):
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestTransportSettlesOnClose: a caller that stops reading where the
// content ends (an SDK at a stream's "[DONE]", a JSON decoder) and closes
// the body settles its usage; one that closes a stream before its end
// keeps its estimate.
func TestTransportSettlesOnClose(t *testing.T) {
	for _, tc := range []struct {
		name, contentType, body string
		read                    func(io.Reader)
		want                    int
	}{
		{"stream to [DONE]", "text/event-stream", openAIStream, func(r io.Reader) {
			sc := bufio.NewScanner(r)
			for sc.Scan() && sc.Text() != "data: [DONE]" {
			}
		}, 19},
		{"json decoded", "application/json", openAIBody + "\n", func(r io.Reader) {
			var v map[string]any
			json.NewDecoder(r).Decode(&v)
		}, 29},
		{"stream cut short", "text/event-stream", strings.TrimSuffix(openAIStream, "data: [DONE]\n\n"), func(r io.Reader) {
			sc := bufio.NewScanner(r)
			sc.Scan() // closed before the stream's end
		}, 300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim, err := NewLimits(WindowOf(Tokens, 1000, time.Hour))
			require.NoError(t, err)
			srv := slowEnd(t, tc.contentType, tc.body, http.StatusOK)
			tr, err := New(nil, WithLimiter(lim), WithCosts(func(*http.Request) Cost { return Cost{Requests: 1, Tokens: 300} }))
			require.NoError(t, err)
			resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
			require.NoError(t, err)
			tc.read(resp.Body)
			resp.Body.Close()
			lim.mu.Lock()
			defer lim.mu.Unlock()
			assert.Equal(t, tc.want, lim.states[0].M[strings.TrimPrefix(srv.URL, "http://")].log.Sum)
		})
	}
}

// TestTransportSettlesBeforeLearning: a 429 that says no tokens remain
// leaves the window full: its own estimate is given back before the count
// caps the window, not after.
func TestTransportSettlesBeforeLearning(t *testing.T) {
	lim, err := NewLimits(WindowOf(Tokens, 1000, time.Minute))
	require.NoError(t, err)
	srv := slowEnd(t, "application/json", `{"error":{"code":"rate_limit_exceeded"}}`, http.StatusTooManyRequests)
	tr, err := New(nil, WithLimiter(lim), WithCosts(func(*http.Request) Cost { return Cost{Requests: 1, Tokens: 300} }))
	require.NoError(t, err)
	resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
	require.NoError(t, err)
	resp.Body.Close()
	lim.mu.Lock()
	defer lim.mu.Unlock()
	assert.Equal(t, 1000, lim.states[0].M[strings.TrimPrefix(srv.URL, "http://")].log.Sum)
}

// TestLLMCostInlineImages: an inline image counts as usage.ImageTokens whatever
// its size, in OpenAI's data URL and in Anthropic's base64 source; other
// inline data (a PDF) and text count by size.
func TestLLMCostInlineImages(t *testing.T) {
	data := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xff, 0xd8, 0x42}, 100_000)) // 400,000 bytes of base64
	cost := func(body string) Cost {
		req, err := http.NewRequest(http.MethodPost, "https://x/", strings.NewReader(body))
		require.NoError(t, err)
		return LLMCost(req)
	}
	openai := `{"model":"gpt-4o","max_tokens":100,"messages":[{"role":"user","content":[{"type":"text","text":"What is this?"},` +
		`{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,` + data + `"}}]}]}`
	c := cost(openai)
	assert.Equal(t, (len(openai)-len(data)+3)/4+usage.ImageTokens, c.InputTokens, "the image counts as one image, not 100,000 tokens")
	assert.Equal(t, c.InputTokens+100, c.Tokens)

	anthropic := `{"model":"claude","max_tokens":100,"messages":[{"role":"user","content":[` +
		`{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + data + `"}},` +
		`{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + data + `"}},` +
		`{"type":"text","text":"Compare them."}]}]}`
	assert.Equal(t, (len(anthropic)-2*len(data)+3)/4+2*usage.ImageTokens, cost(anthropic).InputTokens, "two images")

	pdf := `{"model":"claude","max_tokens":100,"messages":[{"role":"user","content":[` +
		`{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"` + data + `"}}]}]}`
	assert.Equal(t, (len(pdf)+3)/4, cost(pdf).InputTokens, "a document counts by its size")

	text := `{"max_tokens":1,"messages":[{"role":"user","content":"see image/below: ` + strings.Repeat("ab", 400) + `"}]}`
	assert.Equal(t, (len(text)+3)/4, cost(text).InputTokens, "a run shorter than 1 KiB is text")
}
