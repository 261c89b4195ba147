package egress

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/fakeapi"
)

// TestRealTimeDialects: for each provider dialect the fake API speaks, a
// client configured ten times above the provider's limit, sending from 8
// goroutines, hears the provider's headers and holds to its limit: some
// refusals at first, then within the limit while using most of it. The
// refusals (0–22 in a run; the log says when each came) are those of the
// first burst, sent before any answer, and of discovery for the bucket
// dialects that state no rate. The requests in flight count against the
// remaining quota (Signal.InFlight), but with 20 goroutines and 100 ms of
// provider latency the dialects still take 17–46 refusals in 3 s: the
// promise of "a couple" is not met yet.
func TestRealTimeDialects(t *testing.T) {
	realTimeDialects(t, 8, time.Millisecond, 3*time.Second)
}

func realTimeDialects(t *testing.T, workers int, latency, duration time.Duration) {
	for _, tc := range []struct {
		dialect fakeapi.Dialect
		limit   fakeapi.Limit
		perSec  float64 // the limit's sustained rate
	}{
		{fakeapi.IETF, fakeapi.Bucket(20, 5), 20},
		{fakeapi.IETFDraft, fakeapi.Bucket(20, 5), 20},
		{fakeapi.GitHub, fakeapi.Fixed(20, time.Second), 20},
		{fakeapi.Okta, fakeapi.Fixed(20, time.Second), 20},
		{fakeapi.OpenAI, fakeapi.Bucket(20, 5), 20},
		{fakeapi.AzureOpenAI, fakeapi.Bucket(20, 5), 20},
		{fakeapi.Anthropic, fakeapi.Bucket(20, 5), 20},
		{fakeapi.Reddit, fakeapi.Fixed(20, time.Second), 20},
		{fakeapi.Discord, fakeapi.Fixed(20, time.Second), 20},
		{fakeapi.Shopify, fakeapi.Bucket(20, 40), 20},
		{fakeapi.Jira, fakeapi.Fixed(20, time.Second), 20},
		{fakeapi.Salesforce, fakeapi.Fixed(20, time.Second), 20},
		{fakeapi.HubSpot, fakeapi.Fixed(20, time.Second), 20},
		{fakeapi.Zendesk, fakeapi.Fixed(20, time.Second), 20},
	} {
		t.Run(tc.dialect.String(), func(t *testing.T) {
			api, err := fakeapi.Start(fakeapi.Config{Limits: []fakeapi.Limit{tc.limit}, Dialect: tc.dialect, Advertise: true, Latency: latency})
			require.NoError(t, err)
			t.Cleanup(api.Close)
			base := &http.Transport{MaxIdleConnsPerHost: workers}
			t.Cleanup(base.CloseIdleConnections)
			tr := mustNewTransport(t, base, WithLimiter(mustTB(t, PerSecond(10*tc.perSec), 10)))
			c := &http.Client{Transport: tr}
			start := time.Now()
			ctx, cancel := context.WithDeadline(context.Background(), start.Add(duration))
			defer cancel()
			var refused atomic.Int64
			var refusedMu sync.Mutex
			var refusedAt []time.Duration
			var wg sync.WaitGroup
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := 0; n < 10_000 && ctx.Err() == nil; n++ {
						req, _ := http.NewRequestWithContext(ctx, http.MethodGet, api.URL()+"/v1/x", nil)
						resp, err := c.Do(req)
						if err != nil {
							continue
						}
						resp.Body.Close()
						if resp.StatusCode != http.StatusOK {
							refused.Add(1)
							refusedMu.Lock()
							refusedAt = append(refusedAt, time.Since(start).Round(time.Millisecond))
							refusedMu.Unlock()
						}
					}
				}()
			}
			wg.Wait()
			st := api.Stats(start)
			after := 0
			for _, n := range st.PerSecond[1:min(len(st.PerSecond), 3)] {
				after += n
			}
			t.Logf("%v, %d workers: accepted per second %v, refused %d at %v", tc.dialect, workers, st.PerSecond, refused.Load(), refusedAt)
			assert.LessOrEqual(t, refused.Load(), int64(25), "some refusals at first, not one a request")
			assert.GreaterOrEqual(t, float64(after), 0.6*2*tc.perSec, "most of the limit after the first second")
			assert.LessOrEqual(t, st.MaxPerSecond, int(tc.perSec)+int(tc.limit.Quota)+2, "within the limit")
		})
	}
}
