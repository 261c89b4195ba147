package egress

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestShadowAndNearLimitOptionsValidate(t *testing.T) {
	_, err := New(nil, WithShadow(), WithRetry(RetryPolicy{}))
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "WithShadow")
	for _, r := range []float64{0, 1, -0.5, 2} {
		_, err := New(nil, WithNearLimit(r))
		require.ErrorIs(t, err, ErrInvalidConfig)
		assert.Contains(t, err.Error(), "WithNearLimit "+strconv.FormatFloat(r, 'g', -1, 64))
	}
}

// shadowLog records OnShadow calls.
type shadowLog struct {
	mu    sync.Mutex
	waits []time.Duration
	errs  []error
}

func (l *shadowLog) observer() Observer {
	return Observer{OnShadow: func(_ string, wait time.Duration, err error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.waits = append(l.waits, wait)
		l.errs = append(l.errs, err)
	}}
}

func (l *shadowLog) snapshot() ([]time.Duration, []error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]time.Duration(nil), l.waits...), append([]error(nil), l.errs...)
}

// TestShadowReportsAndSendsAtOnce: in shadow mode every request is sent at
// once; those the limiter would have delayed are reported with their wait,
// and those it would have refused with the refusal.
func TestShadowReportsAndSendsAtOnce(t *testing.T) {
	srv := newRecServer(t, nil)
	var log shadowLog
	tb, err := NewTokenBucket(PerSecond(1), 2, WithTransitMargin(0))
	require.NoError(t, err)
	tr := mustNewTransport(t, srv.base(), WithLimiter(tb), WithShadow(),
		WithMaxWait(1500*time.Millisecond), WithObserver(log.observer()))
	start := time.Now()
	for range 5 {
		mustSend200(t, tr, newPlainGet(t, context.Background(), srv.URL))
	}
	assert.Less(t, time.Since(start), 500*time.Millisecond, "nothing waits")
	assert.Equal(t, 5, srv.count())
	// The burst of 2 passes; the 3rd would have waited its turn, 1 s; the
	// 4th and 5th would have needed 2 s, beyond the maximum wait: refused,
	// and taking nothing.
	waits, errs := log.snapshot()
	require.Len(t, waits, 3)
	require.NoError(t, errs[0])
	assert.InDelta(t, 1, waits[0].Seconds(), 0.1)
	for i := 1; i < 3; i++ {
		var le *LimitError
		require.ErrorAs(t, errs[i], &le)
		assert.Equal(t, ReasonMaxWait, le.Reason)
		assert.InDelta(t, 2, waits[i].Seconds(), 0.1)
	}

	// A limiter that cannot reserve without waiting (here a LeakyBucket) is
	// asked whether capacity is there at once; a maximum wait shorter than
	// the wait: reported as a refusal.
	var strict shadowLog
	tr = mustNewTransport(t, srv.base(), WithLimiter(mustLB(t, PerSecond(1), 1)), WithShadow(),
		WithMaxWait(100*time.Millisecond), WithObserver(strict.observer()))
	mustSend200(t, tr, newPlainGet(t, context.Background(), srv.URL))
	mustSend200(t, tr, newPlainGet(t, context.Background(), srv.URL))
	waits, errs = strict.snapshot()
	require.Len(t, errs, 1)
	var le *LimitError
	require.ErrorAs(t, errs[0], &le)
	assert.Equal(t, ReasonMaxWait, le.Reason)
	assert.Greater(t, waits[0], 800*time.Millisecond)
}

// TestShadowHoldsAreReportedNotKept: a 429 with Retry-After in shadow mode
// is learnt (OnCooldown fires) but holds nothing: the next request goes at
// once and is reported as one that would have waited out the hold.
func TestShadowHoldsAreReportedNotKept(t *testing.T) {
	for _, tc := range []struct {
		name    string
		limiter func(t *testing.T) []Option
	}{
		{"learner limiter", func(t *testing.T) []Option { return []Option{WithLimiter(mustTB(t, PerSecond(100), 10))} }},
		{"no limiter", func(*testing.T) []Option { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newRecServer(t, rtyScript(rtyA(429, "Retry-After", "5"), rtyA(200)))
			var log shadowLog
			var holds []time.Time
			obs := log.observer()
			obs.OnCooldown = func(_ string, until time.Time, _ error) { holds = append(holds, until) }
			tr := mustNewTransport(t, srv.base(), append(tc.limiter(t), WithShadow(), WithObserver(obs))...)
			status, err := checkedRoundTrip(t, tr, newPlainGet(t, context.Background(), srv.URL))
			require.NoError(t, err)
			assert.Equal(t, 429, status)
			require.Len(t, holds, 1, "the hold is decided and reported")
			start := time.Now()
			mustSend200(t, tr, newPlainGet(t, context.Background(), srv.URL))
			assert.Less(t, time.Since(start), time.Second, "but not kept")
			waits, errs := log.snapshot()
			require.Len(t, waits, 1)
			require.NoError(t, errs[0])
			assert.InDelta(t, 5, waits[0].Seconds(), 0.5)
		})
	}
}

// TestShadowInFlightCap: in shadow mode a request beyond the in-flight cap
// is sent and reported with ErrTooManyInFlight; the slots held are still
// counted and freed.
func TestShadowInFlightCap(t *testing.T) {
	srv := newInFlightServer(t, 0)
	l, err := NewInFlightLimit(1)
	require.NoError(t, err)
	var log shadowLog
	tr := mustNewTransport(t, srv.pooled(t), WithInFlightLimit(l), WithShadow(), WithObserver(log.observer()))
	req := newPlainGet(t, context.Background(), srv.URL)
	first, err := tr.RoundTrip(req)
	require.NoError(t, err)
	second, err := tr.RoundTrip(newPlainGet(t, context.Background(), srv.URL))
	require.NoError(t, err, "sent although the cap is reached")
	second.Body.Close()
	_, errs := log.snapshot()
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], ErrTooManyInFlight)
	assert.Equal(t, 1, l.InFlight(srv.host()))
	first.Body.Close()
	assert.Zero(t, l.InFlight(srv.host()))
}

// TestShadowRolloutBesideEnforcing: the rollout the README describes — a
// shadow Transport with the new limit around the enforcing one with the
// old: the old limit is what is enforced, and the divergence is reported.
func TestShadowRolloutBesideEnforcing(t *testing.T) {
	srv := newRecServer(t, nil)
	old := mustNewTransport(t, srv.base(), WithLimiter(mustTB(t, PerSecond(20), 1)))
	var log shadowLog
	tr := mustNewTransport(t, old, WithLimiter(mustTB(t, PerSecond(10), 1)), WithShadow(), WithObserver(log.observer()))
	for range 6 {
		mustSend200(t, tr, newPlainGet(t, context.Background(), srv.URL))
	}
	times := srv.times()
	require.Len(t, times, 6)
	// Five gaps of 50 ms at the limiter; at the server, one arrival late on
	// a busy machine makes one gap short and the next long, so the span is
	// what is held (a gap alone came 34 ms under the race step's load).
	span := times[5].Sub(times[0])
	assert.GreaterOrEqual(t, span, 200*time.Millisecond, "the old limit (20/s) is enforced: five gaps of 50 ms")
	assert.Less(t, span, 450*time.Millisecond, "the new limit (10/s) is not: five gaps of 100 ms")
	waits, _ := log.snapshot()
	assert.NotEmpty(t, waits, "the new limit (10/s) would have delayed some")
}

// TestNearLimitFiresOncePerCrossing: OnNearLimit fires when a report falls
// below the ratio, not again while the key stays below, and again after a
// report above it; a warning without counts fires it with a zero Quota.
func TestNearLimitFiresOncePerCrossing(t *testing.T) {
	remaining := []string{"50", "15", "10", "80", "5"}
	srv := newRecServer(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n <= len(remaining) {
			w.Header().Set("X-RateLimit-Limit", "100")
			w.Header().Set("X-RateLimit-Remaining", remaining[n-1])
		} else {
			w.Header().Set("X-RateLimit-NearLimit", "true")
		}
	})
	var got []Quota
	tr := mustNewTransport(t, srv.base(), WithObserver(Observer{OnNearLimit: func(key string, q Quota) {
		assert.Equal(t, srv.host(), key)
		got = append(got, q)
	}}))
	var fired []int
	for i := 1; i <= len(remaining)+1; i++ {
		before := len(got)
		mustSend200(t, tr, newPlainGet(t, context.Background(), srv.URL))
		if len(got) > before {
			fired = append(fired, i)
		}
	}
	assert.Equal(t, []int{2, 5}, fired, "below 20% at the 2nd and, after 80 left, the 5th")
	require.Len(t, got, 2)
	assert.Equal(t, 15.0, got[0].Remaining)
	assert.Equal(t, 100.0, got[0].Limit)

	// With a ratio of 0.6 the first report (50 of 100) is already near; a
	// warning without counts after a report above fires with a zero Quota.
	srv2 := newRecServer(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			w.Header().Set("X-RateLimit-Limit", "100")
			w.Header().Set("X-RateLimit-Remaining", "90")
		} else {
			w.Header().Set("X-RateLimit-NearLimit", "true")
		}
	})
	got = nil
	tr = mustNewTransport(t, srv2.base(), WithNearLimit(0.6), WithObserver(Observer{OnNearLimit: func(_ string, q Quota) { got = append(got, q) }}))
	mustSend200(t, tr, newPlainGet(t, context.Background(), srv2.URL))
	assert.Empty(t, got)
	mustSend200(t, tr, newPlainGet(t, context.Background(), srv2.URL))
	mustSend200(t, tr, newPlainGet(t, context.Background(), srv2.URL))
	assert.Equal(t, []Quota{{}}, got)
}
