package fakellm

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/egress-go/egress/internal/clock"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const ms = time.Millisecond

// t0 is the fake clock's start: on the minute (and on the 10 minutes), so
// that fixed windows begin at it.
var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// serve runs a provider for the test over real HTTP and returns it, its
// base URL and a client whose connections are closed before the server.
func serve(t *testing.T, cfg Config) (*Server, string, *http.Client) {
	t.Helper()
	s, err := New(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(s)
	tr := &http.Transport{}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		srv.Close()
	})
	return s, srv.URL, &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

// serveFake is serve with a fake clock at start.
func serveFake(t *testing.T, cfg Config, start time.Time) (*Server, string, *http.Client, *clock.Fake) {
	t.Helper()
	fc := clock.NewFake(start)
	cfg.Clock = fc
	s, url, c := serve(t, cfg)
	return s, url, c, fc
}

// chatBody is an OpenAI request body with one user message.
func chatBody(content string, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{
		"model":      "gpt-4o",
		"messages":   []map[string]string{{"role": "user", "content": content}},
		"max_tokens": maxTokens,
		"stream":     stream,
	})
	return string(b)
}

// claudeBody is an Anthropic request body with one user message.
func claudeBody(content string, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{
		"model":      "claude-sonnet-4-5",
		"messages":   []map[string]string{{"role": "user", "content": content}},
		"max_tokens": maxTokens,
		"stream":     stream,
	})
	return string(b)
}

// prompt16 is a message content of 40 bytes: 16 input tokens in all
// (TokensPerRequest + TokensPerMessage + 10).
var prompt16 = strings.Repeat("abcd", 10)

// post sends body to url and returns the response with its body read.
func post(t *testing.T, c *http.Client, url, body string) (*http.Response, string) {
	t.Helper()
	resp, b, err := send(c, url, body)
	require.NoError(t, err)
	return resp, b
}

// send is post for other goroutines than the test's: it returns the error.
func send(c *http.Client, url, body string) (*http.Response, string, error) {
	resp, err := c.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(resp.Body)
	if cerr := resp.Body.Close(); err == nil {
		err = cerr
	}
	return resp, string(b), err
}
