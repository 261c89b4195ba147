package egress

import (
	"context"
	"testing"
	"time"

	"github.com/egress-go/egress/internal/clock"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newLimitsOnFake(t testing.TB, limits ...Limit) (*Limits, *clock.Fake) {
	l, err := NewLimits(limits...)
	require.NoError(t, err)
	fc := clock.NewFake(limiterEpoch)
	l.clock = fc
	l.margin = 0 // the step tables count exact windows; TestLimitsWindowMargin has the margin
	return l, fc
}

func TestNewLimitsValidates(t *testing.T) {
	for _, tc := range []struct {
		limits []Limit
		want   string
	}{
		{nil, "NewLimits: limits none"},
		{[]Limit{WindowOf(Requests, 0, time.Second)}, "NewLimits: limit 0 (requests): n 0"},
		{[]Limit{BucketOf(Requests, PerSecond(1), 1), WindowOf(Tokens, 10, 0)}, "NewLimits: limit 1 (tokens): window 0s"},
		{[]Limit{BucketOf(Tokens, PerSecond(0), 1)}, "NewLimits: limit 0 (tokens): rate"},
		{[]Limit{BucketOf(Requests, PerSecond(1), 0)}, "NewLimits: limit 0 (requests): burst 0"},
		{[]Limit{{}}, "NewLimits: limit 0 (requests): rate"},
		{[]Limit{WindowOf(Dimension(9), 1, time.Second)}, "dimension 9"},
	} {
		_, err := NewLimits(tc.limits...)
		require.ErrorIs(t, err, ErrInvalidConfig)
		assert.Contains(t, err.Error(), tc.want)
	}
}

// TestLimitParentNil: a limit whose parent was set to nil is refused when
// the limits are made, naming the limit, the option and the value, rather
// than read as one limit per key; a limit without Parent, or with a parent,
// is accepted. NewSharedLimits refuses the same (it does not contact
// Redis to do so).
func TestLimitParentNil(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	t.Cleanup(func() { _ = rdb.Close() })
	for _, tc := range []struct {
		name   string
		limits []Limit
		want   string // "": accepted
	}{
		{"window", []Limit{WindowOf(Requests, 2, time.Second).Parent(nil)}, "limit 0 (requests): Parent nil"},
		{"bucket", []Limit{BucketOf(Requests, PerSecond(1), 1), BucketOf(Tokens, PerSecond(10), 10).Parent(nil)}, "limit 1 (tokens): Parent nil"},
		{"reset to nil", []Limit{WindowOf(Requests, 2, time.Second).Parent(HostOf).Parent(nil)}, "limit 0 (requests): Parent nil"},
		{"no parent", []Limit{WindowOf(Requests, 2, time.Second)}, ""},
		{"a parent", []Limit{WindowOf(Requests, 2, time.Second).Parent(HostOf)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewLimits(tc.limits...)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), "NewLimits: "+tc.want)
			_, serr := NewSharedLimits(rdb, "a", tc.limits)
			require.ErrorIs(t, serr, ErrInvalidConfig)
			assert.Contains(t, serr.Error(), "NewSharedLimits: "+tc.want)
		})
	}
}

// reserveIn reserves cost on l and returns the wait for the turn.
func reserveIn(t *testing.T, l *Limits, key string, cost Cost, b budget) (time.Duration, Grant, error) {
	t.Helper()
	g, now, err := l.reserve(key, cost, b)
	if err != nil {
		return 0, g, err
	}
	return g.At.Sub(now), g, nil
}

// TestLimitsAllOrNothing: 2 requests and 100 tokens per second, as windows.
// A request goes when both have room; one refused takes nothing from
// either; a cost of 0 tokens takes none.
func TestLimitsAllOrNothing(t *testing.T) {
	l, fc := newLimitsOnFake(t, WindowOf(Requests, 2, time.Second), WindowOf(Tokens, 100, time.Second))
	steps := []struct {
		advance time.Duration
		cost    Cost
		b       budget
		wait    time.Duration
		refused bool
	}{
		{0, Cost{Requests: 1, Tokens: 80}, budget{}, 0, false},
		// the tokens bind: 80 + 30 > 100 until the first leaves at 1 s
		{100 * time.Millisecond, Cost{Requests: 1, Tokens: 30}, budget{maxWait: 500 * time.Millisecond}, 900 * time.Millisecond, true},
		// refused took nothing: 20 tokens still fit, and a second request
		{0, Cost{Requests: 1, Tokens: 20}, budget{}, 0, false},
		// now the requests bind (2 in the window), not the tokens
		{0, Cost{Requests: 1}, budget{}, 900 * time.Millisecond, false},
		// a request costing 0 in every dimension goes at once
		{0, Cost{}, budget{}, 0, false},
	}
	for i, st := range steps {
		fc.Advance(st.advance)
		d, _, err := reserveIn(t, l, "k", st.cost, st.b)
		if st.refused {
			var le *LimitError
			require.ErrorAs(t, err, &le, "step %d", i)
			assert.Equal(t, ReasonMaxWait, le.Reason, "step %d", i)
			assert.Equal(t, st.wait, le.Wait, "step %d: the wait needed", i)
			assert.Equal(t, 30, le.Cost, "step %d: the cost of the binding limit", i)
			continue
		}
		require.NoError(t, err, "step %d", i)
		assert.Equal(t, st.wait, d, "step %d", i)
	}
	_, _, err := reserveIn(t, l, "k", Cost{Requests: 1, Tokens: 101}, budget{})
	assert.ErrorIs(t, err, ErrCostTooHigh, "more tokens than the window holds")
}

// TestLimitsBucketAndWindow: a bucket of 10/s burst 2 under a window of 3
// per second. The bucket's burst goes at once, the window then caps the
// third second's grants at 3 even though the bucket would give more.
func TestLimitsBucketAndWindow(t *testing.T) {
	l, _ := newLimitsOnFake(t, BucketOf(Requests, PerSecond(10), 2), WindowOf(Requests, 3, time.Second))
	var waits []time.Duration
	for range 5 {
		d, _, err := reserveIn(t, l, "k", Cost{Requests: 1}, budget{})
		require.NoError(t, err)
		waits = append(waits, d)
	}
	ms := time.Millisecond
	assert.Equal(t, []time.Duration{0, 0, 100 * ms, 1000 * ms, 1000 * ms}, waits,
		"2 at once (the burst), 1 a unit later (the bucket), then the window's: the 4th when the 1st leaves; the 5th with the 2nd")
}

// TestLimitsParentKey: 2 per second per route, 3 per second for the host.
// The routes share the host's window, which gives its turns in order of
// arrival, whichever route asks.
func TestLimitsParentKey(t *testing.T) {
	l, _ := newLimitsOnFake(t, WindowOf(Requests, 2, time.Second), WindowOf(Requests, 3, time.Second).Parent(HostOf))
	one := Cost{Requests: 1}
	for i, st := range []struct {
		key  string
		wait time.Duration
	}{
		{"h/a", 0}, {"h/a", 0},
		{"h/a", time.Second},     // its route's 2 are spent: it takes the host's 3rd at 1 s
		{"h/b", time.Second},     // a window gives turns in order: after the one at 1 s
		{"h/b", time.Second},     // its route's 2nd, the host's 3rd in (0, 1 s]
		{"h/c", 2 * time.Second}, // the host's 3 are spent until 2 s
	} {
		d, _, err := reserveIn(t, l, st.key, one, budget{})
		require.NoError(t, err)
		assert.Equal(t, st.wait, d, "step %d: %s", i, st.key)
	}
	assert.Equal(t, "h", HostOf("h/v1/customers/{id}"))
	assert.Equal(t, "h", HostOf("h"))
}

// TestLimitsCancelGivesBack: a waiter whose context ends gives back its
// turn in every limit: the next request takes the same turn.
func TestLimitsCancelGivesBack(t *testing.T) {
	l, fc := newLimitsOnFake(t, BucketOf(Requests, PerSecond(10), 1), WindowOf(Tokens, 50, time.Second))
	_, _, err := reserveIn(t, l, "k", Cost{Requests: 1, Tokens: 50}, budget{})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := l.WaitCost(ctx, "k", Cost{Requests: 1, Tokens: 10}, 0)
		done <- err
	}()
	fc.WaitTimers(1)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)

	d, _, err := reserveIn(t, l, "k", Cost{Requests: 1, Tokens: 10}, budget{})
	require.NoError(t, err)
	assert.Equal(t, time.Second, d, "the cancelled waiter's turn, given back, is the next one's")
	d, _, err = reserveIn(t, l, "k", Cost{Requests: 1}, budget{})
	require.NoError(t, err)
	assert.Equal(t, time.Second+100*time.Millisecond, d, "the bucket's unit of the cancelled waiter is back too")
}

// TestLimitsSettle: an estimate of 40 tokens settled at 10 refunds 30 to
// the window at its turn; settled at 60, charges 20 more; a grant whose
// turn has left the window settles nothing; a bucket refunds no further
// than full.
func TestLimitsSettle(t *testing.T) {
	l, fc := newLimitsOnFake(t, WindowOf(Tokens, 100, time.Second))
	est := Cost{Requests: 1, Tokens: 40}
	_, g1, err := reserveIn(t, l, "k", est, budget{})
	require.NoError(t, err)
	_, g2, err := reserveIn(t, l, "k", est, budget{})
	require.NoError(t, err)
	l.Settle(g1, Cost{Requests: 1, Tokens: 10})
	l.Settle(g2, Cost{Requests: 1, Tokens: 60})
	d, _, err := reserveIn(t, l, "k", Cost{Tokens: 30}, budget{})
	require.NoError(t, err)
	assert.Zero(t, d, "10 + 60 + 30 fit in 100")
	d, _, err = reserveIn(t, l, "k", Cost{Tokens: 1}, budget{})
	require.NoError(t, err)
	assert.Equal(t, time.Second, d, "full: the next token waits for the first grants to leave")

	fc.Advance(2 * time.Second)
	l.Settle(g1, Cost{Tokens: 0})   // a refund of a turn long gone: nothing
	l.Settle(g2, Cost{Tokens: 100}) // a charge of one long gone: its 60 more count from now
	d, _, err = reserveIn(t, l, "k", Cost{Tokens: 40}, budget{})
	require.NoError(t, err)
	assert.Zero(t, d)
	d, _, err = reserveIn(t, l, "k", Cost{Tokens: 1}, budget{})
	require.NoError(t, err)
	assert.Equal(t, time.Second, d)

	b, _ := newLimitsOnFake(t, BucketOf(Tokens, PerSecond(100), 100))
	_, g, err := reserveIn(t, b, "k", Cost{Tokens: 10}, budget{})
	require.NoError(t, err)
	b.Settle(g, Cost{Tokens: 0})
	b.Settle(g, Cost{Tokens: 0}) // a second refund is not more capacity: the bucket is full
	_, _, err = reserveIn(t, b, "k", Cost{Tokens: 100}, budget{})
	require.NoError(t, err)
	d, _, err = reserveIn(t, b, "k", Cost{Tokens: 1}, budget{})
	require.NoError(t, err)
	assert.Equal(t, 10*time.Millisecond, d, "a full burst taken, then one unit")

	// a charge counts as at most the limit's capacity: a hostile usage
	// of a billion tokens parks the key one bucket's refill at most.
	b.Settle(g, Cost{Tokens: 1 << 30})
	d, _, err = reserveIn(t, b, "k", Cost{Tokens: 1}, budget{})
	require.NoError(t, err)
	assert.LessOrEqual(t, d, 1100*time.Millisecond)
}

// TestLimitsSettleChargesUncountedDimension: tokens not estimated (0) are
// charged when the response tells them, at the request's turn.
func TestLimitsSettleChargesUncountedDimension(t *testing.T) {
	l, fc := newLimitsOnFake(t, WindowOf(Requests, 10, time.Second), WindowOf(Tokens, 100, time.Second))
	_, g, err := reserveIn(t, l, "k", Cost{Requests: 1}, budget{})
	require.NoError(t, err)
	fc.Advance(300 * time.Millisecond)
	l.Settle(g, Cost{Requests: 1, Tokens: 90})
	d, _, err := reserveIn(t, l, "k", Cost{Requests: 1, Tokens: 20}, budget{})
	require.NoError(t, err)
	assert.Equal(t, 700*time.Millisecond, d, "the 90 tokens count from the first request's turn")
}

func TestLimitsWaitCostRefusesNegative(t *testing.T) {
	l, _ := newLimitsOnFake(t, WindowOf(Tokens, 10, time.Second))
	_, err := l.WaitCost(context.Background(), "k", Cost{Requests: 1, Tokens: -1}, 0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cost -1 in tokens is negative")
	w, err := l.Wait(context.Background(), "k", 1, 0)
	require.NoError(t, err)
	assert.Zero(t, w, "Wait counts requests; the limits on tokens take nothing")
}

// TestLimitsLearn: a Limits holds a key on a Retry-After as a Transport
// would, and a provider's count caps the room of its dimension's limits:
// tokens until the provider's reset, requests less those in flight.
func TestLimitsLearn(t *testing.T) {
	ctx := context.Background()
	l, fc := newLimitsOnFake(t, BucketOf(Requests, PerSecond(10), 10), WindowOf(Tokens, 1000, time.Minute))
	now := fc.Now()
	d := l.Learn(ctx, "k", Signal{Now: now, SentAt: now, Status: 429, RetryAfter: 2 * time.Second, HasRetryAfter: true})
	assert.Equal(t, now.Add(2*time.Second), d.Hold, "a Retry-After holds the key")
	w, _, err := reserveIn(t, l, "k", Cost{Requests: 1, Tokens: 100}, budget{})
	require.NoError(t, err)
	assert.Equal(t, 2*time.Second, w, "nothing goes before the hold ends")
	_, _, err = reserveIn(t, l, "k", Cost{Requests: 1}, budget{maxWait: time.Second})
	assert.ErrorIs(t, err, ErrRateLimited, "a wait longer than the max wait is refused at once")
	fc.Advance(2 * time.Second)

	// 100 tokens granted; the provider says 50 remain, back in 30 s.
	now = fc.Now()
	l.Learn(ctx, "k", Signal{Now: now, SentAt: now, Status: 200, Quotas: []Quota{
		{Dimension: Tokens, Remaining: 50, HasRemaining: true, Reset: 30 * time.Second, HasReset: true},
	}})
	w, _, err = reserveIn(t, l, "k", Cost{Requests: 1, Tokens: 50}, budget{})
	require.NoError(t, err)
	assert.Zero(t, w, "the 50 that remain")
	w, _, err = reserveIn(t, l, "k", Cost{Requests: 1, Tokens: 10}, budget{})
	require.NoError(t, err)
	assert.Equal(t, 30*time.Second, w, "then nothing until the provider's reset")

	// 5 requests remain at the provider, 3 are in flight: 2 go at once.
	r, fc := newLimitsOnFake(t, BucketOf(Requests, PerSecond(10), 10))
	now = fc.Now()
	r.Learn(ctx, "k", Signal{Now: now, SentAt: now, Status: 200, InFlight: 3, Quotas: []Quota{
		{Dimension: Requests, Remaining: 5, HasRemaining: true},
	}})
	var waits []time.Duration
	for range 3 {
		w, _, err := reserveIn(t, r, "k", Cost{Requests: 1}, budget{})
		require.NoError(t, err)
		waits = append(waits, w)
	}
	assert.Equal(t, []time.Duration{0, 0, 100 * time.Millisecond}, waits)
}

// TestLimitsWindowMargin: a window's unit comes back 5 ms after its grant
// leaves the window.
func TestLimitsWindowMargin(t *testing.T) {
	l, err := NewLimits(WindowOf(Requests, 1, time.Second))
	require.NoError(t, err)
	l.clock = clock.NewFake(limiterEpoch)
	_, _, err = reserveIn(t, l, "k", Cost{Requests: 1}, budget{})
	require.NoError(t, err)
	d, _, err := reserveIn(t, l, "k", Cost{Requests: 1}, budget{})
	require.NoError(t, err)
	assert.Equal(t, time.Second+5*time.Millisecond, d)
}

// TestLimitsLearnBucketRefills: a bucket provider's count comes back as
// it refills: the excess over its remaining leaves the window in parts
// until its reset, not all at once.
func TestLimitsLearnBucketRefills(t *testing.T) {
	l, fc := newLimitsOnFake(t, WindowOf(Tokens, 800, time.Second))
	now := fc.Now()
	l.Learn(context.Background(), "k", Signal{Now: now, SentAt: now, Status: 200, Quotas: []Quota{
		{Dimension: Tokens, Remaining: 0, HasRemaining: true, Reset: 800 * time.Millisecond, HasReset: true, Kind: ResetKindBucket},
	}})
	d, _, err := reserveIn(t, l, "k", Cost{Tokens: 100}, budget{})
	require.NoError(t, err)
	assert.Equal(t, 100*time.Millisecond, d, "an eighth of the excess is back an eighth of the reset later")
	d, _, err = reserveIn(t, l, "k", Cost{Tokens: 700}, budget{})
	require.NoError(t, err)
	assert.Equal(t, 800*time.Millisecond, d, "the whole of it at the reset")
}

// TestLimitsReviewCases: a window's cap holds until the provider's reset
// even when the grants it counted leave first; a stream that outlasts its
// window is charged from its end; a refund into a key's state made after
// the grant gives nothing back; a window's n must fit its log.
func TestLimitsReviewCases(t *testing.T) {
	ctx := context.Background()
	t.Run("cap until reset", func(t *testing.T) {
		l, fc := newLimitsOnFake(t, WindowOf(Tokens, 1000, time.Minute))
		_, _, err := reserveIn(t, l, "k", Cost{Tokens: 900}, budget{})
		require.NoError(t, err)
		fc.Advance(55 * time.Second)
		now := fc.Now()
		l.Learn(ctx, "k", Signal{Now: now, SentAt: now, Status: 200, Quotas: []Quota{
			{Dimension: Tokens, Remaining: 100, HasRemaining: true, Reset: 30 * time.Second, HasReset: true},
		}})
		fc.Advance(6 * time.Second) // the 900 have left the window
		d, _, err := reserveIn(t, l, "k", Cost{Tokens: 500}, budget{})
		require.NoError(t, err)
		assert.Equal(t, 24*time.Second, d, "the provider said 100 until its reset")
	})
	t.Run("stream longer than its window", func(t *testing.T) {
		l, fc := newLimitsOnFake(t, WindowOf(OutputTokens, 1000, time.Minute))
		_, g, err := reserveIn(t, l, "k", Cost{Requests: 1}, budget{})
		require.NoError(t, err)
		fc.Advance(2 * time.Minute)
		l.Settle(g, Cost{Requests: 1, OutputTokens: 800})
		d, _, err := reserveIn(t, l, "k", Cost{OutputTokens: 500}, budget{})
		require.NoError(t, err)
		assert.Equal(t, time.Minute, d, "its 800 count from its end")
	})
	t.Run("refund into a state made after", func(t *testing.T) {
		l, fc := newLimitsOnFake(t, BucketOf(Tokens, PerMinute(1000), 1000))
		_, g, err := reserveIn(t, l, "k", Cost{Tokens: 500}, budget{})
		require.NoError(t, err)
		fc.Advance(90 * time.Second)
		l.mu.Lock()
		l.states[0].Sweep(fc.Now()) // the key at rest is dropped
		l.mu.Unlock()
		now := fc.Now()
		l.Learn(ctx, "k", Signal{Now: now, SentAt: now, Status: 200, Quotas: []Quota{
			{Dimension: Tokens, Remaining: 0, HasRemaining: true},
		}})
		l.Settle(g, Cost{Tokens: 100})
		d, _, err := reserveIn(t, l, "k", Cost{Tokens: 1000}, budget{})
		require.NoError(t, err)
		assert.Equal(t, time.Minute, d, "the provider's 0 stands")
	})
	_, err := NewLimits(WindowOf(Tokens, 3_000_000_000, time.Hour))
	assert.ErrorIs(t, err, ErrInvalidConfig)
}

// TestLimitsLearnHugeCount: a count beyond any limit caps nothing.
func TestLimitsLearnHugeCount(t *testing.T) {
	l, fc := newLimitsOnFake(t, WindowOf(Tokens, 1000, time.Minute), BucketOf(Tokens, PerSecond(10), 10))
	now := fc.Now()
	l.Learn(context.Background(), "k", Signal{Now: now, SentAt: now, Status: 200, Quotas: []Quota{
		{Dimension: Tokens, Remaining: 1e300, HasRemaining: true, Reset: time.Second, HasReset: true},
	}})
	d, _, err := reserveIn(t, l, "k", Cost{Tokens: 10}, budget{})
	require.NoError(t, err)
	assert.Zero(t, d)
}

// TestLimitsRefundMovesWaitersSooner: two requests wait behind one whose
// estimate (80) fills the window; when it settles at 20, both go at once,
// in their order; a waiter that also counts in a bucket is not moved.
func TestLimitsRefundMovesWaitersSooner(t *testing.T) {
	l, fc := newLimitsOnFake(t, WindowOf(Tokens, 100, time.Second))
	_, g, err := reserveIn(t, l, "k", Cost{Tokens: 80}, budget{})
	require.NoError(t, err)
	var res []<-chan waited
	for i, c := range []int{50, 30} {
		res = append(res, waitCostAsync(context.Background(), l, "k", Cost{Tokens: c}))
		fc.WaitTimers(i + 1) // in this order
	}
	fc.Advance(100 * time.Millisecond)
	l.Settle(g, Cost{Tokens: 20})
	for _, ch := range res {
		r := recvWithin(t, ch)
		require.NoError(t, r.err)
		assert.Equal(t, 100*time.Millisecond, r.g.Waited, "both go once the refund makes room")
		assert.Equal(t, fc.Now(), r.g.At)
	}
	// The window holds 20 + 50 + 30 at their new turns: full until the first leaves.
	d, _, err := reserveIn(t, l, "k", Cost{Tokens: 20}, budget{})
	require.NoError(t, err)
	assert.Equal(t, 900*time.Millisecond, d)

	// A waiter that counts in a bucket keeps its turn.
	b, fc := newLimitsOnFake(t, WindowOf(Tokens, 100, time.Second), BucketOf(Requests, PerSecond(100), 10))
	_, g, err = reserveIn(t, b, "k", Cost{Requests: 1, Tokens: 80}, budget{})
	require.NoError(t, err)
	late := waitCostAsync(context.Background(), b, "k", Cost{Requests: 1, Tokens: 50})
	fc.WaitTimers(1)
	fc.Advance(100 * time.Millisecond)
	b.Settle(g, Cost{Requests: 1, Tokens: 20})
	fc.Advance(900 * time.Millisecond)
	r := recvWithin(t, late)
	require.NoError(t, r.err)
	assert.Equal(t, time.Second, r.g.Waited)
}

// TestLimitsCancelledWaiterHoldsNoOneBack: a waiter that leaves gives its
// turn back, and its empty turn does not keep the waiters before it from
// moving sooner.
func TestLimitsCancelledWaiterHoldsNoOneBack(t *testing.T) {
	l, fc := newLimitsOnFake(t, WindowOf(Requests, 1, time.Second))
	_, a, err := reserveIn(t, l, "k", Cost{Requests: 1}, budget{})
	require.NoError(t, err)
	b := waitCostAsync(context.Background(), l, "k", Cost{Requests: 1})
	fc.WaitTimers(1)
	ctx, cancel := context.WithCancel(context.Background())
	c := waitCostAsync(ctx, l, "k", Cost{Requests: 1})
	fc.WaitTimers(2)
	cancel()
	require.ErrorIs(t, recvWithin(t, c).err, context.Canceled)
	fc.Advance(100 * time.Millisecond)
	l.Settle(a, Cost{}) // the first request is refused by the provider: it cost nothing
	r := recvWithin(t, b)
	require.NoError(t, r.err)
	assert.Equal(t, 100*time.Millisecond, r.g.Waited, "B goes now, not after C's empty turn")
}

// TestLimitsBucketMargin: a bucket keeps its transit margin of refill in
// reserve as far as the burst left after a request allows: of a burst of
// 5 at 10/s, four go at once and the fifth 5 ms later, then one each
// 100 ms (the rate is not lowered); a request of the whole burst keeps
// none.
func TestLimitsBucketMargin(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		name  string
		costs []int
		turns []time.Duration
	}{
		{"units", []int{1, 1, 1, 1, 1, 1, 1}, []time.Duration{0, 0, 0, 0, 5 * ms, 105 * ms, 205 * ms}},
		{"the whole burst", []int{5, 5}, []time.Duration{0, 500 * ms}},
		{"most of it, then the rest", []int{4, 1}, []time.Duration{0, 5 * ms}},
		{"most of it, then most again", []int{4, 4}, []time.Duration{0, 305 * ms}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, fc := newLimitsOnFake(t, BucketOf(Requests, PerSecond(10), 5))
			l.margin = 5 * ms
			start := fc.Now()
			for i, c := range tc.costs {
				g, _, err := l.reserve("k", Cost{Requests: c}, budget{})
				require.NoError(t, err)
				require.Equal(t, tc.turns[i], g.At.Sub(start), "request %d", i)
			}
		})
	}
}
