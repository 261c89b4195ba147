package sdk

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-github/v75/github"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress"
	"github.com/egress-go/egress/internal/fakeapi"
)

// newGitHub returns a go-github client as a user makes one, its HTTP
// client hc, against the fake at u.
func newGitHub(t *testing.T, u string, hc *http.Client, disableCheck bool) *github.Client {
	t.Helper()
	c := github.NewClient(hc)
	base, err := url.Parse(u + "/")
	require.NoError(t, err)
	c.BaseURL = base
	c.DisableRateLimitCheck = disableCheck
	return c
}

// TestGitHubWindow: go-github over egress, against a GitHub-style fixed
// window (20 requests per 2 s, x-ratelimit-* on every response, 403 with
// remaining 0 as its refusal), egress configured ten times above it (a
// TokenBucket of 100/s), 4 workers for 4 s, each call with a 3 s deadline.
// go-github retries nothing; it keeps the last count it saw and, by
// default, fails every call at once with a *github.RateLimitError while
// that count says 0 — before egress, which holds the key until the reset
// and would have sent the call then. With DisableRateLimitCheck egress
// decides: every call goes, within its deadline, and the provider refuses
// at most the calls in flight when the window ran out.
func TestGitHubWindow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		disableCheck bool
	}{
		{"go-github's own check", false},
		{"DisableRateLimitCheck", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api, err := fakeapi.Start(fakeapi.Config{Dialect: fakeapi.GitHub, Limits: []fakeapi.Limit{fakeapi.Fixed(20, 2*time.Second)}})
			require.NoError(t, err)
			t.Cleanup(api.Close)
			p := serve(t, api)
			tb, err := egress.NewTokenBucket(egress.PerSecond(100), 10)
			require.NoError(t, err)
			gh := newGitHub(t, p.url, egressClient(t, egress.WithLimiter(tb), egress.WithRetry(egress.RetryPolicy{})), tc.disableCheck)

			var ok, ghRefused, egressRefused, other atomic.Int32
			var mu sync.Mutex
			var others []error
			stop := time.Now().Add(4 * time.Second)
			var wg sync.WaitGroup
			for w := range 4 {
				wg.Go(func() {
					for i := 0; time.Now().Before(stop); i++ {
						ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
						req, err := gh.NewRequest(http.MethodGet, fmt.Sprintf("users/w%d-%d", w, i), nil)
						if err == nil {
							_, err = gh.Do(ctx, req, nil)
						}
						cancel()
						var rle *github.RateLimitError
						switch {
						case err == nil:
							ok.Add(1)
						case errors.Is(err, egress.ErrRateLimited):
							egressRefused.Add(1)
						case errors.As(err, &rle):
							ghRefused.Add(1)
							time.Sleep(10 * time.Millisecond) // a caller that moves on, not a spin
						default:
							other.Add(1)
							mu.Lock()
							others = append(others, err)
							mu.Unlock()
						}
					}
				})
			}
			wg.Wait()
			refusedAtProvider := 0
			for _, h := range p.recorded() {
				if h.status == http.StatusForbidden || h.status == http.StatusTooManyRequests {
					refusedAtProvider++
				}
			}
			t.Logf("%s: %d calls done, %d refused by go-github's own check, %d refused by egress, %d other errors %v; "+
				"at the provider %d attempts, %d refused",
				tc.name, ok.Load(), ghRefused.Load(), egressRefused.Load(), other.Load(), others, len(p.recorded()), refusedAtProvider)
			assert.Zero(t, other.Load(), "no call fails for anything but a limit")
			assert.LessOrEqual(t, refusedAtProvider, 4, "the provider refuses at most the calls in flight when a window ran out")
			if tc.disableCheck {
				assert.Zero(t, ghRefused.Load())
				assert.Zero(t, egressRefused.Load(), "every call's wait fits its deadline")
				assert.GreaterOrEqual(t, ok.Load(), int32(30), "more than a whole window")
			}
		})
	}
}
