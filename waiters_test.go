package egress

// Ten thousand waiters on one key, for each limiter: what a waiter costs in
// memory, that they all return at once when their context ends, and (for
// the leaky bucket) that they leave in order of arrival.

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/keyspace"
	"github.com/egress-go/egress/internal/redistest"
)

const (
	manyWaiters = 10_000
	// waiterMemBound is a generous bound on the memory of one parked
	// waiter, its goroutine's stack included: a goroutine alone takes
	// 2-8 KiB, more under -race.
	waiterMemBound = 32 << 10
	// cancelBound is how soon after their context ends every waiter must
	// have returned, on a loaded 2-core machine under -race. A leaving
	// waiter is marked, not searched for, so all leave in linear time:
	// without -race the 10,000 return within about 15 ms, under -race in
	// 40-80 ms on an idle 2-core machine, and once in 626 ms in CI, the
	// other packages' tests beside it. The bound leaves room for a loaded
	// machine, and is still far below what it guards against: a waiter
	// left until its turn (the TokenBucket's last is hours away) or
	// searched for in its queue (10,000² steps).
	cancelBound = 1500 * time.Millisecond
	// settleTimeout bounds the wait for the waiters to park.
	settleTimeout = 20 * time.Second
)

// waitersCase makes a limiter that keeps nearly all of manyWaiters waiting
// on one key for far longer than the test, and says when they are parked
// and when the limiter has nothing left running.
type waitersCase struct {
	name string
	make func(t *testing.T) (lim Limiter, parked func() int, idle func() bool)
}

func waitersCases() []waitersCase {
	const key = "one-key"
	local := func(t *testing.T, lim Limiter) (Limiter, func() int, func() bool) {
		return lim, nil, func() bool { return true }
	}
	return []waitersCase{
		{"TokenBucket", func(t *testing.T) (Limiter, func() int, func() bool) {
			tb, err := NewTokenBucket(PerSecond(1), 1)
			require.NoError(t, err)
			return local(t, tb)
		}},
		{"LeakyBucket", func(t *testing.T) (Limiter, func() int, func() bool) {
			lb, err := NewLeakyBucket(PerSecond(1), 2*manyWaiters)
			require.NoError(t, err)
			parked := func() int {
				lb.mu.Lock()
				defer lb.mu.Unlock()
				if l, ok := lb.lanes.M[key]; ok {
					return len(l.queue)
				}
				return 0
			}
			return lb, parked, func() bool { return true }
		}},
		// The shared limiters run at 100/s: the coalescing lead of a key
		// sleeps until shortly before the last turn it reserved (128 at
		// most, 1.28 s ahead), and must be gone by the end of the test.
		{"SharedTokenBucket", func(t *testing.T) (Limiter, func() int, func() bool) {
			rdb := redistest.Start(t).Client(t)
			s := newSharedTB(t, rdb, "waiters-tb", PerSecond(100), 1, WithCommandTimeout(roomyTimeout))
			return s, sharedParked(s.shared, key), sharedIdle(s.shared)
		}},
		{"SharedLeakyBucket", func(t *testing.T) (Limiter, func() int, func() bool) {
			rdb := redistest.Start(t).Client(t)
			s := newSharedLB(t, rdb, "waiters-lb", PerSecond(100), 2*manyWaiters, WithCommandTimeout(roomyTimeout))
			return s, sharedParked(s.shared, key), sharedIdle(s.shared)
		}},
	}
}

// sharedParked counts the waiters of key queued for a script call.
func sharedParked(s *shared, key string) func() int {
	id := keyspace.ID(key)
	return func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		if l, ok := s.lanes.M[id]; ok {
			return len(l.queue)
		}
		return 0
	}
}

// sharedIdle reports whether no coalescing lead runs.
func sharedIdle(s *shared) func() bool {
	return func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, l := range s.lanes.M {
			if l.leading {
				return false
			}
		}
		return true
	}
}

// memNow returns the bytes of heap and goroutine stacks in use after a GC.
func memNow() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc + m.StackInuse
}

// settle returns once entered has reached n and the number of goroutines
// has stayed put for a while, give or take 1% (they are parked; a shared
// limiter still releases a few).
func settle(t *testing.T, entered *atomic.Int64, n int) {
	t.Helper()
	deadline := time.Now().Add(settleTimeout)
	last, still := -1, 0
	for still < 3 {
		require.True(t, time.Now().Before(deadline), "waiters did not park within %v", settleTimeout)
		time.Sleep(20 * time.Millisecond)
		g := runtime.NumGoroutine()
		if entered.Load() == int64(n) && abs(g-last) <= n/100 {
			still++
		} else {
			still = 0
		}
		last = g
	}
}

// TestTenThousandWaiters parks manyWaiters on one key of each limiter and
// measures what one costs in memory: the limiter's own part (what the heap
// and the stacks grow by when goroutines already parked on a channel go on
// to wait in the limiter) and, in all, with the goroutine itself. Then it
// ends their context: every one must return within cancelBound, with
// ctx.Err() unless it had its turn first.
func TestTenThousandWaiters(t *testing.T) {
	for _, tc := range waitersCases() {
		t.Run(tc.name, func(t *testing.T) {
			lim, parked, idle := tc.make(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			// One waiter may go at once (the burst, or an empty queue).
			_, err := lim.Wait(ctx, "one-key", 1, 0)
			require.NoError(t, err)

			before := memNow()
			gate := make(chan struct{})
			done := make(chan error, manyWaiters)
			var arrived, entered atomic.Int64
			for range manyWaiters {
				go func() {
					arrived.Add(1)
					<-gate
					entered.Add(1)
					_, err := lim.Wait(ctx, "one-key", 1, 0)
					done <- err
				}()
			}
			settle(t, &arrived, manyWaiters)
			gated := memNow()
			close(gate)
			settle(t, &entered, manyWaiters)
			waiting := memNow()
			goroutine := float64(gated-before) / manyWaiters
			own := (float64(waiting) - float64(gated)) / manyWaiters
			queued := -1
			if parked != nil {
				queued = parked()
			}

			cancel()
			cancelled := time.Now()
			var errs, admitted, other int
			for range manyWaiters {
				switch err := <-done; {
				case errors.Is(err, context.Canceled):
					errs++
				case err == nil:
					admitted++
				default:
					other++
					t.Errorf("unexpected error: %v", err)
				}
			}
			took := time.Since(cancelled)
			t.Logf("%d waiters: %.0f B each in the limiter, %.0f B with its goroutine; %d in the limiter's own queue; all returned %v after the cancel: %d cancelled, %d had their turn first",
				manyWaiters, own, own+goroutine, queued, took.Round(time.Millisecond), errs, admitted)
			assert.Less(t, own+goroutine, float64(waiterMemBound), "memory per waiter")
			assert.Less(t, took, cancelBound, "waiters returned too slowly after their context ended")
			assert.Zero(t, other)
			assert.Greater(t, errs, manyWaiters*9/10, "most waiters were still waiting when cancelled")
			require.Eventually(t, idle, 5*time.Second, 10*time.Millisecond, "a coalescing lead still runs")
		})
	}
}

// TestTenThousandWaitersFIFO: manyWaiters queue on one key of a
// LeakyBucket, one after the other, and leave in the order they came,
// one per 1/rate of a fake clock.
func TestTenThousandWaitersFIFO(t *testing.T) {
	const key = "one-key"
	lb := newLeakyBucket(PerSecond(1000), 2*manyWaiters)
	fake := clock.NewFake(time.Unix(1_700_000_000, 0))
	lb.clock = fake
	ctx := context.Background()
	_, err := lb.Wait(ctx, key, 1, 0) // goes at once
	require.NoError(t, err)

	queued := func() int {
		lb.mu.Lock()
		defer lb.mu.Unlock()
		return len(lb.lanes.M[key].queue)
	}
	order := make(chan int, manyWaiters)
	var wg sync.WaitGroup
	for i := range manyWaiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := lb.Wait(ctx, key, 1, 0)
			assert.NoError(t, err)
			order <- i
		}()
		// The next one arrives only once this one is in the queue.
		for queued() < i+1 {
			runtime.Gosched()
		}
	}
	start := time.Now()
	for want := range manyWaiters {
		fake.WaitTimers(1) // the head is parked on its turn
		fake.Advance(time.Millisecond)
		got := <-order
		if got != want {
			require.Equal(t, want, got, "release %d out of order", want)
		}
	}
	wg.Wait()
	t.Logf("%d waiters released in order of arrival in %v", manyWaiters, time.Since(start).Round(time.Millisecond))
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}
