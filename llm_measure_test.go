package egress

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egress-go/egress/internal/fakellm"
	"github.com/stretchr/testify/require"
)

// TestLLMMeasure measures a Limits against internal/fakellm (20,000
// tokens and 2,000 requests per 1-second "minute", 50 ms of latency, half
// the requests streamed; max_tokens 400, the output drawn in [100, 400]),
// 16 workers for 5 s, with LLMCost's estimate exact or off by up to ±50%,
// against each of the fake's enforcements: the provider's 429s after the
// first second and the share of its TPM used after the first window. A
// measurement, not a check (BENCHMARKS.md has its figures): run it with
//
//	EGRESS_LLM_MEASURE=1 go test -count=1 -run TestLLMMeasure -v .
//
// With EGRESS_LLM_UPFRONT=input the provider charges only the input at
// admission, and the output at the end; EGRESS_LLM_ONLY=SlidingWindow/50
// runs one case (an enforcement and the estimate's error in percent).
func TestLLMMeasure(t *testing.T) {
	if os.Getenv("EGRESS_LLM_MEASURE") == "" {
		t.Skip("a measurement: set EGRESS_LLM_MEASURE=1")
	}
	for _, errPct := range []float64{0, 0.5} {
		for _, enf := range []fakellm.Enforcement{fakellm.TokenBucket, fakellm.SlidingWindow, fakellm.FixedWindow} {
			if only := os.Getenv("EGRESS_LLM_ONLY"); only != "" && only != fmt.Sprintf("%v/%.0f", enf, 100*errPct) {
				continue
			}
			upfront := fakellm.ReserveInputAndMax
			if os.Getenv("EGRESS_LLM_UPFRONT") == "input" {
				upfront = fakellm.ReserveInput // the output charged at the end
			}
			llm, err := fakellm.New(fakellm.Config{RPM: 2000, TPM: 20000, Minute: time.Second, Latency: 50 * time.Millisecond, Enforcement: enf, Seed: 1, Upfront: upfront})
			require.NoError(t, err)
			srv := httptest.NewServer(llm)
			lim, err := NewLimits(WindowOf(Requests, 2000, time.Second), WindowOf(Tokens, 20000, time.Second))
			require.NoError(t, err)
			var mu sync.Mutex
			rng := rand.New(rand.NewPCG(1, 2))
			est := func(r *http.Request) Cost {
				c := LLMCost(r)
				mu.Lock()
				f := 1 + errPct*(2*rng.Float64()-1)
				mu.Unlock()
				c.Tokens = int(float64(c.Tokens) * f)
				return c
			}
			tr, err := New(nil, WithLimiter(lim), WithCosts(est), WithRetry(RetryPolicy{}))
			require.NoError(t, err)
			client := &http.Client{Transport: tr}
			var after, total atomic.Int64
			start := time.Now()
			tr.base = roundTripFunc(func(r *http.Request) (*http.Response, error) {
				resp, err := http.DefaultTransport.RoundTrip(r)
				if err == nil && resp.StatusCode == 429 {
					total.Add(1)
					if time.Since(start) > time.Second {
						after.Add(1)
					}
				}
				return resp, err
			})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			var wg sync.WaitGroup
			for w := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					body := []byte(fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"%s"}],"max_tokens":400,"stream":%v}`, bytes.Repeat([]byte("word "), 160), w%2 == 0))
					for ctx.Err() == nil {
						req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+fakellm.ChatCompletionsPath, bytes.NewReader(body))
						resp, err := client.Do(req)
						if err != nil {
							continue
						}
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}()
			}
			wg.Wait()
			cancel()
			st := llm.Stats()
			var toks []int
			for _, w := range st.Windows {
				toks = append(toks, w.InputTokens+w.OutputTokens)
			}
			full := toks[1:min(len(toks), 5)] // the whole windows after the first
			use := 0
			for _, v := range full {
				use += v
			}
			t.Logf("err ±%.0f%% %v: 429 total %d after 1s %d; tokens per window %v; use after first %.1f%%; peak %d/%d", errPct*100, enf, total.Load(), after.Load(), toks, 100*float64(use)/float64(20000*len(full)), st.TPM.Peak, st.TPM.Limit)
			srv.Close()
		}
	}
}
