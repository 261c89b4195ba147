package egress

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/keyspace"
	"github.com/egress-go/egress/internal/redistest"
)

// onFakeClock returns a Redis client and a fake clock for a shared
// limiter's script test: the script takes the clock's time (onClock).
func onFakeClock(t *testing.T) (*redis.Client, *clock.Fake) {
	t.Helper()
	return redistest.Start(t).Client(t), clock.NewFake(time.Now())
}

// reserveOrdered runs one reservation call of l, on key "api.test", for
// requests of cost 1 of the turns given, and returns what the script said
// of each (code and wait).
func reserveOrdered(t *testing.T, l *shared, turns ...fleetTurn) []reserved {
	t.Helper()
	var batch []*pending
	for _, ft := range turns {
		batch = append(batch, &pending{cost: 1, turn: ft, res: make(chan reserved, 1)})
	}
	got, _, err := l.runReserve(keyspace.ID("api.test"), batch)
	require.NoError(t, err)
	for i := range got {
		got[i] = got[i].clean()
	}
	return got
}

// TestOrderInTheReserveScript: the reservation script holds a lower request
// back when its turn lies beyond the fleet's horizon, tells it when to come
// back, and gives it its turn, however far, once the higher turns given
// meanwhile have earned its level the share of one (fake clock: the script
// takes its time, so the waits are exact).
func TestOrderInTheReserveScript(t *testing.T) {
	rdb, fc := onFakeClock(t)
	l, err := NewSharedTokenBucket(rdb, "order", PerSecond(100), 1, onClock(fc), WithTransitMargin(0))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	ask := func(turns ...fleetTurn) []reserved { return reserveOrdered(t, l.shared, turns...) }
	ms := time.Millisecond
	hi, lo, off := fleetTurn{level: 2, share: 0.1, weight: 1}, fleetTurn{level: 0, share: 0.1, weight: 1}, fleetTurn{level: -1}
	waits := func(rs []reserved) (codes []int, ws []time.Duration) {
		for _, r := range rs {
			codes, ws = append(codes, r.code), append(ws, r.wait)
		}
		return codes, ws
	}

	codes, ws := waits(ask(hi, hi, lo))
	assert.Equal(t, []int{0, 0, 0}, codes, "the low one's turn is within the horizon (20 ms)")
	assert.Equal(t, []time.Duration{0, 10 * ms, 20 * ms}, ws)

	codes, ws = waits(ask(lo))
	assert.Equal(t, []int{4}, codes, "its turn, 30 ms away, is beyond it: held back")
	assert.Equal(t, []time.Duration{10 * ms}, ws, "to come back when the turn is 20 ms away")

	// Nine high turns earn the low level 0.9 of a turn: it is still held.
	codes, ws = waits(ask(hi, hi, hi, hi, hi, hi, hi, hi, hi, lo))
	assert.Equal(t, []int{0, 0, 0, 0, 0, 0, 0, 0, 0, 4}, codes)
	assert.Equal(t, 110*ms, ws[8])
	// The tenth covers it: it takes its turn, behind the ten.
	codes, ws = waits(ask(hi, lo))
	assert.Equal(t, []int{0, 0}, codes)
	assert.Equal(t, []time.Duration{120 * ms, 130 * ms}, ws)

	// A request not ordered (no priorities) is never held.
	codes, ws = waits(ask(off))
	assert.Equal(t, []int{0}, codes)
	assert.Equal(t, []time.Duration{140 * ms}, ws)

	// The level's mark ends a horizon after the turn it took on credit
	// (130 ms + 20 ms): later, its credit is gone.
	fc.Advance(151 * ms)
	codes, _ = waits(ask(hi, hi, hi, lo))
	assert.Equal(t, []int{0, 0, 0, 4}, codes, "held back, no credit banked")
}

// TestOrderInThePacersScript: a SharedLeakyBucket's turns are held back
// alike, and a request held back takes no place in its queue (fake clock).
func TestOrderInThePacersScript(t *testing.T) {
	rdb, fc := onFakeClock(t)
	l, err := NewSharedLeakyBucket(rdb, "order-pacer", PerSecond(100), 4, onClock(fc), WithTransitMargin(0))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	ask := func(ft fleetTurn) reserved { return reserveOrdered(t, l.shared, ft)[0] }
	ms := time.Millisecond
	hi, lo := fleetTurn{level: 2, share: 0.1, weight: 1}, fleetTurn{level: 0, share: 0.1, weight: 1}
	require.Equal(t, reserved{}, ask(lo))
	require.Equal(t, reserved{wait: 10 * ms}, ask(lo))
	require.Equal(t, reserved{wait: 20 * ms}, ask(lo))
	for range 3 {
		require.Equal(t, reserved{code: 4, wait: 10 * ms}, ask(lo), "30 ms away: held back, not queued")
	}
	require.Equal(t, reserved{wait: 30 * ms}, ask(hi), "the queue holds 4: the held ones took no place")
	require.Equal(t, reserved{wait: 40 * ms}, ask(hi))
	require.Equal(t, reserved{code: 2, wait: 50 * ms}, ask(hi), "full: the turns at 10 to 40 ms")
}

// TestSharesInTheReserveScript: a tenant more than a horizon's work ahead
// of another that waits (held back by the horizon) is held back in turn,
// for a horizon, and the one waiting takes the next turn (fake clock).
func TestSharesInTheReserveScript(t *testing.T) {
	rdb, fc := onFakeClock(t)
	l, err := NewSharedTokenBucket(rdb, "shares", PerSecond(100), 1, onClock(fc), WithTransitMargin(0))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	ms := time.Millisecond
	ask := func(tenant string) reserved {
		return reserveOrdered(t, l.shared, fleetTurn{level: 1, share: 0.1, tenant: tenant, weight: 1})[0]
	}
	for i := range 3 {
		require.Equal(t, reserved{code: 0, wait: time.Duration(i) * 10 * ms}, ask("A"))
	}
	require.Equal(t, reserved{code: 4, wait: 10 * ms}, ask("B"), "its turn (30 ms) beyond the horizon: B waits, 10 ms of work behind A")
	fc.Advance(10 * ms)
	require.Equal(t, reserved{code: 0, wait: 20 * ms}, ask("A"), "A, 20 ms ahead of B: not more than a horizon")
	fc.Advance(10 * ms)
	require.Equal(t, reserved{code: 0, wait: 20 * ms}, ask("A"))
	require.Equal(t, reserved{code: 4, wait: 20 * ms}, ask("A"), "A, 30 ms ahead: held back for a horizon")
	fc.Advance(10 * ms)
	require.Equal(t, reserved{code: 0, wait: 20 * ms}, ask("B"), "B takes the turn at 50 ms")
	require.Equal(t, reserved{code: 4, wait: 10 * ms}, ask("A"), "A, 20 ms ahead of B now: only the horizon holds it (its turn at 60 ms)")
}

// clean returns r without the fields a test does not compare.
func (r reserved) clean() reserved { return reserved{code: r.code, wait: r.wait} }

// TestFleetPriorities: instances flooding a shared bucket with
// low requests do not keep a high request of another instance waiting
// behind each instance's turn; they still use the whole limit, and the
// fleet sends no faster than the bucket allows (real time, on Redis).
func TestFleetPriorities(t *testing.T) {
	t.Parallel() // a loose wall-clock suite: see wallclock in the Makefile
	if testing.Short() {
		t.Skip("real time")
	}
	srv := redistest.Start(t)
	const rate, lowInstances = 50, 8
	var sent atomic.Int64
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		sent.Add(1)
		return &http.Response{StatusCode: 200, Body: http.NoBody, Request: req}, nil
	})
	instance := func(prio bool) *Transport {
		l, err := NewSharedTokenBucket(srv.Client(t), "fleet-order", PerSecond(rate), 1)
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close() })
		opts := []Option{WithLimiter(l)}
		if prio {
			opts = append(opts, WithPriorities(Priorities{}))
		}
		return mustNewTransport(t, base, opts...)
	}
	run := func(prio bool) (highWaits []time.Duration, lows int64) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var wg sync.WaitGroup
		var lowSent atomic.Int64
		for range lowInstances {
			tr := instance(prio)
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ctx.Err() == nil {
						if sendClass(ctx, tr, low) == nil {
							lowSent.Add(1)
						}
					}
				}()
			}
		}
		hiTr := instance(prio)
		time.Sleep(500 * time.Millisecond) // the flood under way
		for range 10 {
			start := time.Now()
			require.NoError(t, sendClass(context.Background(), hiTr, high))
			highWaits = append(highWaits, time.Since(start))
			time.Sleep(100 * time.Millisecond)
		}
		cancel()
		wg.Wait()
		slices.Sort(highWaits)
		return highWaits, lowSent.Load()
	}
	start := time.Now()
	before := sent.Load()
	ordered, lows := run(true)
	took := time.Since(start)
	n := sent.Load() - before
	assert.LessOrEqual(t, float64(n), rate*took.Seconds()+2, "the fleet's bound")
	assert.GreaterOrEqual(t, float64(n), 0.85*rate*took.Seconds(), "the limit used (%d low)", lows)
	plain, _ := run(false)
	t.Logf("high waits, ordered: median %v, worst %v; in arrival order: median %v, worst %v",
		ordered[len(ordered)/2], ordered[len(ordered)-1], plain[len(plain)/2], plain[len(plain)-1])
	// In arrival order it waits behind a turn of each instance (8 × 20 ms);
	// in the fleet's order, behind the horizon (20 ms) and the turn sent.
	assert.Less(t, ordered[len(ordered)/2], plain[len(plain)/2]/2, "the median high wait")
	assert.Less(t, ordered[len(ordered)/2], 80*time.Millisecond, "the median high wait")
}

// sendClass sends a GET of class c through tr.
func sendClass(ctx context.Context, tr *Transport, c Class) error {
	req, err := http.NewRequestWithContext(WithClass(ctx, c), http.MethodGet, "http://api.test/", nil)
	if err != nil {
		return err
	}
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
	}
	return err
}

// TestSharesInTheLimitsScript: SharedLimits' script keeps the fleet's
// order and shares as the token bucket's does, in the limit's own
// dimension (a request's work is its tokens over the rate): a tenant more
// than a horizon's work ahead of one that waits is held back (fake clock).
func TestSharesInTheLimitsScript(t *testing.T) {
	rdb, fc := onFakeClock(t)
	l, err := NewSharedLimits(rdb, "limits-shares", []Limit{BucketOf(Tokens, PerSecond(10_000), 1000)},
		onClock(fc), WithTransitMargin(0))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	keys := l.redisKeys("api.test")
	ms := time.Millisecond
	ask := func(tenant string, tokens int) limitsReply {
		t.Helper()
		p := &limitsPending{cost: Cost{Requests: 1, Tokens: tokens}, res: make(chan limitsReply, 1),
			turn: fleetTurn{level: 1, share: 0.1, tenant: tenant, weight: 1}}
		got, err := l.run(keys, []*limitsPending{p})
		require.NoError(t, err)
		return limitsReply{refused: got[0].refused, held: got[0].held, wait: got[0].wait}
	}
	require.Equal(t, limitsReply{}, ask("A", 1000), "the burst: A served 100 ms of work")
	require.Equal(t, limitsReply{held: true, wait: 80 * ms}, ask("B", 1000), "its turn at 100 ms: B waits, at the level's virtual time (0)")
	fc.Advance(80 * ms)
	require.Equal(t, limitsReply{held: true, wait: 20 * ms}, ask("A", 1000), "A, 100 ms of work ahead of B: held back for a horizon")
	require.Equal(t, limitsReply{wait: 20 * ms}, ask("B", 1000), "B's turn, at 100 ms")
	require.Equal(t, limitsReply{held: true, wait: 10 * ms}, ask("A", 100), "A level with B: only the horizon holds it (its turn at 110 ms)")
}
