package egress

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/fakellm"
	"github.com/egress-go/egress/internal/redistest"
)

// TestRealTimeLLM: a fleet calls internal/fakellm (OpenAI's rule: a token
// bucket of 20,000 tokens and 2,000 requests per 1-second "minute", that
// reserves input + max_tokens up front) through Limits in one process, and
// through SharedLimits in two instances on one Redis, with LLMCost settled
// from the usage. After the first second the provider refuses almost
// nothing, and the fleet uses most of the binding limit (BENCHMARKS.md §8
// has the figures; the bounds here hold on a loaded 2-core machine under
// -race).
func TestRealTimeLLM(t *testing.T) {
	t.Parallel() // a loose wall-clock suite: see wallclock in the Makefile
	newLimits := func() []Limit {
		return []Limit{WindowOf(Requests, 2000, time.Second), WindowOf(Tokens, 20000, time.Second)}
	}
	t.Run("Limits", func(t *testing.T) {
		lim, err := NewLimits(newLimits()...)
		require.NoError(t, err)
		llmRun(t, []CostLimiter{lim, lim})
	})
	t.Run("SharedLimits", func(t *testing.T) {
		srv := redistest.Start(t)
		a := newSharedLimits(t, srv.Client(t), "llm", newLimits())
		b := newSharedLimits(t, srv.Client(t), "llm", newLimits())
		llmRun(t, []CostLimiter{a, b})
		assert.False(t, a.Stats().Fallback || b.Stats().Fallback)
	})
}

// llmRun runs 6 workers per limiter (one Transport each) for 3 s against a
// fresh provider and checks its 429s after the first second and its use of
// the TPM in the whole windows after the first.
func llmRun(t *testing.T, limiters []CostLimiter) {
	llm, err := fakellm.New(fakellm.Config{RPM: 2000, TPM: 20000, Minute: time.Second, Latency: 30 * time.Millisecond, Seed: 1})
	require.NoError(t, err)
	srv := httptest.NewServer(llm)
	defer srv.Close()
	var late, failed atomic.Int64
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i, lim := range limiters {
		base := http.DefaultTransport.(*http.Transport).Clone()
		defer base.CloseIdleConnections()
		probe := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := base.RoundTrip(r)
			if err == nil && resp.StatusCode == http.StatusTooManyRequests && time.Since(start) > time.Second {
				late.Add(1)
			}
			return resp, err
		})
		tr, err := New(probe, WithLimiter(lim), WithCosts(LLMCost), WithRetry(RetryPolicy{}))
		require.NoError(t, err)
		client := &http.Client{Transport: tr}
		for w := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				body := []byte(fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"%s"}],"max_tokens":400,"stream":%v}`,
					bytes.Repeat([]byte("word "), 160), (i+w)%2 == 0))
				for ctx.Err() == nil {
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+fakellm.ChatCompletionsPath, bytes.NewReader(body))
					resp, err := client.Do(req)
					var le *LimitError
					if errors.As(err, &le) && le.Reason == ReasonDeadline {
						return // its turn comes after the run's end
					}
					if err != nil {
						if ctx.Err() == nil && failed.Add(1) == 1 {
							t.Logf("first failure: %v", err)
						}
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						failed.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	st := llm.Stats()
	var toks []int
	for _, w := range st.Windows {
		toks = append(toks, w.InputTokens+w.OutputTokens)
	}
	require.GreaterOrEqual(t, len(toks), 3, "windows %v", toks)
	whole := toks[1:3] // the whole windows after the first
	used := 0
	for _, v := range whole {
		used += v
	}
	use := float64(used) / float64(20000*len(whole))
	t.Logf("429s after 1 s: %d; failed: %d; tokens per window %v; use %.1f%%", late.Load(), failed.Load(), toks, 100*use)
	assert.LessOrEqual(t, late.Load(), int64(2), "429s after the first second")
	assert.Zero(t, failed.Load(), "calls that did not end in a 200")
	assert.GreaterOrEqual(t, use, 0.75, "use of the TPM after the first window")
}
