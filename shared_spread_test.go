package egress

import (
	"context"
	"math"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/redistest"
)

// sharedLimiter is a shared limiter as these tests use it.
type sharedLimiter interface {
	Limiter
	Learner
	EffectiveRate(key string) Rate
}

// bothShared returns the constructors of the two shared limiters at 100/s,
// by name: a token bucket of burst 1 and a pacer whose queue holds 64.
func bothShared() map[string]func(t *testing.T, rdb redis.UniversalClient, name string) sharedLimiter {
	opts := []LimiterOption{WithCommandTimeout(roomyTimeout)}
	return map[string]func(t *testing.T, rdb redis.UniversalClient, name string) sharedLimiter{
		"SharedTokenBucket": func(t *testing.T, rdb redis.UniversalClient, name string) sharedLimiter {
			return newSharedTB(t, rdb, name, PerSecond(100), 1, opts...)
		},
		"SharedLeakyBucket": func(t *testing.T, rdb redis.UniversalClient, name string) sharedLimiter {
			return newSharedLB(t, rdb, name, PerSecond(100), 64, opts...)
		},
	}
}

// startWaiters starts n waiters for key on l and returns a func that waits for
// them and returns when each was let through, in order, and a func that
// reports how many have been so far.
func startWaiters(t *testing.T, l Limiter, key string, n int) (wait func() []time.Time, count func() int) {
	var (
		mu   sync.Mutex
		done []time.Time
		wg   sync.WaitGroup
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := l.Wait(context.Background(), key, 1, 0)
			assert.NoError(t, err)
			mu.Lock()
			done = append(done, time.Now())
			mu.Unlock()
		}()
	}
	wait = func() []time.Time {
		wg.Wait()
		sort.Slice(done, func(i, j int) bool { return done[i].Before(done[j]) })
		return done
	}
	count = func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(done)
	}
	return wait, count
}

// TestSharedDecreaseSpreadsGivenTurns: instance B's waiters hold turns given
// at 100/s, a turn every 10 ms for 0.4 s; a throttle heard by instance A
// lowers the key's rate. The turns still to come go at the new rate from the
// decrease on (the script moves the bucket's last turn, and a pacer's queue,
// and tells every instance on the channel), not at the old one, and a turn
// given after the decrease queues behind them: for the token bucket and the
// pacer alike.
func TestSharedDecreaseSpreadsGivenTurns(t *testing.T) {
	for name, newLimiter := range bothShared() {
		t.Run(name, func(t *testing.T) {
			srv := redistest.Start(t)
			a := newLimiter(t, srv.Client(t), "spread")
			b := newLimiter(t, srv.Client(t), "spread")
			ctx := context.Background()
			const key, waiters = "api.example.com", 40
			start := time.Now()
			agedKey(t, sharedOf(a), key) // in use: not a start-up collision
			wait, count := startWaiters(t, b, key, waiters)
			// Every waiter has its turn once the first few have gone.
			require.Eventually(t, func() bool { return count() >= 3 }, time.Second, time.Millisecond)
			at := time.Now()
			d := a.Learn(ctx, key, Signal{Status: http.StatusTooManyRequests, Now: at, SentAt: at.Add(-time.Millisecond)})
			require.Less(t, d.New.PerSecond(), d.Old.PerSecond(), "the throttle lowers the rate: %+v", d)
			factor := d.Old.PerSecond() / d.New.PerSecond()
			after, _ := startWaiters(t, b, key, 1) // a turn given after the decrease
			// (In order of their going: a turn that fell inside the hold
			// the throttle began is taken again after it, behind the new
			// one.)
			done := append(wait(), after()...)
			sort.Slice(done, func(i, j int) bool { return done[i].Before(done[j]) })

			lastDue := start.Add(time.Duration(waiters-1) * 10 * time.Millisecond) // at the old rate
			spread := at.Add(time.Duration(float64(lastDue.Sub(at)) * factor))
			t.Logf("decrease at %v by %.2f; the old rate's last turn due at %v, spread to %v; the last two went at %v, %v",
				at.Sub(start), factor, lastDue.Sub(start), spread.Sub(start), done[waiters-1].Sub(start), done[waiters].Sub(start))
			assert.True(t, done[waiters-1].After(spread.Add(-40*time.Millisecond)),
				"the last turn given before the decrease goes at the new rate: at %v, spread to %v (%v at the old rate)",
				done[waiters-1].Sub(start), spread.Sub(start), lastDue.Sub(start))
			unit := time.Duration(float64(time.Second) / d.New.PerSecond())
			assert.GreaterOrEqual(t, done[waiters].Sub(done[waiters-1]), unit/2,
				"the turn given after the decrease queues behind the spread ones")
		})
	}
}

// TestSharedRaiseBringsTurnsIn: waiters hold turns given at an advertised
// 25/s, one every 40 ms for 0.8 s, when the advertised limit rises to
// 100/s. The turns still to come go at the new rate from then on, as a
// local LeakyBucket's queue does, paced still: for the token bucket and
// the pacer alike.
func TestSharedRaiseBringsTurnsIn(t *testing.T) {
	for name, newLimiter := range bothShared() {
		t.Run(name, func(t *testing.T) {
			srv := redistest.Start(t)
			l := newLimiter(t, srv.Client(t), "raise")
			ctx := context.Background()
			const key, waiters = "api.example.com", 20
			advertisePerSecond(ctx, l, key, 25)
			require.Equal(t, PerSecond(25), l.EffectiveRate(key))
			start := time.Now()
			wait, count := startWaiters(t, l, key, waiters)
			require.Eventually(t, func() bool { return count() >= 3 }, time.Second, time.Millisecond)
			at := time.Now()
			advertisePerSecond(ctx, l, key, 100)
			done := wait()

			lastDue := start.Add(time.Duration(waiters-1) * 40 * time.Millisecond) // at 25/s
			brought := at.Add(lastDue.Sub(at) / 4)
			last := done[waiters-1]
			t.Logf("raise at %v; the last turn due at %v, brought in to %v; it went at %v",
				at.Sub(start), lastDue.Sub(start), brought.Sub(start), last.Sub(start))
			// (Within 150 ms: a busy machine wakes a waiter late; at the old
			// rate it would go 500 ms later.)
			assert.True(t, last.Before(brought.Add(150*time.Millisecond)), "the last turn goes at the new rate")
			assert.True(t, last.After(brought.Add(-40*time.Millisecond)), "paced still, not at once")
			// The last five gaps, 10 ms each at the new rate: 50 ms, less a
			// waiter woken late on a busy machine.
			assert.GreaterOrEqual(t, done[waiters-1].Sub(done[waiters-6]), 35*time.Millisecond, "the last turns 10 ms apart")
		})
	}
}

// TestSharedHearsMoves: the channel's message of a change of the rate,
// "<id> x<old over new> <us until it starts> <its number>", moves a turn
// given before it: a lowering spreads it, a raise brings it in, applied in
// the order of their numbers and only those after the turn's reservation
// (its reply says how many came before); anything else that is not a hold
// is ignored.
func TestSharedHearsMoves(t *testing.T) {
	srv := redistest.Start(t)
	l := newSharedTB(t, srv.Client(t), "hear", PerSecond(100), 1, WithCommandTimeout(roomyTimeout))
	s := l.shared
	since := s.clock.Now()
	due := since.Add(time.Second)
	moved := func(id string, applied uint64) time.Duration {
		s.mu.Lock()
		defer s.mu.Unlock()
		r, ok := s.moved.M[id]
		if !ok {
			return due.Sub(since)
		}
		d, _ := r.apply(due, applied, since)
		return d.Sub(since)
	}
	for _, p := range []string{"k x", "k x2", "k x2 0", "k xNaN 0 1", "k x0 0 1", "k x-2 0 1", "k x+Inf 0 1", "k x1e400 0 1",
		"k x2 -1 1", "k x2 9223372036854775807 1", "k x2 0 -1", "k x2 0 one", "k", "k y2 0 1", "x2 0 1"} {
		s.hear(p)
	}
	assert.InDelta(t, time.Second, moved("k", 0), float64(50*time.Millisecond), "nothing moves")
	s.hear("k x2 0 1")
	assert.InDelta(t, 2*time.Second, moved("k", 0), float64(50*time.Millisecond), "spread by 2 from the decrease")
	assert.InDelta(t, time.Second, moved("k", 1), float64(50*time.Millisecond), "a turn given after it does not move")
	s.hear("j x2 500000 1")
	assert.InDelta(t, 1500*time.Millisecond, moved("j", 0), float64(50*time.Millisecond), "spread by 2 from the hold's end, 0.5 s on")
	s.hear("h x0.5 0 1")
	assert.InDelta(t, 500*time.Millisecond, moved("h", 0), float64(50*time.Millisecond), "brought in by 2")
	// Heard out of order: the 3rd (a raise by 2, from 0.5 s on), then the
	// 2nd (a lowering by 4): 1 s → 4 s → 2.25 s.
	s.hear("g x0.5 500000 3")
	s.hear("g x4 0 2")
	assert.InDelta(t, 2250*time.Millisecond, moved("g", 1), float64(50*time.Millisecond), "applied in their order")
	assert.InDelta(t, time.Second, moved("i", 0), float64(50*time.Millisecond), "another key")
}

// TestRetimingsApply: a waiter applies the changes numbered after its
// turn's, heard since its reservation was sent, in their order, once each.
func TestRetimingsApply(t *testing.T) {
	t0 := time.Unix(1000, 0)
	r := &retimings{moved: make(chan struct{})}
	due := t0.Add(time.Second)
	r.add(t0.Add(-time.Second), t0, 2, 7) // heard before the reservation: another life of the key
	r.add(t0, t0, 2, 9)
	woken := r.moved
	r.add(t0, t0, 0.5, 11)
	select {
	case <-woken:
	default:
		t.Error("a change wakes the waiters")
	}
	got, applied := r.apply(due, 8, t0)
	assert.Equal(t, due, got, "9 then 11: by 2, then by a half")
	assert.Equal(t, uint64(11), applied)
	got, applied = r.apply(due, 9, t0)
	assert.Equal(t, t0.Add(500*time.Millisecond), got, "11 only")
	assert.Equal(t, uint64(11), applied)
	got, _ = r.apply(due, 11, t0)
	assert.Equal(t, due, got, "none after 11")
	for i := range 20 { // more than the ring holds: the oldest are forgotten
		r.add(t0, t0, 1.01, uint64(12+i))
	}
	assert.Equal(t, len(r.ring), r.n)
	_, applied = r.apply(due, 0, t0)
	assert.Equal(t, uint64(31), applied)
	r.add(t0, t0, 1, 40)
	r.add(t0, t0, math.NaN(), 41)
	_, applied = r.apply(due, 31, t0)
	assert.Equal(t, uint64(31), applied, "a factor of 1 or not a number is no change")
	r.add(t0, t0, 1e300, 42)
	got, _ = r.apply(due, 41, t0)
	assert.Equal(t, t0.Add(365*24*time.Hour), got, "a hostile factor moves a turn a year at most")
}

// TestSharedFleetEstimate: the fleet's refusals, counted in Redis, with the
// turns it was granted, estimate the limit when no instance has seen
// enough refusals for an estimate of its own: a throttle after 4 of the
// last second's 40 turns were refused lowers the rate to just under 36/40
// of it, not by beta.
func TestSharedFleetEstimate(t *testing.T) {
	srv := redistest.Start(t)
	opts := []LimiterOption{WithCommandTimeout(roomyTimeout)}
	a := newSharedTB(t, srv.Client(t), "estimate", PerSecond(100), 1, opts...)
	b := newSharedTB(t, srv.Client(t), "estimate", PerSecond(100), 1, opts...)
	ctx := context.Background()
	const key = "api.example.com"
	agedKey(t, a.shared, key) // in use: not a start-up collision
	for range 40 {            // 0.4 s of turns at 100/s
		_, err := b.Wait(ctx, key, 1, 0)
		require.NoError(t, err)
	}
	// Four refusals, each heard by another instance. The first lowers by
	// beta (no estimate yet); the next three were sent before that
	// decrease: they lower nothing, but they count.
	now := time.Now()
	d := a.Learn(ctx, key, Signal{Status: http.StatusTooManyRequests, Now: now, SentAt: now.Add(-time.Millisecond)})
	require.Equal(t, "throttled", d.Why)
	assert.InDelta(t, 70, d.New.PerSecond(), 0.5, "the first: by beta")
	for range 3 {
		now := time.Now()
		d := b.Learn(ctx, key, Signal{Status: http.StatusTooManyRequests, Now: now, SentAt: now.Add(-100 * time.Millisecond)})
		assert.Equal(t, d.Old, d.New, "sent before the decrease: the same episode")
	}
	time.Sleep(100 * time.Millisecond) // a request sent after the decrease, not among the first after its hold (a storm's sign)
	now = time.Now()
	d = b.Learn(ctx, key, Signal{Status: http.StatusTooManyRequests, Now: now, SentAt: now.Add(-time.Millisecond)})
	require.Equal(t, "throttled", d.Why)
	old := d.Old.PerSecond()
	t.Logf("%v → %v", d.Old, d.New)
	// 5 of the 40 turns refused (the last one counts too): 35/40 of the rate, less 8%.
	assert.InDelta(t, old*35/40*0.92, d.New.PerSecond(), 1.5, "the fleet's estimate: 35/40 of %.1f/s, less the margin", old)
}
