package fakeapi

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStripeShouldRetry: only a lock timeout's 429 is advised a retry; a
// refusal's 429, a 503 and a 200 pass unchanged.
func TestStripeShouldRetry(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    Config
		status int
		advice string
		body   string
	}{
		{"lock timeout", Config{Rate: 1000, Burst: 1000, Storm: Storm{Share: 1, LockTimeout: true, RetryAfter: time.Second}},
			429, "true", "lock_timeout"},
		{"storm without lock timeout", Config{Rate: 1000, Burst: 1000, Storm: Storm{Share: 1, RetryAfter: time.Second}},
			429, "", "rate_limit_error"},
		{"over the limit", Config{Rate: 0.001, Burst: 1}, 429, "", "rate_limit_error"},
		{"unavailable", Config{Rate: 1000, Burst: 1000, Unavailable: 1}, 503, "", "api_error"},
		{"accepted", Config{Rate: 1000, Burst: 1000}, 200, "", "succeeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api, err := Start(tc.cfg)
			require.NoError(t, err)
			srv := httptest.NewServer(StripeShouldRetry(api))
			tr := &http.Transport{}
			t.Cleanup(func() {
				tr.CloseIdleConnections()
				srv.Close()
				api.Close()
			})
			c := &http.Client{Transport: tr}
			form := url.Values{"amount": {"2000"}}.Encode()
			var resp *http.Response
			for range 2 { // the second spends what the first left, "over the limit"
				resp, err = c.Post(srv.URL+"/v1/charges", "application/x-www-form-urlencoded", strings.NewReader(form))
				require.NoError(t, err)
				if tc.status == 200 || resp.StatusCode == tc.status {
					break
				}
				resp.Body.Close()
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Equal(t, tc.status, resp.StatusCode)
			assert.Equal(t, tc.advice, resp.Header.Get("Stripe-Should-Retry"))
			assert.Contains(t, string(b), tc.body)
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		})
	}
}
