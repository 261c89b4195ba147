package fakellm

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOutageAnswersEveryRequestInTheDialect(t *testing.T) {
	const body = `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name       string
		outage     Outage
		path       string
		status     int
		errType    string // the error body's type
		retryAfter string
		retryMs    string
	}{
		{"openai default", Outage{}, ChatCompletionsPath, 503, "server_error", "", ""},
		{"anthropic default", Outage{}, MessagesPath, StatusOverloaded, "overloaded_error", "", ""},
		{"openai 429", Outage{Status: 429, RetryAfter: 100 * ms}, ChatCompletionsPath, 429, "requests", "1", "100"},
		{"anthropic 429", Outage{Status: 429, RetryAfter: 1500 * ms}, MessagesPath, 429, "rate_limit_error", "2", ""},
		{"anthropic 503", Outage{Status: 503}, MessagesPath, 503, "overloaded_error", "", ""},
		{"openai 500", Outage{Status: 500}, ChatCompletionsPath, 500, "server_error", "", ""},
		{"not an error status", Outage{Status: 200}, MessagesPath, 500, "api_error", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.outage)
			defer srv.Close()
			resp, err := http.Post(srv.URL+tc.path, "application/json", strings.NewReader(body))
			require.NoError(t, err)
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Equal(t, tc.status, resp.StatusCode)
			assert.Equal(t, tc.retryAfter, resp.Header.Get("retry-after"))
			assert.Equal(t, tc.retryMs, resp.Header.Get("retry-after-ms"))
			var e struct {
				Error struct {
					Type string `json:"type"`
				} `json:"error"`
			}
			require.NoError(t, json.Unmarshal(b, &e), "%s", b)
			assert.Equal(t, tc.errType, e.Error.Type)
		})
	}
}

func TestOutageAnswersOtherPaths404(t *testing.T) {
	srv := httptest.NewServer(Outage{Status: 429, RetryAfter: time.Second})
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/models")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Empty(t, resp.Header.Get("retry-after"))
}
