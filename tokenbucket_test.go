package egress

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/time/rate"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/keyed"
)

// tbStep is one request in a limiter step table. Times are offsets from
// limiterEpoch; the fake clock is moved to at before the request.
type tbStep struct {
	at         time.Duration
	key        string // "k" when empty
	cost       int
	maxWait    time.Duration
	deadline   time.Duration // offset from limiterEpoch; 0 for none
	wantDelay  time.Duration // the wait granted
	wantReason Reason        // 0 when the request is granted
	wantWait   time.Duration // the LimitError's Wait
}

func (s tbStep) budget() budget {
	b := budget{maxWait: s.maxWait}
	if s.deadline != 0 {
		b.deadline = limiterEpoch.Add(s.deadline)
	}
	return b
}

func (s tbStep) keyOr() string {
	if s.key == "" {
		return "k"
	}
	return s.key
}

// tbCheckRefusal checks err against a step that wants a refusal.
func tbCheckRefusal(t *testing.T, i int, s tbStep, err error) {
	t.Helper()
	require.Error(t, err, "step %d", i)
	var le *LimitError
	require.ErrorAs(t, err, &le, "step %d", i)
	assert.ErrorIs(t, err, ErrRateLimited, "step %d", i)
	assert.Equal(t, s.wantReason, le.Reason, "step %d", i)
	assert.Equal(t, s.wantWait, le.Wait, "step %d: the wait it would have needed", i)
	assert.Equal(t, s.keyOr(), le.Key, "step %d", i)
	assert.Equal(t, s.cost, le.Cost, "step %d", i)
}

func TestTokenBucketSteps(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rate  Rate
		burst int
		steps []tbStep
	}{
		{
			name: "burst at once, then spaced 1/R", rate: PerSecond(4), burst: 3,
			steps: []tbStep{
				{at: 0, cost: 1},
				{at: 0, cost: 1},
				{at: 0, cost: 1},
				{at: 0, cost: 1, wantDelay: 250 * time.Millisecond},
				{at: 0, cost: 1, wantDelay: 500 * time.Millisecond},
				{at: 0, cost: 1, wantDelay: 750 * time.Millisecond},
				{at: 750 * time.Millisecond, cost: 1, wantDelay: 250 * time.Millisecond},
				{at: 1250 * time.Millisecond, cost: 1, wantDelay: 0}, // exactly one token back
				{at: 1250 * time.Millisecond, cost: 1, wantDelay: 250 * time.Millisecond},
			},
		},
		{
			name: "refill is capped at the burst", rate: PerSecond(4), burst: 3,
			steps: []tbStep{
				{at: 0, cost: 3},
				{at: time.Hour, cost: 1},
				{at: time.Hour, cost: 1},
				{at: time.Hour, cost: 1},
				{at: time.Hour, cost: 1, wantDelay: 250 * time.Millisecond},
			},
		},
		{
			name: "cost above 1", rate: PerSecond(2), burst: 4,
			steps: []tbStep{
				{at: 0, cost: 3},
				{at: 0, cost: 2, wantDelay: 500 * time.Millisecond},
				{at: 500 * time.Millisecond, cost: 4, wantDelay: 2 * time.Second},
				{at: 2500 * time.Millisecond, cost: 1, wantDelay: 500 * time.Millisecond},
				{at: 10 * time.Second, cost: 4},
			},
		},
		{
			name: "max wait: refused at once with the wait, takes nothing", rate: PerSecond(4), burst: 1,
			steps: []tbStep{
				{at: 0, cost: 1},
				{at: 0, cost: 1, maxWait: 249 * time.Millisecond, wantReason: ReasonMaxWait, wantWait: 250 * time.Millisecond},
				{at: 0, cost: 1, maxWait: 100 * time.Millisecond, wantReason: ReasonMaxWait, wantWait: 250 * time.Millisecond},
				// The refused ones took nothing: this one is not pushed back.
				{at: 0, cost: 1, maxWait: 250 * time.Millisecond, wantDelay: 250 * time.Millisecond},
				{at: 100 * time.Millisecond, cost: 1, maxWait: 300 * time.Millisecond, wantReason: ReasonMaxWait, wantWait: 400 * time.Millisecond},
				{at: 100 * time.Millisecond, cost: 1, wantDelay: 400 * time.Millisecond},
			},
		},
		{
			name: "deadline: refused at once with the wait, takes nothing", rate: PerSecond(4), burst: 2,
			steps: []tbStep{
				{at: 0, cost: 2},
				{at: 0, cost: 2, deadline: 499 * time.Millisecond, wantReason: ReasonDeadline, wantWait: 500 * time.Millisecond},
				{at: 0, cost: 1, deadline: 250 * time.Millisecond, wantDelay: 250 * time.Millisecond}, // exactly at the deadline fits
				{at: 0, cost: 1, deadline: 250 * time.Millisecond, wantReason: ReasonDeadline, wantWait: 500 * time.Millisecond},
				{at: 0, cost: 1, deadline: time.Second, wantDelay: 500 * time.Millisecond},
				// Both limits broken: max wait is reported first.
				{at: 0, cost: 1, maxWait: time.Millisecond, deadline: time.Millisecond, wantReason: ReasonMaxWait, wantWait: 750 * time.Millisecond},
			},
		},
		{
			name: "keys are independent", rate: PerSecond(1), burst: 1,
			steps: []tbStep{
				{at: 0, key: "a", cost: 1},
				{at: 0, key: "a", cost: 1, wantDelay: time.Second},
				{at: 0, key: "b", cost: 1},
				{at: 0, key: "c", cost: 1},
				{at: 0, key: "b", cost: 1, wantDelay: time.Second},
				{at: 0, key: "a", cost: 1, wantDelay: 2 * time.Second},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb, fc := newTokenBucketOnFake(t, tc.rate, tc.burst)
			for i, s := range tc.steps {
				limAdvanceTo(fc, limiterEpoch.Add(s.at))
				g, err := tb.reserve(s.keyOr(), s.cost, s.budget())
				r, delay := g.r, g.delay
				if s.wantReason != 0 {
					tbCheckRefusal(t, i, s, err)
					assert.Nil(t, r, "step %d", i)
					continue
				}
				require.NoError(t, err, "step %d", i)
				assert.Equal(t, s.wantDelay, delay, "step %d", i)
				assert.Equal(t, s.wantDelay == 0, r == nil, "step %d: a reservation only when there is a wait", i)
			}
		})
	}
}

type limWaitResult struct {
	i      int
	waited time.Duration
	err    error
}

func TestTokenBucketWaitBlocksUntilAdvance(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent()) // every waiter has returned
	tb, fc := newTokenBucketOnFake(t, PerSecond(1), 1)
	ctx := context.Background()
	d, err := tb.Wait(ctx, "k", 1, 0)
	require.NoError(t, err)
	require.Zero(t, d)

	done := make(chan limWaitResult, 1)
	go func() {
		d, err := tb.Wait(ctx, "k", 1, 0)
		done <- limWaitResult{waited: d, err: err}
	}()
	waitTimers(t, fc, 1) // parked on its timer

	fc.Advance(999 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("returned %v before its time", r)
	default:
	}
	assert.Equal(t, 1, fc.Timers())

	fc.Advance(time.Millisecond)
	r := recvWithin(t, done)
	require.NoError(t, r.err)
	assert.Equal(t, time.Second, r.waited)

	// Another key was never held up.
	d, err = tb.Wait(ctx, "other", 1, 0)
	require.NoError(t, err)
	assert.Zero(t, d)
}

func TestTokenBucketWaitCancelGivesTokensBack(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent()) // every waiter has returned
	for _, tc := range []struct {
		name      string
		cancelAt  time.Duration // when the waiter is cancelled
		wantDelay time.Duration // the delay of the next request, made then
	}{
		{"cancelled at once", 0, time.Second},
		{"cancelled half way", 500 * time.Millisecond, 500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb, fc := newTokenBucketOnFake(t, PerSecond(1), 1)
			_, err := tb.Wait(context.Background(), "k", 1, 0)
			require.NoError(t, err)

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan limWaitResult, 1)
			go func() {
				d, err := tb.Wait(ctx, "k", 1, 0)
				done <- limWaitResult{waited: d, err: err}
			}()
			waitTimers(t, fc, 1)
			fc.Advance(tc.cancelAt)
			cancel()
			r := recvWithin(t, done)
			assert.Same(t, context.Canceled, r.err)
			assert.Zero(t, r.waited)
			assert.Zero(t, fc.Timers(), "its timer is stopped")

			// Its token is back: the next request waits only for the first
			// one's refill, as if the cancelled one had never come.
			delay, err := delayOf(tb.reserve("k", 1, budget{}))
			require.NoError(t, err)
			assert.Equal(t, tc.wantDelay, delay)
		})
	}
}

// TestTokenBucketRaiseKeepsTurnsApart: a step of the climb back raises a
// key's rate while a queue of turns is owed; the next turn comes a unit
// at the new rate after the last one given, not a fraction of a unit (the
// part of a token the raise leaves owed, see setRate, counts). Two turns
// 2 ms apart at 75/s met a provider with no burst, which refused the
// second.
func TestTokenBucketRaiseKeepsTurnsApart(t *testing.T) {
	tb, _ := newTokenBucketOnFake(t, PerSecond(100), 1)
	var last time.Duration
	for range 20 {
		d, err := delayOf(tb.reserve("k", 1, budget{}))
		require.NoError(t, err)
		last = d
	}
	require.Equal(t, 190*time.Millisecond, last, "19 turns owed, 10 ms apart")
	tb.mu.RLock()
	bk := tb.buckets.M["k"]
	bk.lock()
	bk.setRate(tb.clock.Now(), rate.Limit(101)) // 19 owed × 1%: a fifth of a token owed
	bk.unlock()
	tb.mu.RUnlock()
	next, err := delayOf(tb.reserve("k", 1, budget{}))
	require.NoError(t, err)
	assert.InDelta(t, float64(time.Second/101), float64(next-last), float64(50*time.Microsecond),
		"a unit at 101/s after the last turn: %v", next-last)
}

func TestTokenBucketWaitersInOrder(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent()) // every waiter has returned
	tb, fc := newTokenBucketOnFake(t, PerSecond(10), 1)
	ctx := context.Background()
	_, err := tb.Wait(ctx, "k", 1, 0)
	require.NoError(t, err)

	const n = 5
	done := make(chan limWaitResult, n)
	for i := range n {
		go func() {
			d, err := tb.Wait(ctx, "k", 1, 0)
			done <- limWaitResult{i: i, waited: d, err: err}
		}()
		waitTimers(t, fc, i+1) // i+1 parked: arrival order is i
	}
	interval := PerSecond(10).Interval()
	for i := range n {
		fc.Advance(interval)
		r := recvWithin(t, done)
		require.NoError(t, r.err)
		assert.Equal(t, i, r.i, "served in order of arrival")
		assert.Equal(t, time.Duration(i+1)*interval, r.waited)
	}
}

func TestTokenBucketEviction(t *testing.T) {
	// burst 2, one token a minute: an empty bucket takes two minutes to be
	// full again.
	tb, _ := newTokenBucketOnFake(t, Every(time.Minute), 2)
	fc := tb.clock.(*clock.Fake)
	held := func() []string {
		tb.mu.RLock()
		defer tb.mu.RUnlock()
		var keys []string
		for k := range tb.buckets.M {
			keys = append(keys, k)
		}
		return keys
	}
	for i, s := range []struct {
		at        time.Duration
		key       string
		cost      int
		wantDelay time.Duration
		wantHeld  []string
	}{
		{at: 0, key: "a", cost: 2, wantHeld: []string{"a"}},
		{at: 0, key: "b", cost: 1, wantHeld: []string{"a", "b"}},
		// A sweep is due: b is full again and dropped, a is not (one token).
		{at: time.Minute, key: "c", cost: 1, wantHeld: []string{"a", "c"}},
		// No sweep for another minute, whatever is full.
		{at: 90 * time.Second, key: "d", cost: 1, wantHeld: []string{"a", "c", "d"}},
		{at: 119 * time.Second, key: "a", cost: 1, wantHeld: []string{"a", "c", "d"}},
		// The sweep at 2m: c is full; a is not (it just spent a token); d
		// has 1.5 tokens. A sweep runs on an existing key's call too.
		{at: 2 * time.Minute, key: "d", cost: 1, wantHeld: []string{"a", "d"}},
		// A dropped key comes back with a full bucket, exactly the bucket it
		// would have had: b was full, and it gets 2, then waits.
		{at: 2 * time.Minute, key: "b", cost: 2, wantHeld: []string{"a", "b", "d"}},
		{at: 2 * time.Minute, key: "b", cost: 1, wantDelay: time.Minute, wantHeld: []string{"a", "b", "d"}},
		// Much later, everything is full and the sweep drops all but the
		// key asking.
		{at: time.Hour, key: "e", cost: 1, wantHeld: []string{"e"}},
	} {
		limAdvanceTo(fc, limiterEpoch.Add(s.at))
		delay, err := delayOf(tb.reserve(s.key, s.cost, budget{}))
		require.NoError(t, err, "step %d", i)
		assert.Equal(t, s.wantDelay, delay, "step %d", i)
		assert.ElementsMatch(t, s.wantHeld, held(), "step %d", i)
	}
}

func TestTokenBucketPendingReservationKeepsBucket(t *testing.T) {
	// A bucket with a waiter in it is never full, so never dropped, however
	// many sweeps run while the waiter waits.
	tb, fc := newTokenBucketOnFake(t, Every(time.Hour), 1)
	_, err := delayOf(tb.reserve("k", 1, budget{}))
	require.NoError(t, err)
	delay, err := delayOf(tb.reserve("k", 1, budget{}))
	require.NoError(t, err)
	require.Equal(t, time.Hour, delay)
	for range 10 {
		fc.Advance(keyed.SweepEvery)
		_, err := delayOf(tb.reserve("other", 1, budget{})) // runs the sweep
		require.NoError(t, err)
		tb.mu.RLock()
		_, ok := tb.buckets.M["k"]
		tb.mu.RUnlock()
		require.True(t, ok, "the bucket with a pending reservation is kept")
	}
	// The reservation is honoured: the next one queues behind it.
	delay, err = delayOf(tb.reserve("k", 1, budget{}))
	require.NoError(t, err)
	assert.Equal(t, 2*time.Hour-10*keyed.SweepEvery, delay)
}

// TestTokenBucketDroppedBucketIsNotHot: a key's bucket granted last, then
// dropped by a sweep that another key's call ran, is not granted from
// again: the key's grants come from its bucket in the map, which holds
// what the key learnt since.
func TestTokenBucketDroppedBucketIsNotHot(t *testing.T) {
	tb, fc := newTokenBucketOnFake(t, PerSecond(10), 5)
	tb.buckets.Every = time.Second
	d, err := delayOf(tb.reserve("a", 1, budget{}))
	require.NoError(t, err)
	require.Zero(t, d)
	fc.Advance(2 * time.Second) // a at rest, and a sweep due
	tb.Learn(context.Background(), "b", Signal{Now: fc.Now(), Status: http.StatusOK})
	require.NotContains(t, tb.buckets.M, "a", "b's call swept a")
	tb.Learn(context.Background(), "a", Signal{Now: fc.Now(), SentAt: fc.Now(), Status: http.StatusTooManyRequests, RetryAfter: 10 * time.Second, HasRetryAfter: true, MaxWait: time.Hour})
	d, err = delayOf(tb.reserve("a", 1, budget{maxWait: time.Minute}))
	require.NoError(t, err)
	assert.Equal(t, 10*time.Second, d, "a's grant ignored the hold it learnt")
}

func TestTokenBucketEvictionIsInvisible(t *testing.T) {
	// The same requests through a bucket that sweeps on every call and one
	// that never sweeps get the same answers: a dropped bucket never lets
	// an extra request through, nor holds one back.
	sweeping, fcS := newTokenBucketOnFake(t, PerSecond(3), 4)
	sweeping.buckets.Every = time.Nanosecond
	keeping, fcK := newTokenBucketOnFake(t, PerSecond(3), 4)
	keeping.buckets.Every = 1 << 62

	gaps := []time.Duration{0, 0, 0, 0, 0, 100 * time.Millisecond, 2 * time.Second, 333 * time.Millisecond, 0, time.Minute, 1, 0, 0, 0, 0, 0, 5 * time.Second}
	keys := []string{"a", "a", "b"} // (a key granted twice in a row takes the bucket granted last: see reserveAt)
	for i := range 200 {
		gap := gaps[i%len(gaps)]
		fcS.Advance(gap)
		fcK.Advance(gap)
		key, cost := keys[i%3], 1+i%4
		d1, err1 := delayOf(sweeping.reserve(key, cost, budget{maxWait: time.Second}))
		d2, err2 := delayOf(keeping.reserve(key, cost, budget{maxWait: time.Second}))
		require.Equal(t, err2, err1, "request %d", i)
		require.Equal(t, d2, d1, "request %d", i)
	}
	assert.Less(t, sweeping.buckets.Peak, 3)
}

func TestTokenBucketMillionKeys(t *testing.T) {
	t.Parallel() // CPU-bound on the fake clock: runs beside the other heavy tests
	// One request from each of a million keys over a simulated day: the map
	// holds only the keys of the last couple of sweep intervals, never the
	// million.
	n := 1_000_000
	if testing.Short() {
		n = 100_000
	}
	const day = 24 * time.Hour
	step := day / time.Duration(n)
	perSweep := int(keyed.SweepEvery / step)
	limit := 2*perSweep + 16

	tb, fc := newTokenBucketOnFake(t, PerSecond(1), 5)
	most := 0
	for i := range n {
		fc.Advance(step)
		delay, err := delayOf(tb.reserve(strconv.Itoa(i), 1, budget{}))
		if err != nil || delay != 0 {
			t.Fatalf("key %d: delay %v, err %v: a new key's first request goes at once", i, delay, err)
		}
		if l := tb.buckets.Len(); l > most {
			most = l
			if l > limit {
				t.Fatalf("after %d keys (%v), %d buckets held; want at most %d", i+1, time.Duration(i+1)*step, l, limit)
			}
		}
	}
	t.Logf("%d keys over %v: at most %d buckets held (limit %d), peak %d", n, day, most, limit, tb.buckets.Peak)
	assert.LessOrEqual(t, tb.buckets.Peak, limit, "the map was rebuilt after the spike, if there was one")
}

// tbScriptClock is a clock whose Now answers come from the test, one call at a
// time, so that a test can pause a call right after it read the time.
type tbScriptClock struct {
	calls  chan chan time.Time // a Now call has started; answer it on the channel it sends
	timers clock.Clock         // for NewTimer (unused by reserve)
}

func (c *tbScriptClock) Now() time.Time {
	answer := make(chan time.Time)
	c.calls <- answer
	return <-answer
}

func (c *tbScriptClock) NewTimer(d time.Duration) clock.Timer { return c.timers.NewTimer(d) }

// The bucket's x/time/rate limiter needs the times it is given in order: if
// two calls on one key reached it in the opposite order of their clock
// reads, it would move its "last" time back and refill the interval between
// the two reads a second time, breaking the bound R·w + B. So a time read
// before another call's but used after it is moved up. Here: burst 1, 1/s.
// A takes the token at 0; G1 reads 0.5s and is held right after the read;
// G2 reads 1s and takes the token; G1 resumes with 0.5s, moved up to 1s,
// and is granted at 2s. No window may hold more than its bound.
func TestTokenBucketClockReadsOfAKeyAreOrdered(t *testing.T) {
	tb, err := NewTokenBucket(PerSecond(1), 1)
	require.NoError(t, err)
	sc := &tbScriptClock{calls: make(chan chan time.Time), timers: clock.NewFake(limiterEpoch)}
	tb.clock = sc
	at := func(d time.Duration) time.Time { return limiterEpoch.Add(d) }

	type grant struct {
		at  time.Time
		err error
	}
	// reserveAt makes a request that reads now from the clock, however many
	// times it reads it.
	reserveAt := func(now time.Time) grant {
		done := make(chan grant, 1)
		go func() {
			d, err := delayOf(tb.reserve("k", 1, budget{}))
			done <- grant{now.Add(d), err}
		}()
		for {
			select {
			case answer := <-sc.calls:
				answer <- now
			case g := <-done:
				return g
			}
		}
	}

	var sends []time.Time
	g := reserveAt(at(0)) // A: creates the bucket (write path: one Now)
	require.NoError(t, g.err)
	sends = append(sends, g.at)

	// G1 reads the clock at 0.5s and stays paused right after the read.
	g1 := make(chan grant, 1)
	go func() {
		d, err := delayOf(tb.reserve("k", 1, budget{}))
		g1 <- grant{at(500 * time.Millisecond).Add(d), err}
	}()
	answerG1 := <-sc.calls

	// G2 reads 1s and goes through while G1 is held between its read and its
	// use of the bucket.
	g = reserveAt(at(time.Second))
	require.NoError(t, g.err)
	sends = append(sends, g.at)

	// G1 resumes with its earlier time, which the bucket moves up to 1s.
	answerG1 <- at(500 * time.Millisecond)
	g = <-g1
	require.NoError(t, g.err)
	sends = append(sends, g.at.Add(500*time.Millisecond)) // its delay counts from 1s

	// In any window [s_i, s_j], at most R·(s_j−s_i) + B units.
	for i := range sends {
		for j := i + 1; j < len(sends); j++ {
			units := float64(j - i + 1)
			bound := sends[j].Sub(sends[i]).Seconds()*1 + 1
			assert.LessOrEqual(t, units, bound+1e-9,
				"requests sent at %v: %v units in [%v, %v], bound %v",
				sinceEpoch(sends), units, sends[i].Sub(limiterEpoch), sends[j].Sub(limiterEpoch), bound)
		}
	}
}

func sinceEpoch(ts []time.Time) []time.Duration {
	out := make([]time.Duration, len(ts))
	for i, t := range ts {
		out[i] = t.Sub(limiterEpoch)
	}
	return out
}

// TestTokenBucketRaiseKeepsTheQueue: turns reserved at 10/s keep their
// times; after a raise to 20/s the next turn comes after them, at the new
// rate, not among them (x/time/rate alone repays what they owe at the new
// rate and gives the next turn at 250 ms, while turns reserved before still
// go at 300 and 400 ms: the key would send at both rates at once). A jump
// by more than raiseJump is a limit restored: the queue is brought in, to
// the new rate, and the next turns follow it.
func TestTokenBucketRaiseKeepsTheQueue(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	b := &tokenBucket{rl: rate.NewLimiter(10, 1)}
	var last time.Duration
	for i := 0; i < 5; i++ {
		last = b.limiter().ReserveN(t0, 1).DelayFrom(t0)
	}
	require.Equal(t, 400*time.Millisecond, last)
	for _, step := range []rate.Limit{12, 15, 20} { // a climb, step by step
		b.setRate(t0, step)
	}
	next := b.limiter().ReserveN(t0, 1).DelayFrom(t0)
	assert.InDelta(t, float64(450*time.Millisecond), float64(next), float64(5*time.Millisecond),
		"the next turn: after the last one reserved, a unit at 20/s later")

	// A jump (a limit restored) does not: a queue given at 1/s would hold
	// the key at 1/s for 4 s. The queue moves in, to the new rate, and the
	// next turn follows it.
	b = &tokenBucket{rl: rate.NewLimiter(1, 1)}
	for i := 0; i < 5; i++ {
		b.wait(&turn{due: t0.Add(b.limiter().ReserveN(t0, 1).DelayFrom(t0))})
	}
	b.setRate(t0, 100)
	for i, w := range b.waiting {
		assert.Equal(t, time.Duration(i)*10*time.Millisecond, w.due.Sub(t0), "turn %d, brought in", i)
	}
	assert.Equal(t, 50*time.Millisecond, b.limiter().ReserveN(t0, 1).DelayFrom(t0), "4 owed and a unit, at 100/s")

	// A decrease needs nothing of setRate (lowerings spread the turns).
	b = &tokenBucket{rl: rate.NewLimiter(10, 1)}
	b.limiter().ReserveN(t0, 1)
	b.limiter().ReserveN(t0, 1)
	b.setRate(t0, 5)
	assert.Equal(t, 400*time.Millisecond, b.limiter().ReserveN(t0, 1).DelayFrom(t0), "one owed, repaid at 5/s, then a unit")
}
