package egress

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/control"
	"github.com/egress-go/egress/internal/fakeapi"
	"github.com/egress-go/egress/internal/keyspace"
	"github.com/egress-go/egress/internal/redistest"
)

// Real-time scenarios of the learnt limits: a fleet of instances (each a
// separate shared limiter with its own Redis client, Transport and
// http.Client, as separate processes would have) sends charges to one
// fakeapi provider that enforces its own limit, through one real
// redis-server. Everything is measured at the provider: what it accepted,
// second by second, and how many 429s it answered.

const (
	adpInstances = 4   // instances of the fleet
	adpWorkers   = 8   // senders per instance
	adpRate      = 100 // the clients' configured rate, per second
	// adpBurst is the clients' configured burst: below the provider's
	// burst of 10, the headroom for arrival jitter. (A burst as large as the
	// provider's works too: see TestAdaptiveFleetResumesAtTheRateAfterAPause.)
	adpBurst = 5
)

// adpInstance is one instance of the fleet.
type adpInstance struct {
	lim    Limiter
	adj    interface{ EffectiveRate(key string) Rate }
	tr     *Transport
	client *http.Client
	rec    *obsRecorder
}

// adpFleet builds n instances sharing the limiter name in srv, at the
// configured rate and burst burst, each with its own Redis client and
// Transport (with WithRetry and opts).
func adpFleet(t *testing.T, srv *redistest.Server, name string, n, burst int, opts ...LimiterOption) []*adpInstance {
	t.Helper()
	var fleet []*adpInstance
	for range n {
		l := newSharedTB(t, srv.Client(t), name, PerSecond(adpRate), burst, append([]LimiterOption{WithCommandTimeout(roomyTimeout)}, opts...)...)
		fleet = append(fleet, adpNewInstance(t, l))
	}
	return fleet
}

// adpNewInstance wraps l in a Transport with WithRetry and opts.
func adpNewInstance(t *testing.T, l Limiter, opts ...Option) *adpInstance {
	t.Helper()
	rec := &obsRecorder{}
	base := &http.Transport{MaxIdleConnsPerHost: adpWorkers * 2}
	t.Cleanup(base.CloseIdleConnections) // before the provider closes
	all := append([]Option{WithLimiter(l), WithRetry(RetryPolicy{MaxAttempts: 3}), WithObserver(rec.observer())}, opts...)
	tr := mustNewTransport(t, base, all...)
	return &adpInstance{lim: l, adj: l.(interface{ EffectiveRate(key string) Rate }), tr: tr, client: &http.Client{Transport: tr}, rec: rec}
}

// adpProvider starts the fake provider; its cleanup runs after the
// instances' (registered later).
func adpProvider(t *testing.T, cfg fakeapi.Config) *fakeapi.API {
	t.Helper()
	api, err := fakeapi.Start(cfg)
	require.NoError(t, err)
	t.Cleanup(api.Close)
	return api
}

// adpRun is what a run measured.
type adpRun struct {
	start    time.Time
	d        time.Duration
	accepted []int     // at the provider, second by second from start
	limited  []int     // 429s at the provider, second by second from start
	rates    []float64 // instance 0's effective rate, each second
	stats    fakeapi.Stats
	final    map[int]int // final statuses at the clients
	refused  int         // requests the Transport refused near the end (deadline)
}

// adpEvent is something done to the provider during a run.
type adpEvent struct {
	at time.Duration
	do func()
}

// adpDrive sends charges from adpWorkers goroutines per instance for d,
// doing events on time, and measures at the provider.
func adpDrive(t *testing.T, api *fakeapi.API, fleet []*adpInstance, d time.Duration, events ...adpEvent) adpRun {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(d))
	defer cancel()
	for _, e := range events {
		tm := time.AfterFunc(e.at, e.do)
		defer tm.Stop()
	}

	// The 429s and instance 0's effective rate, sampled each second.
	var limited []int
	var rates []float64
	key := adpHostKey(api)
	monitorDone := make(chan struct{})
	go func() {
		defer close(monitorDone)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		prev := 0
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				n := api.Stats(start).Limited
				limited = append(limited, n-prev)
				prev = n
				rates = append(rates, fleet[0].adj.EffectiveRate(key).PerSecond())
			}
		}
	}()

	var mu sync.Mutex
	final := map[int]int{}
	var refused atomic.Int64
	var wg sync.WaitGroup
	const maxPerWorker = 1000 // bounds the loop whatever happens
	for _, in := range fleet {
		for range adpWorkers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range maxPerWorker {
					if ctx.Err() != nil {
						return
					}
					status, err := adpCharge(ctx, in.client, api.URL())
					switch {
					case err != nil && (errors.Is(err, ErrRateLimited) || ctx.Err() != nil):
						refused.Add(1)
						return
					case err != nil:
						t.Errorf("charge: %v", err)
						return
					}
					mu.Lock()
					final[status]++
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	<-monitorDone
	st := api.Stats(start)
	return adpRun{start: start, d: d, accepted: st.PerSecond, limited: limited, rates: rates, stats: st, final: final, refused: int(refused.Load())}
}

// adpCharge POSTs one charge and returns the final status.
func adpCharge(ctx context.Context, c *http.Client, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/charges", strings.NewReader("amount=2000&currency=usd"))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	drain(resp)
	return resp.StatusCode, nil
}

// adpSum adds up counts[from:to], clamped to the slice.
func adpSum(counts []int, from, to int) int {
	n := 0
	for i := from; i < to && i < len(counts); i++ {
		n += counts[i]
	}
	return n
}

// log reports the run second by second.
func (r adpRun) log(t *testing.T, fleet []*adpInstance, key string) {
	t.Helper()
	t.Logf("accepted/s %v", r.accepted)
	t.Logf("429/s      %v", r.limited)
	t.Logf("effective  %.1f", r.rates)
	t.Logf("total: accepted %d, 429 %d, other %d; max in any 1 s window %d; final statuses at the clients %v; refused at the end %d",
		r.stats.Accepted, r.stats.Limited, r.stats.Unavailable+r.stats.Other, r.stats.MaxPerSecond, r.final, r.refused)
	for i, in := range fleet {
		changes := in.rec.rateLog()
		desc := make([]string, 0, len(changes))
		for _, c := range changes {
			desc = append(desc, fmt.Sprintf("%.1f→%.1f %s", c.old.PerSecond(), c.new.PerSecond(), c.why))
		}
		t.Logf("instance %d: effective %v, %d rate changes %v; %s", i, in.adj.EffectiveRate(key), len(changes), desc, in.rec.summary())
		if st, ok := in.lim.(interface{ Stats() SharedStats }); ok {
			t.Logf("instance %d: %+v", i, st.Stats())
		}
	}
}

// adpHostKey is the key the Transport uses for the provider.
func adpHostKey(api *fakeapi.API) string { return strings.TrimPrefix(api.URL(), "http://") }

// adpRateKey is the Redis key of a shared limiter's learnt limit for key.
func adpRateKey(name, key string) string {
	return "egress:{" + name + ":" + keyspace.ID(key) + "}:rate"
}

// adpCheckBounds checks that no instance's effective rate is above the
// configured rate or below the default floor (a tenth of it).
func adpCheckBounds(t *testing.T, fleet []*adpInstance, r adpRun, key string) {
	t.Helper()
	for i, in := range fleet {
		got := in.adj.EffectiveRate(key).PerSecond()
		assert.LessOrEqual(t, got, float64(adpRate), "instance %d above the configured rate", i)
		assert.GreaterOrEqual(t, got, float64(adpRate)/10, "instance %d below the floor", i)
	}
	for s, got := range r.rates {
		assert.LessOrEqual(t, got, float64(adpRate), "second %d", s+1)
		assert.GreaterOrEqual(t, got, float64(adpRate)/10, "second %d", s+1)
	}
}

// ---- 1. advertised ----

// TestAdaptiveFleetAdvertised: the provider enforces 50/s and says so
// (RateLimit-Policy "default";q=50;w=1 and the rest); four instances
// configured at 100/s share a limiter. After the first response the whole
// fleet holds to 50/s: a handful of 429s at most, and at least 90% of 50/s
// accepted after the first second.
func TestAdaptiveFleetAdvertised(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	api := adpProvider(t, fakeapi.Config{Rate: 50, Burst: 10, Advertise: true})
	fleet := adpFleet(t, srv, "adv", adpInstances, adpBurst)
	const d = 10 * time.Second
	r := adpDrive(t, api, fleet, d)
	key := adpHostKey(api)
	r.log(t, fleet, key)

	// The first second sees the fleet's burst before the first response
	// comes back.
	after := adpSum(r.limited, 1, len(r.limited))
	assert.LessOrEqual(t, after, 10, "429s after the first second")
	assert.LessOrEqual(t, r.stats.Limited, 10, "429s in all")
	steady := adpSum(r.accepted, 1, int(d/time.Second))
	assert.GreaterOrEqual(t, steady, int(0.9*50*(d/time.Second-1)), "accepted after the first second")

	// Every instance holds the fleet to the advertised limit; each reports
	// the change at most once, and the fleet at least once.
	calls := 0
	for i, in := range fleet {
		assert.Equal(t, PerSecond(50), in.adj.EffectiveRate(key), "instance %d", i)
		got := in.rec.rateLog()
		assert.LessOrEqual(t, len(got), 1, "instance %d: once, not on every response: %v", i, got)
		for _, c := range got {
			assert.Equal(t, rateChange{key, PerSecond(100), PerSecond(50), "advertised"}, c)
		}
		calls += len(got)
	}
	assert.GreaterOrEqual(t, calls, 1, "OnRateChange")

	// The advertised limit lives in Redis beside the bucket, with a TTL.
	ttl, err := rdb.PTTL(context.Background(), adpRateKey("adv", key)).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, control.AdvertisedTTL-time.Minute, "TTL of the learnt limit")
	assert.LessOrEqual(t, ttl, control.AdvertisedTTL)
}

// ---- 2. adaptive, unadvertised ----

// adpCheckDiscovery checks the targets of the unadvertised scenario:
// provider 50/s, Retry-After of at least 1 s on its 429s, a 10 s run.
func adpCheckDiscovery(t *testing.T, r adpRun) {
	t.Helper()
	// "At most a few 429s per Retry-After period (≥ 1 s here) for the whole
	// fleet": 3 a second on average, 5 in any one second. Without
	// coordination it would be up to one per worker per second (32).
	assert.LessOrEqual(t, r.stats.Limited, 30, "429s in 10 s")
	for s, n := range r.limited {
		assert.LessOrEqual(t, n, 5, "429s in second %d", s+1)
	}
	last5 := adpSum(r.accepted, 5, 10)
	t.Logf("accepted over the last 5 s: %d = %.0f%% of 50/s", last5, float64(last5)/250*100)
	assert.GreaterOrEqual(t, last5, 188, "accepted over the last 5 s (target: 75%% of 50/s)")
}

// TestAdaptiveFleetDiscovers: the provider enforces 50/s without
// saying so; four instances configured at 100/s in adaptive mode: few 429s
// for the whole fleet, and at least 75% of 50/s over the last 5 s. What
// makes it: every 429 pauses the fleet for the provider's whole-second
// Retry-After, so the climb back starts when the pause ends (not during it),
// the bucket resumes at the rate rather than with its burst, and a decrease
// below the last aim lowers the aim (CUBIC's fast convergence).
func TestAdaptiveFleetDiscovers(t *testing.T) {
	srv := redistest.Start(t)
	api := adpProvider(t, fakeapi.Config{Rate: 50, Burst: 10})
	fleet := adpFleet(t, srv, "disc", adpInstances, adpBurst, WithAdaptive(AdaptivePolicy{}))
	r := adpDrive(t, api, fleet, 10*time.Second)
	key := adpHostKey(api)
	r.log(t, fleet, key)
	adpCheckBounds(t, fleet, r, key)
	adpCheckDiscovery(t, r)
}

// TestAdaptiveLocalDiscovers is the same with one instance and a
// local TokenBucket (32 senders, no Redis): the Transport-level adaptive
// mode.
func TestAdaptiveLocalDiscovers(t *testing.T) {
	api := adpProvider(t, fakeapi.Config{Rate: 50, Burst: 10})
	tb, err := NewTokenBucket(PerSecond(adpRate), adpBurst)
	require.NoError(t, err)
	in := adpNewInstance(t, tb)
	fleet := []*adpInstance{in, in, in, in} // one Transport, 4·8 senders
	r := adpDrive(t, api, fleet, 10*time.Second)
	key := adpHostKey(api)
	r.log(t, fleet[:1], key)
	adpCheckBounds(t, fleet[:1], r, key)
	adpCheckDiscovery(t, r)
}

// ---- 3. the provider changes its limit ----

// TestAdaptiveFleetFollowsLimitChanges: unadvertised, the provider enforces
// 100/s, then 40/s from 3 s, then 100/s again from 8 s. The fleet follows
// both ways within a few seconds: after the drop the 429s stop (each one
// pauses the fleet for the provider's Retry-After of at least 1 s, which is
// what the 40/s phase loses: about 55% of 40/s is accepted in its last two
// seconds); after the raise the rate climbs past the old limit along CUBIC
// from where it levelled off (about 50/s four seconds later, doubling takes
// some 5-7 s more). An advertised limit is followed at once: see
// TestAdaptiveFleetFollowsAdvertisedLimitChanges.
func TestAdaptiveFleetFollowsLimitChanges(t *testing.T) {
	srv := redistest.Start(t)
	api := adpProvider(t, fakeapi.Config{Rate: 100, Burst: 10})
	fleet := adpFleet(t, srv, "follow", adpInstances, adpBurst, WithAdaptive(AdaptivePolicy{}))
	r := adpDrive(t, api, fleet, 12*time.Second,
		adpEvent{3 * time.Second, func() { _ = api.SetRate(40) }},
		adpEvent{8 * time.Second, func() { _ = api.SetRate(100) }},
	)
	key := adpHostKey(api)
	r.log(t, fleet, key)
	adpCheckBounds(t, fleet, r, key)

	assert.GreaterOrEqual(t, adpSum(r.accepted, 0, 3), 240, "at 100/s before the drop")
	low := adpSum(r.accepted, 6, 8)
	t.Logf("accepted in [6 s, 8 s): %d = %.0f%% of 40/s", low, float64(low)/80*100)
	assert.LessOrEqual(t, adpSum(r.limited, 3, 8), 15, "429s while at 40/s: at most 3 a second")
	assert.LessOrEqual(t, adpSum(r.limited, 6, 8), 1, "down: the 429s stop within 3 s of the drop")
	assert.GreaterOrEqual(t, low, 32, "down: still sending, at 40%% of 40/s or more")
	best := 0
	for _, n := range r.accepted[min(9, len(r.accepted)):min(12, len(r.accepted))] {
		best = max(best, n)
	}
	assert.Greater(t, best, 44, "up: above the old limit (40/s) by 10%% within 4 s of the raise")
}

// TestAdaptiveFleetFollowsAdvertisedLimitChanges: the same changes, but the
// provider advertises its limit (adaptive mode on as well): the fleet
// follows at once, both ways.
func TestAdaptiveFleetFollowsAdvertisedLimitChanges(t *testing.T) {
	srv := redistest.Start(t)
	api := adpProvider(t, fakeapi.Config{Rate: 100, Burst: 10, Advertise: true})
	fleet := adpFleet(t, srv, "follow-adv", adpInstances, adpBurst, WithAdaptive(AdaptivePolicy{}))
	r := adpDrive(t, api, fleet, 8*time.Second,
		adpEvent{2 * time.Second, func() { _ = api.SetRate(40) }},
		adpEvent{5 * time.Second, func() { _ = api.SetRate(100) }},
	)
	key := adpHostKey(api)
	r.log(t, fleet, key)
	adpCheckBounds(t, fleet, r, key)

	assert.GreaterOrEqual(t, adpSum(r.accepted, 0, 2), 160, "at 100/s before the drop")
	assert.GreaterOrEqual(t, adpSum(r.accepted, 3, 5), 64, "from 1 s after the drop: at least 80%% of 40/s")
	assert.LessOrEqual(t, adpSum(r.limited, 2, 5), 6, "429s while at 40/s")
	assert.GreaterOrEqual(t, adpSum(r.accepted, 6, 8), 2*70, "above 70/s from 1 s after the raise")
}

// ---- 4. adaptive off ----

// TestAdaptiveFleetOff: with WithoutDiscovery and without advertised
// limits, 429s change no rate: EffectiveRate stays the configured 100/s on
// every instance, no OnRateChange, and nothing is written to Redis beside
// the bucket. (The throughput is logged: it is what it was before adaptive
// mode existed.)
func TestAdaptiveFleetOff(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	api := adpProvider(t, fakeapi.Config{Rate: 50, Burst: 10})
	fleet := adpFleet(t, srv, "off", adpInstances, adpBurst, WithoutDiscovery())
	r := adpDrive(t, api, fleet, 3*time.Second)
	key := adpHostKey(api)
	r.log(t, fleet, key)

	require.Positive(t, r.stats.Limited, "the provider did throttle")
	for i, in := range fleet {
		assert.Equal(t, PerSecond(adpRate), in.adj.EffectiveRate(key), "instance %d", i)
		assert.Empty(t, in.rec.rateLog(), "instance %d: OnRateChange", i)
	}
	for s, got := range r.rates {
		assert.Equal(t, float64(adpRate), got, "second %d", s+1)
	}
	n, err := rdb.HExists(context.Background(), adpRateKey("off", key), fieldWmax).Result()
	require.NoError(t, err)
	assert.False(t, n, "no discovered limit in Redis")
}

// ---- pauses and bursts ----

// TestAdaptiveFleetResumesAtTheRateAfterAPause is
// TestAdaptiveFleetAdvertised with the clients' burst equal to the
// provider's (10). The provider states its remaining quota and reset in
// whole seconds: once its bucket is empty it answers RateLimit:
// "default";r=0;t=1, which pauses the fleet for 1 s. Were the shared bucket
// full when the pause ends, it would send its 10 at once, empty the provider
// again, and settle at 10 requests a second; the pause empties the bucket as
// of its end (control.lua), so the fleet resumes at the rate.
//
// The rate is measured from the third second: the pause (whole seconds,
// t=1) begins when the first bucket empties, anywhere in the first half
// second, and may reach well into the second one on a loaded machine.
// A fleet that settled at 10 a second would send about 30 in those three
// seconds.
func TestAdaptiveFleetResumesAtTheRateAfterAPause(t *testing.T) {
	srv := redistest.Start(t)
	api := adpProvider(t, fakeapi.Config{Rate: 50, Burst: 10, Advertise: true})
	fleet := adpFleet(t, srv, "collapse", adpInstances, 10)
	r := adpDrive(t, api, fleet, 5*time.Second)
	r.log(t, fleet, adpHostKey(api))
	got := adpSum(r.accepted, 2, 5)
	assert.GreaterOrEqual(t, got, 135, "accepted in seconds 3 to 5: at least 90%% of 50/s")
	assert.LessOrEqual(t, adpSum(r.limited, 1, 5), 1, "429s after the first second: the pause is obeyed, not repeated")
}

// ---- shared limiters: the rate in the script replies ----

// TestAdaptiveSharedSlowRateStaysShared: the scripts return the key's rate
// at full precision, so a rate as slow as 10 a day is not mistaken for a
// malformed reply (which would send every Wait to the fallback).
func TestAdaptiveSharedSlowRateStaysShared(t *testing.T) {
	srv := redistest.Start(t)
	l := newSharedTB(t, srv.Client(t), "slow", Per(10, 24*time.Hour), 1, WithCommandTimeout(roomyTimeout))
	_, err := l.Wait(context.Background(), "k", 1, 0)
	require.NoError(t, err)
	st := l.Stats()
	assert.False(t, st.Fallback, "Redis is up: no fallback")
	assert.EqualValues(t, 1, st.Admitted, "admitted through Redis")
	assert.Equal(t, Per(10, 24*time.Hour), l.EffectiveRate("k"))
}

// TestAdaptiveSharedEffectiveRateIsExact: with nothing learnt, a shared
// limiter at 100/min reports exactly its configured rate (the script
// replies carry the rate at full precision, not rounded).
func TestAdaptiveSharedEffectiveRateIsExact(t *testing.T) {
	srv := redistest.Start(t)
	l := newSharedTB(t, srv.Client(t), "round", PerMinute(100), 5, WithCommandTimeout(roomyTimeout))
	_, err := l.Wait(context.Background(), "k", 1, 0)
	require.NoError(t, err)
	assert.Equal(t, PerMinute(100), l.EffectiveRate("k"), "nothing learnt: the configured rate")
}

// TestAdaptiveFleetHeldAndLoweredResumesAtTheNewRate: a throttle that
// holds a key and lowers its rate (by beta, 100/s to 70/s) leaves the
// token bucket empty as of the hold's end at the new rate, not at the
// old: the requests waiting go a unit of 70/s apart from there. (The
// fleet's bucket was emptied at the old rate's unit before the decrease:
// nine units of 100/s, a burst of four at 70/s went at the hold's end,
// and after a decrease to 34/s, of six; a provider with a burst of five
// refused the sixth.)
func TestAdaptiveFleetHeldAndLoweredResumesAtTheNewRate(t *testing.T) {
	limiters := map[string]func(t *testing.T) Limiter{
		"TokenBucket": func(t *testing.T) Limiter {
			return mustTB(t, PerSecond(100), 10, WithTransitMargin(0))
		},
		"SharedTokenBucket": func(t *testing.T) Limiter {
			return newSharedTB(t, redistest.Start(t).Client(t), "lowered", PerSecond(100), 10,
				WithCommandTimeout(roomyTimeout), WithTransitMargin(0))
		},
	}
	for name, newLimiter := range limiters {
		t.Run(name, func(t *testing.T) {
			l := newLimiter(t)
			const key, waiters = "api.example.com", 6
			now := time.Now()
			d := l.(Learner).Learn(context.Background(), key, Signal{
				Status: http.StatusTooManyRequests, Now: now, SentAt: now.Add(-time.Millisecond),
				RetryAfter: time.Second, HasRetryAfter: true,
			})
			require.False(t, d.Hold.IsZero(), "the throttle holds the key: %+v", d)
			require.InDelta(t, 70, d.New.PerSecond(), 0.5, "and lowers it by beta: %+v", d)
			wait, _ := startWaiters(t, l, key, waiters)
			done := wait()
			unit := time.Second / 70
			var offs []time.Duration
			for _, at := range done {
				offs = append(offs, at.Sub(d.Hold).Round(time.Millisecond))
			}
			t.Logf("after the hold's end: %v (a unit at 70/s: %v)", offs, unit)
			// Waiters may wake late, each alone: the span, not each gap
			// (71 ms; 32 ms when four went at once).
			assert.GreaterOrEqual(t, done[waiters-1].Sub(done[0]), time.Duration(float64(waiters-1)*0.6*float64(unit)),
				"%d requests after the hold go a unit of the new rate apart", waiters)
		})
	}
}
