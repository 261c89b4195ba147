package egress

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Unit tests of the learnt limits (adaptive.go): the policy's validation,
// the CUBIC maths of adaptState on explicit times, the local limiters on a
// fake clock, and the Transport's lessons against httptest servers. No test
// here sleeps.

// adpPolicy is the default policy of a 100/s limiter, as New leaves it.
var adpPolicy = AdaptivePolicy{Beta: 0.7, C: 0.4, Floor: PerSecond(10)}

// adpK is CUBIC's K for wmax with the default β and C: the time the rate
// takes to climb back to wmax after a decrease.
func adpK(wmax float64) time.Duration {
	return time.Duration(math.Cbrt(wmax*(1-0.7)/0.4) * float64(time.Second))
}

// nopLimiter is a Limiter of another package's kind: it grants everything.
type nopLimiter struct{}

func (nopLimiter) Wait(context.Context, string, int, time.Duration) (time.Duration, error) {
	return 0, nil
}

// ---- AdaptivePolicy validation ----

func TestAdaptivePolicyValidation(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		name string
		p    AdaptivePolicy
		want []string // each must appear in the error: the field and the value
	}{
		{"beta one", AdaptivePolicy{Beta: 1}, []string{"AdaptivePolicy.Beta", " 1:", "(0, 1)"}},
		{"beta above one", AdaptivePolicy{Beta: 1.5}, []string{"AdaptivePolicy.Beta", "1.5"}},
		{"negative beta", AdaptivePolicy{Beta: -0.1}, []string{"AdaptivePolicy.Beta", "-0.1"}},
		{"NaN beta", AdaptivePolicy{Beta: nan}, []string{"AdaptivePolicy.Beta", "NaN"}},
		{"negative C", AdaptivePolicy{C: -0.4}, []string{"AdaptivePolicy.C", "-0.4"}},
		{"NaN C", AdaptivePolicy{C: nan}, []string{"AdaptivePolicy.C", "NaN"}},
		{"infinite C", AdaptivePolicy{C: math.Inf(1)}, []string{"AdaptivePolicy.C", "+Inf"}},
		{"floor above configured", AdaptivePolicy{Floor: PerSecond(200)}, []string{"AdaptivePolicy.Floor", "200/s", "100/s"}},
		{"floor above configured, other unit", AdaptivePolicy{Floor: PerMinute(6001)}, []string{"AdaptivePolicy.Floor", "6001/min"}},
		{"zero floor", AdaptivePolicy{Floor: PerSecond(0)}, []string{"AdaptivePolicy.Floor", "0/s"}},
		{"negative floor", AdaptivePolicy{Floor: PerSecond(-5)}, []string{"AdaptivePolicy.Floor", "-5/s"}},
		{"NaN floor", AdaptivePolicy{Floor: PerSecond(nan)}, []string{"AdaptivePolicy.Floor", "NaN/s"}},
		{"infinite floor", AdaptivePolicy{Floor: PerSecond(math.Inf(1))}, []string{"AdaptivePolicy.Floor", "+Inf/s"}},
		{"floor without a period", AdaptivePolicy{Floor: Per(5, 0)}, []string{"AdaptivePolicy.Floor"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb, err := NewTokenBucket(PerSecond(100), 10)
			require.NoError(t, err)
			tr, err := New(nil, WithLimiter(tb), WithAdaptive(tc.p))
			require.Error(t, err)
			assert.Nil(t, tr)
			assert.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), "WithAdaptive")
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.Nil(t, tb.policy.Load(), "a refused policy must not turn adaptive mode on")
		})
	}
}

func TestAdaptivePolicyDefaults(t *testing.T) {
	for _, tc := range []struct {
		name       string
		configured Rate
		p          AdaptivePolicy
		want       AdaptivePolicy
	}{
		{"all zero", PerSecond(100), AdaptivePolicy{}, adpPolicy},
		{"beta zero is the default", PerSecond(100), AdaptivePolicy{Beta: 0, C: 1}, AdaptivePolicy{Beta: 0.7, C: 1, Floor: PerSecond(10)}},
		{"C zero is the default", PerSecond(100), AdaptivePolicy{Beta: 0.5}, AdaptivePolicy{Beta: 0.5, C: 0.4, Floor: PerSecond(10)}},
		{"floor equal to the configured rate", PerSecond(100), AdaptivePolicy{Floor: PerMinute(6000)}, AdaptivePolicy{Beta: 0.7, C: 0.4, Floor: PerMinute(6000)}},
		{"default floor keeps the unit", PerMinute(600), AdaptivePolicy{}, AdaptivePolicy{Beta: 0.7, C: 0.4, Floor: PerMinute(60)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb, err := NewTokenBucket(tc.configured, 10)
			require.NoError(t, err)
			mustNewTransport(t, nil, WithLimiter(tb), WithAdaptive(tc.p))
			got := tb.policy.Load()
			require.NotNil(t, got, "WithAdaptive turns adaptive mode on")
			assert.Equal(t, tc.want, *got)
		})
	}
}

func TestAdaptiveNeedsALimiterOfThisPackage(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
		want string
	}{
		{"custom limiter", []Option{WithLimiter(nopLimiter{}), WithAdaptive(AdaptivePolicy{})}, "egress.nopLimiter"},
		{"no limiter", []Option{WithAdaptive(AdaptivePolicy{})}, "WithAdaptive: limiter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := New(nil, tc.opts...)
			require.Error(t, err)
			assert.Nil(t, tr)
			assert.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), "WithAdaptive: limiter")
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	// A custom limiter without WithAdaptive is fine, as before: nothing to
	// learn into.
	tr := mustNewTransport(t, nil, WithLimiter(nopLimiter{}))
	assert.Nil(t, tr.adjuster)
	assert.False(t, tr.adaptive)
}

// ---- adaptState maths ----

// TestAdaptStateSteps steps one key's state through lessons and reads its
// rate at explicit times.
func TestAdaptStateSteps(t *testing.T) {
	t0 := limiterEpoch
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	p := adpPolicy
	k100 := adpK(100) // ≈ 4.217 s
	k70 := adpK(70)   // ≈ 3.743 s
	const eps = 1e-6  // float rounding of cbrt³ and of durations
	// c100 is the curve d after a decrease from wmax 100.
	c100 := func(d time.Duration) float64 { return cubic(d.Seconds(), 0.7*100, 100, 0.4) }
	type step struct { // either a lesson at `at`, or a read of the rate at `at`
		at     time.Time
		learn  *lesson
		rate   float64 // expected rate at `at` after the step
		reason string
	}
	throttle := func(sent time.Time) *lesson { return &lesson{throttled: true, sentAt: sent} }
	advertise := func(r float64) *lesson { return &lesson{advertised: r} }

	for _, tc := range []struct {
		name  string
		s     adaptState
		steps []step
	}{
		{"decrease to β·wmax, back to wmax at K, never above configured", adaptState{configured: 100, policy: &p}, []step{
			{at(0), nil, 100, "nothing learnt"},
			{at(0), throttle(at(-10 * time.Millisecond)), 70, "β·wmax"},
			{at(k100 / 2), nil, 100 - 0.4*75/8, "concave: wmax − C(K/2)³"},
			{at(k100), nil, 100, "back to wmax at K"},
			{at(2 * k100), nil, 100, "the curve goes on up, the rate stops at configured"},
		}},
		{"same episode counts once", adaptState{configured: 100, policy: &p}, []step{
			{at(time.Second), throttle(at(900 * time.Millisecond)), 70, "first throttle"},
			{at(time.Second + time.Millisecond), throttle(at(999 * time.Millisecond)), c100(time.Millisecond), "sent before the decrease: same episode, the curve goes on"},
			{at(time.Second + 2*time.Millisecond), throttle(at(time.Second)), c100(2 * time.Millisecond), "sent at the decrease: not after it"},
			{at(time.Second + 3*time.Millisecond), throttle(time.Time{}), c100(3 * time.Millisecond), "unknown send time: not after it"},
			{at(2 * time.Second), throttle(at(time.Second + 500*time.Millisecond)), 0.7 * c100(time.Second), "sent after the decrease: counts, from the rate then"},
		}},
		{"successive episodes stop at the floor", adaptState{configured: 100, policy: &p}, []step{
			{at(0), throttle(at(-1)), 70, ""},
			{at(0), throttle(at(1)), 49, "sent after (the state's clock is only read by learn)"},
			{at(0), throttle(at(2)), 34.3, ""},
			{at(0), throttle(at(3)), 24.01, ""},
			{at(0), throttle(at(4)), 16.807, ""},
			{at(0), throttle(at(5)), 11.7649, ""},
			{at(0), throttle(at(6)), 10, "β·11.76 = 8.2 is below the floor"},
			{at(0), throttle(at(7)), 10, "never below the floor"},
			{at(time.Second), nil, 10, "from wmax 10 the curve is still below the floor at 1 s"},
		}},
		{"a floor of the configured rate pins the rate", adaptState{configured: 100, policy: &AdaptivePolicy{Beta: 0.7, C: 0.4, Floor: PerSecond(100)}}, []step{
			{at(0), throttle(at(-1)), 100, ""},
		}},
		{"advertised: min with configured, forgotten after 10 min", adaptState{configured: 100}, []step{
			{at(0), advertise(50), 50, "advertised below configured"},
			{at(10*time.Minute - 1), nil, 50, "still believed"},
			{at(10 * time.Minute), nil, 100, "forgotten"},
			{at(11 * time.Minute), advertise(200), 100, "advertised above configured: configured"},
			{at(12 * time.Minute), advertise(40), 40, "heard again, lower"},
			{at(13 * time.Minute), advertise(80), 80, "heard again, higher: the provider raised it"},
			{at(23*time.Minute - 1), nil, 80, "each hearing renews the 10 min"},
			{at(23 * time.Minute), nil, 100, ""},
		}},
		{"adaptive off: throttles change nothing", adaptState{configured: 100}, []step{
			{at(0), throttle(at(-1)), 100, ""},
			{at(time.Second), throttle(at(500 * time.Millisecond)), 100, ""},
		}},
		{"a throttle under an advertised limit decreases from it", adaptState{configured: 100, policy: &p}, []step{
			{at(0), advertise(50), 50, ""},
			{at(time.Second), throttle(at(time.Second - 1)), 35, "β·50"},
			{at(time.Second + adpK(50)), nil, 50, "back to 50 at K(50)"},
			{at(time.Second + 2*adpK(50)), nil, 50, "held to the advertised limit above the curve"},
			{at(10*time.Minute + time.Second), nil, 100, "once forgotten, the curve is far above configured"},
		}},
		{"advertised and the curve: the lower wins", adaptState{configured: 100, policy: &p}, []step{
			{at(0), throttle(at(-1)), 70, ""},
			{at(0), advertise(80), 70, "the curve is lower"},
			{at(k100), nil, 80, "the curve is back at 100; the advertised 80 holds"},
		}},
		{"β applies to whatever the configured rate is", adaptState{configured: 70, policy: &p}, []step{
			{at(0), throttle(at(-1)), 49, ""},
			{at(k70), nil, 70, ""},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.s
			for i, st := range tc.steps {
				if st.learn != nil {
					s.learn(st.at, *st.learn)
				}
				assert.InDelta(t, st.rate, s.rate(st.at), eps, "step %d (%s)", i, st.reason)
			}
		})
	}
}

func TestAdaptStateCubic(t *testing.T) {
	for _, wmax := range []float64{10, 50, 100, 1000} {
		k := adpK(wmax).Seconds()
		assert.InDelta(t, 0.7*wmax, cubic(0, 0.7*wmax, wmax, 0.4), 1e-9, "β·wmax at 0, wmax %v", wmax)
		assert.InDelta(t, wmax, cubic(k, 0.7*wmax, wmax, 0.4), 1e-9, "wmax at K, wmax %v", wmax)
		assert.Greater(t, cubic(2*k, 0.7*wmax, wmax, 0.4), wmax, "above wmax after K")
		prev := cubic(0, 0.7*wmax, wmax, 0.4)
		for tt := 0.1; tt < 3*k; tt += 0.1 {
			now := cubic(tt, 0.7*wmax, wmax, 0.4)
			assert.GreaterOrEqual(t, now, prev, "monotonic at %v, wmax %v", tt, wmax)
			prev = now
		}
	}
	// The recovery times the fleet tests depend on.
	assert.InDelta(t, 4.217, adpK(100).Seconds(), 0.001)
	assert.InDelta(t, 3.347, adpK(50).Seconds(), 0.001)
}

func TestAdaptStateAtRestAndEffective(t *testing.T) {
	t0 := limiterEpoch
	configured := PerMinute(6000) // 100/s, in another unit
	assert.Equal(t, configured, effective(nil, configured, t0), "no state: the configured rate as it is")

	s := &adaptState{configured: 100, policy: &adpPolicy}
	assert.True(t, s.atRest(t0))
	assert.Equal(t, configured, effective(s, configured, t0))
	s.learn(t0, lesson{throttled: true, sentAt: t0.Add(-1)})
	assert.False(t, s.atRest(t0))
	got := effective(s, configured, t0)
	assert.InDelta(t, 70, got.PerSecond(), 1e-9)
	assert.False(t, s.atRest(t0.Add(adpK(100)-time.Millisecond)))
	assert.True(t, s.atRest(t0.Add(adpK(100)+time.Millisecond)))
	assert.Equal(t, configured, effective(s, configured, t0.Add(adpK(100)+time.Millisecond)), "recovered: the configured rate as it is")
}

func TestAdvertisedRate(t *testing.T) {
	for _, tc := range []struct {
		h    rateLimitHint
		want float64
	}{
		{rateLimitHint{Limit: 50, HasLimit: true, Window: time.Second, HasWindow: true}, 50},
		{rateLimitHint{Limit: 3000, HasLimit: true, Window: time.Minute, HasWindow: true}, 50},
		{rateLimitHint{Limit: 50, HasLimit: true}, 0},                                      // no window
		{rateLimitHint{Limit: 0, HasLimit: true, Window: time.Second, HasWindow: true}, 0}, // no limit stated
		{rateLimitHint{}, 0},
	} {
		assert.Equal(t, tc.want, advertisedRate(tc.h), "%+v", tc.h)
	}
}

// ---- the local limiters on a fake clock ----

func TestTokenBucketLearnsAnAdvertisedLimit(t *testing.T) {
	tb, fc := newTokenBucketOnFake(t, PerSecond(100), 1)
	ctx := context.Background()

	// Before: spaced 10ms.
	takeOneUnit(t, tb, "k")
	assert.Equal(t, 10*time.Millisecond, probeWouldWait(t, tb, "k"))

	old, new, err := tb.learn(ctx, "k", lesson{advertised: 50})
	require.NoError(t, err)
	assert.Equal(t, 100.0, old)
	assert.Equal(t, 50.0, new)
	assert.Equal(t, PerSecond(50), tb.EffectiveRate("k"))
	assert.Equal(t, PerSecond(100), tb.EffectiveRate("other"), "per key")

	// After: spaced 20ms.
	fc.Advance(20 * time.Millisecond)
	takeOneUnit(t, tb, "k")
	assert.Equal(t, 20*time.Millisecond, probeWouldWait(t, tb, "k"))
	fc.Advance(20 * time.Millisecond)
	takeOneUnit(t, tb, "k")
	fc.Advance(10 * time.Millisecond)
	assert.Equal(t, 10*time.Millisecond, probeWouldWait(t, tb, "k"))
	// The other key keeps the configured spacing.
	takeOneUnit(t, tb, "other")
	assert.Equal(t, 10*time.Millisecond, probeWouldWait(t, tb, "other"))

	// Heard again: no change to report.
	old, new, err = tb.learn(ctx, "k", lesson{advertised: 50})
	require.NoError(t, err)
	assert.Equal(t, old, new)

	// Forgotten after 10 minutes: the configured rate, and the key can be
	// swept again.
	fc.Advance(advertisedTTL)
	assert.Equal(t, PerSecond(100), tb.EffectiveRate("k"))
	takeOneUnit(t, tb, "k")
	assert.Equal(t, 10*time.Millisecond, probeWouldWait(t, tb, "k"))
}

func TestTokenBucketAdaptive(t *testing.T) {
	tb, fc := newTokenBucketOnFake(t, PerSecond(100), 1)
	tb.setAdaptive(adpPolicy)
	ctx := context.Background()

	t0 := fc.Now()
	old, new, err := tb.learn(ctx, "k", lesson{throttled: true, sentAt: t0.Add(-time.Millisecond)})
	require.NoError(t, err)
	assert.Equal(t, 100.0, old)
	assert.InDelta(t, 70, new, 1e-9)
	assert.InDelta(t, 70, tb.EffectiveRate("k").PerSecond(), 1e-9)

	// The same episode: nothing changes.
	fc.Advance(time.Millisecond)
	old, new, err = tb.learn(ctx, "k", lesson{throttled: true, sentAt: t0.Add(-500 * time.Microsecond)})
	require.NoError(t, err)
	assert.Equal(t, old, new, "a throttle of a request sent before the decrease counts once")

	// Spaced 1/70 s.
	takeOneUnit(t, tb, "k")
	assert.InDelta(t, float64(time.Second)/70, float64(probeWouldWait(t, tb, "k")), float64(50*time.Microsecond))

	// Climbing: at K/2 the rate is 100 − C(K/2)³ = 96.25.
	fc.Advance(adpK(100)/2 - time.Millisecond)
	assert.InDelta(t, 96.25, tb.EffectiveRate("k").PerSecond(), 0.01)

	// Back at the configured rate after K, and spaced 10ms again.
	fc.Advance(adpK(100))
	assert.Equal(t, PerSecond(100), tb.EffectiveRate("k"))
	takeOneUnit(t, tb, "k")
	assert.Equal(t, 10*time.Millisecond, probeWouldWait(t, tb, "k"))

	// Repeated episodes go down to the floor and no further.
	for i := range 10 {
		fc.Advance(time.Millisecond)
		_, _, err := tb.learn(ctx, "k", lesson{throttled: true, sentAt: fc.Now().Add(-time.Microsecond)})
		require.NoError(t, err, "episode %d", i)
	}
	assert.Equal(t, PerSecond(10), tb.EffectiveRate("k"))
}

func TestTokenBucketThrottleWithoutAdaptiveChangesNothing(t *testing.T) {
	tb, fc := newTokenBucketOnFake(t, PerSecond(100), 1)
	for range 3 {
		fc.Advance(time.Millisecond)
		old, new, err := tb.learn(context.Background(), "k", lesson{throttled: true, sentAt: fc.Now().Add(-time.Microsecond)})
		require.NoError(t, err)
		assert.Equal(t, 100.0, old)
		assert.Equal(t, 100.0, new)
	}
	assert.Equal(t, PerSecond(100), tb.EffectiveRate("k"))
	takeOneUnit(t, tb, "k")
	assert.Equal(t, 10*time.Millisecond, probeWouldWait(t, tb, "k"))
}

func TestLeakyBucketLearns(t *testing.T) {
	ctx := context.Background()
	t.Run("advertised", func(t *testing.T) {
		lb, fc := newLeakyBucketOnFake(t, PerSecond(100), 5)
		takeOneUnit(t, lb, "k")
		assert.Equal(t, 10*time.Millisecond, probeWouldWait(t, lb, "k"))

		old, new, err := lb.learn(ctx, "k", lesson{advertised: 50})
		require.NoError(t, err)
		assert.Equal(t, 100.0, old)
		assert.Equal(t, 50.0, new)
		assert.Equal(t, PerSecond(50), lb.EffectiveRate("k"))
		assert.Equal(t, PerSecond(100), lb.EffectiveRate("other"))

		fc.Advance(10 * time.Millisecond)
		takeOneUnit(t, lb, "k")
		assert.Equal(t, 20*time.Millisecond, probeWouldWait(t, lb, "k"))

		fc.Advance(20*time.Millisecond + advertisedTTL)
		assert.Equal(t, PerSecond(100), lb.EffectiveRate("k"))
		takeOneUnit(t, lb, "k")
		assert.Equal(t, 10*time.Millisecond, probeWouldWait(t, lb, "k"))
	})
	t.Run("throttled, adaptive", func(t *testing.T) {
		lb, fc := newLeakyBucketOnFake(t, PerSecond(100), 5)
		lb.setAdaptive(adpPolicy)
		old, new, err := lb.learn(ctx, "k", lesson{throttled: true, sentAt: fc.Now().Add(-1)})
		require.NoError(t, err)
		assert.Equal(t, 100.0, old)
		assert.InDelta(t, 70, new, 1e-9)
		takeOneUnit(t, lb, "k")
		assert.InDelta(t, float64(time.Second)/70, float64(probeWouldWait(t, lb, "k")), float64(time.Microsecond))

		fc.Advance(adpK(100) + time.Millisecond)
		assert.Equal(t, PerSecond(100), lb.EffectiveRate("k"))
		takeOneUnit(t, lb, "k")
		assert.Equal(t, 10*time.Millisecond, probeWouldWait(t, lb, "k"))
	})
	t.Run("throttled, adaptive off", func(t *testing.T) {
		lb, fc := newLeakyBucketOnFake(t, PerSecond(100), 5)
		old, new, err := lb.learn(ctx, "k", lesson{throttled: true, sentAt: fc.Now().Add(-1)})
		require.NoError(t, err)
		assert.Equal(t, 100.0, old)
		assert.Equal(t, 100.0, new)
		assert.Equal(t, PerSecond(100), lb.EffectiveRate("k"))
		takeOneUnit(t, lb, "k")
		assert.Equal(t, 10*time.Millisecond, probeWouldWait(t, lb, "k"))
	})
}

// ---- through the Transport ----

// rateChanges records the calls of Observer.OnRateChange.
type rateChanges struct {
	mu    sync.Mutex
	calls []rateChange
}

type rateChange struct {
	key      string
	old, new Rate
	why      string
}

func (r *rateChanges) observer() Observer {
	return Observer{OnRateChange: func(key string, old, new Rate, why string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.calls = append(r.calls, rateChange{key, old, new, why})
	}}
}

func (r *rateChanges) get() []rateChange {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]rateChange(nil), r.calls...)
}

// adpServer answers every request with status and the headers h.
func adpServer(t *testing.T, status int, h http.Header) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		for k, v := range h {
			w.Header()[k] = v
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// adpGet sends n GETs to srv through tr, one after the other, and returns
// their statuses.
func adpGet(t *testing.T, tr *Transport, srv *httptest.Server, n int) []int {
	t.Helper()
	c := &http.Client{Transport: tr}
	t.Cleanup(c.CloseIdleConnections)
	var got []int
	for range n {
		resp, err := c.Get(srv.URL + "/v1/charges")
		require.NoError(t, err)
		resp.Body.Close()
		got = append(got, resp.StatusCode)
	}
	return got
}

func adpKey(srv *httptest.Server) string { return srv.Listener.Addr().String() }

func TestAdaptiveTransportBelievesAdvertisedLimits(t *testing.T) {
	for _, tc := range []struct {
		name   string
		header http.Header
		want   float64 // the rate after; 100 for no change
	}{
		{"RateLimit-Policy", http.Header{"Ratelimit-Policy": {`"default";q=50;w=1`}}, 50},
		{"RateLimit-Policy per minute", http.Header{"Ratelimit-Policy": {`"default";q=3000;w=60`}}, 50},
		{"RateLimit-Policy with RateLimit", http.Header{"Ratelimit-Policy": {`"default";q=50;w=1`}, "Ratelimit": {`"default";r=40;t=1`}}, 50},
		{"RateLimit-Limit with a window", http.Header{"Ratelimit-Limit": {"50;w=1"}}, 50},
		{"X-RateLimit-Limit with a window", http.Header{"X-Ratelimit-Limit": {"50;w=1"}}, 50},
		{"the lowest policy wins", http.Header{"Ratelimit-Policy": {`"burst";q=100;w=1, "day";q=8640000;w=86400, "min";q=2400;w=60`}}, 40},
		{"X-RateLimit-Limit without a window", http.Header{"X-Ratelimit-Limit": {"50"}}, 100},
		{"advertised above the configured rate", http.Header{"Ratelimit-Policy": {`"default";q=200;w=1`}}, 100},
		{"no headers", http.Header{}, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := adpServer(t, http.StatusOK, tc.header)
			tb, err := NewTokenBucket(PerSecond(100), 20)
			require.NoError(t, err)
			var rec rateChanges
			tr := mustNewTransport(t, srv.Client().Transport, WithLimiter(tb), WithObserver(rec.observer()))
			for _, code := range adpGet(t, tr, srv, 5) {
				require.Equal(t, http.StatusOK, code)
			}
			key := adpKey(srv)
			if tc.want == 100 {
				assert.Empty(t, rec.get())
				assert.Equal(t, PerSecond(100), tb.EffectiveRate(key))
				return
			}
			assert.Equal(t, []rateChange{{key, PerSecond(100), PerSecond(tc.want), "advertised"}}, rec.get(),
				"one change, not one a response")
			assert.Equal(t, PerSecond(tc.want), tb.EffectiveRate(key))
		})
	}
}

func TestAdaptiveTransportLeakyBucketAdvertised(t *testing.T) {
	srv := adpServer(t, http.StatusOK, http.Header{"Ratelimit-Policy": {`"default";q=50;w=1`}})
	lb, err := NewLeakyBucket(PerSecond(1000), 20)
	require.NoError(t, err)
	var rec rateChanges
	tr := mustNewTransport(t, srv.Client().Transport, WithLimiter(lb), WithObserver(rec.observer()))
	adpGet(t, tr, srv, 1)
	assert.Equal(t, []rateChange{{adpKey(srv), PerSecond(1000), PerSecond(50), "advertised"}}, rec.get())
	assert.Equal(t, PerSecond(50), lb.EffectiveRate(adpKey(srv)))
}

func TestAdaptiveTransportWithoutAdvertisedLimits(t *testing.T) {
	srv := adpServer(t, http.StatusOK, http.Header{"Ratelimit-Policy": {`"default";q=50;w=1`}})
	tb, err := NewTokenBucket(PerSecond(100), 20)
	require.NoError(t, err)
	var rec rateChanges
	tr := mustNewTransport(t, srv.Client().Transport, WithLimiter(tb), WithoutAdvertisedLimits(), WithObserver(rec.observer()))
	adpGet(t, tr, srv, 5)
	assert.Empty(t, rec.get())
	assert.Equal(t, PerSecond(100), tb.EffectiveRate(adpKey(srv)))
}

// TestAdaptiveWithoutAdvertisedLimitsHoldsWithAdaptive: with both
// WithAdaptive and WithoutAdvertisedLimits, New sets t.adjuster for the
// adaptive mode, and learn passes the advertised limit to it whatever
// noAdvert said: the advertised limit is believed although the user turned
// that off.
func TestAdaptiveWithoutAdvertisedLimitsHoldsWithAdaptive(t *testing.T) {
	srv := adpServer(t, http.StatusOK, http.Header{"Ratelimit-Policy": {`"default";q=50;w=1`}})
	tb, err := NewTokenBucket(PerSecond(100), 20)
	require.NoError(t, err)
	var rec rateChanges
	tr := mustNewTransport(t, srv.Client().Transport, WithLimiter(tb), WithAdaptive(AdaptivePolicy{}),
		WithoutAdvertisedLimits(), WithObserver(rec.observer()))
	adpGet(t, tr, srv, 5)
	assert.Empty(t, rec.get(), "WithoutAdvertisedLimits: advertised limits must be ignored in adaptive mode too")
	assert.Equal(t, PerSecond(100), tb.EffectiveRate(adpKey(srv)))
}

// TestAdaptiveTransportOffIgnoresThrottles: without WithAdaptive, 429s
// pause the key as before and change no rate.
func TestAdaptiveTransportOffIgnoresThrottles(t *testing.T) {
	for _, shape := range limiterShapes {
		t.Run(shape.name, func(t *testing.T) {
			srv := adpServer(t, http.StatusTooManyRequests, http.Header{"Retry-After": {"0"}})
			l := shape.make(t, PerSecond(100), 20)
			var rec rateChanges
			tr := mustNewTransport(t, srv.Client().Transport, WithLimiter(l), WithObserver(rec.observer()))
			assert.Equal(t, []int{429, 429, 429, 429, 429}, adpGet(t, tr, srv, 5))
			assert.Empty(t, rec.get())
			key := adpKey(srv)
			assert.Equal(t, PerSecond(100), l.(rateAdjuster).EffectiveRate(key))
			// Nothing learnt at all: the key's state is as it was before
			// adaptive mode existed.
			switch l := l.(type) {
			case *TokenBucket:
				l.mu.RLock()
				assert.Nil(t, l.buckets.m[key].adapt)
				l.mu.RUnlock()
			case *LeakyBucket:
				l.mu.Lock()
				assert.Nil(t, l.lanes.m[key].adapt)
				l.mu.Unlock()
			}
		})
	}
}

// TestAdaptiveTransportThrottles: each throttling response to a request
// sent after the last decrease lowers the rate by β.
func TestAdaptiveTransportThrottles(t *testing.T) {
	for _, tc := range []struct {
		name      string
		status    int
		header    http.Header
		throttled bool
	}{
		{"429 with Retry-After", http.StatusTooManyRequests, http.Header{"Retry-After": {"0"}}, true},
		{"429 without Retry-After", http.StatusTooManyRequests, http.Header{}, true},
		{"503 with Retry-After", http.StatusServiceUnavailable, http.Header{"Retry-After": {"0"}}, true},
		{"503 without Retry-After", http.StatusServiceUnavailable, http.Header{}, false},
		{"500 with Retry-After", http.StatusInternalServerError, http.Header{"Retry-After": {"0"}}, false},
		{"200", http.StatusOK, http.Header{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := adpServer(t, tc.status, tc.header)
			tb, err := NewTokenBucket(PerSecond(100), 20)
			require.NoError(t, err)
			var rec rateChanges
			tr := mustNewTransport(t, srv.Client().Transport, WithLimiter(tb), WithAdaptive(AdaptivePolicy{}), WithObserver(rec.observer()))
			adpGet(t, tr, srv, 2)
			key := adpKey(srv)
			got := rec.get()
			if !tc.throttled {
				assert.Empty(t, got)
				assert.Equal(t, PerSecond(100), tb.EffectiveRate(key))
				return
			}
			// Two requests one after the other: the second was sent after
			// the first decrease, so it counts too.
			require.Len(t, got, 2)
			for i, old := range []float64{100, 70} {
				assert.Equal(t, key, got[i].key)
				assert.Equal(t, "throttled", got[i].why)
				assert.InDelta(t, old, got[i].old.PerSecond(), 0.1, "call %d old", i)
				assert.InDelta(t, 0.7*old, got[i].new.PerSecond(), 0.1, "call %d new", i)
			}
			assert.InDelta(t, 49, tb.EffectiveRate(key).PerSecond(), 1)
		})
	}
}

// TestAdaptiveTransportOneEpisodeCountsOnce: n requests in flight together
// all get 429; the rate is lowered once.
func TestAdaptiveTransportOneEpisodeCountsOnce(t *testing.T) {
	const n = 8
	var arrived atomic.Int32
	all := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if arrived.Add(1) == n {
			close(all)
		}
		select { // answer once every request is in flight
		case <-all:
		case <-time.After(10 * time.Second):
		}
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	t.Cleanup(srv.Close)
	tb, err := NewTokenBucket(PerSecond(100), n)
	require.NoError(t, err)
	var rec rateChanges
	tr := mustNewTransport(t, srv.Client().Transport, WithLimiter(tb), WithAdaptive(AdaptivePolicy{}), WithObserver(rec.observer()))
	c := &http.Client{Transport: tr}
	t.Cleanup(c.CloseIdleConnections)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.Get(srv.URL)
			if assert.NoError(t, err) {
				resp.Body.Close()
				assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
			}
		}()
	}
	wg.Wait()
	got := rec.get()
	require.Len(t, got, 1, "one overload episode, one decrease: %v", got)
	assert.Equal(t, "throttled", got[0].why)
	assert.InDelta(t, 70, got[0].new.PerSecond(), 1e-6)
}
