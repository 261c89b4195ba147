package egress

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/redistest"
)

// Tests of the coalescing of waiters into one script call (sharedbatch.go).

// TestSharedCoalescing is the figure of BENCHMARKS.md: two processes, each
// with 1, 8 or 64 goroutines looping Wait on one key of a 200/s token bucket
// of burst 10; round trips per admitted request with coalescing on and off.
func TestSharedCoalescing(t *testing.T) {
	srv := redistest.Start(t)
	const (
		rate  = 200.0
		burst = 10
		d     = time.Second
		procs = 2
	)
	type figure struct {
		roundTrips, admitted int64
		admittedPerSec       float64
	}
	run := func(t *testing.T, goroutines int, coalesce bool) figure {
		name := fmt.Sprintf("coalesce-%d-%v", goroutines, coalesce)
		var lims []*SharedTokenBucket
		ev := &fallbackEvents{}
		for range procs {
			l := newSharedTB(t, srv.Client(t), name, PerSecond(rate), burst,
				WithCommandTimeout(roomyTimeout), WithFallbackObserver(ev.hook))
			l.shared.coalesce = coalesce
			lims = append(lims, l)
		}
		// No deadline on the Waits: a refusal at the end of the run would be
		// a round trip without an admission. The goroutines stop taking new
		// turns after d and are admitted to the ones they hold.
		var stop atomic.Bool
		var wg sync.WaitGroup
		var mu sync.Mutex
		var errs []error
		start := time.Now()
		for _, l := range lims {
			for range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for !stop.Load() {
						if _, err := l.Wait(context.Background(), "k", 1, 0); err != nil {
							mu.Lock()
							errs = append(errs, err)
							mu.Unlock()
							return
						}
					}
				}()
			}
		}
		time.Sleep(d)
		stop.Store(true)
		wg.Wait()
		took := time.Since(start)
		require.Empty(t, errs)
		require.Empty(t, ev.get(), "no fallback during the measurement")
		var f figure
		for _, l := range lims {
			s := l.Stats()
			f.roundTrips += s.RoundTrips
			f.admitted += s.Admitted
		}
		f.admittedPerSec = float64(f.admitted) / took.Seconds()
		return f
	}

	perAdmitted := map[int][2]float64{}
	for _, g := range []int{1, 8, 64} {
		var pair [2]float64
		for i, coalesce := range []bool{false, true} {
			f := run(t, g, coalesce)
			require.Positive(t, f.admitted)
			ratio := float64(f.roundTrips) / float64(f.admitted)
			pair[i] = ratio
			t.Logf("%d processes x %2d goroutines, coalesce %-5v: %5d round trips, %5d admitted (%.0f/s): %.3f round trips per admitted request (%.1f admitted per round trip)",
				procs, g, coalesce, f.roundTrips, f.admitted, f.admittedPerSec, ratio, 1/ratio)
			assert.LessOrEqual(t, ratio, 1.0, "never more than one round trip per admitted request")
			assert.InDelta(t, rate, f.admittedPerSec, 0.2*rate, "admitted at about R")
		}
		perAdmitted[g] = pair
	}
	fall := perAdmitted[64][0] / perAdmitted[64][1]
	t.Logf("with 64 goroutines per process, coalescing cuts round trips per admitted request %.1f-fold", fall)
	assert.GreaterOrEqual(t, fall, 5.0, "with 64 goroutines the round trips per admitted request fall at least 5-fold")
}

// TestSharedRefusalAtOnceWhileTurnsHeld: a request that cannot be granted
// within its maximum wait, its deadline or the pacer's queue must be refused
// at once even while this process already holds turns in the future for the
// key.
//
// (At 8073bcc the lead slept until shortly before the last turn held before
// taking its queue, so a waiter that joined meanwhile got no answer until
// then: refused after ~300ms despite a 20ms maxWait, context.DeadlineExceeded
// instead of a *LimitError, a full pacer queue answered late or not at all.)
func TestSharedRefusalAtOnceWhileTurnsHeld(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	const fast = 60 * time.Millisecond // "at once", on a loaded box

	// hold makes l (whose key "k" has just been drained) hold the next turn,
	// 300ms away, in a goroutine, and returns a channel for its result.
	hold := func(t *testing.T, l Limiter, stats func() SharedStats) <-chan error {
		_, err := l.Wait(ctx, "k", 1, 0)
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() { _, err := l.Wait(ctx, "k", 1, 0); done <- err }()
		require.Eventually(t, func() bool { return stats().Admitted == 2 }, time.Second, time.Millisecond)
		return done
	}

	t.Run("max wait", func(t *testing.T) {
		l := newSharedTB(t, srv.Client(t), "held-maxwait", Every(300*time.Millisecond), 1, WithCommandTimeout(roomyTimeout))
		done := hold(t, l, l.Stats)
		start := time.Now()
		_, err := l.Wait(ctx, "k", 1, 20*time.Millisecond)
		took := time.Since(start)
		var le *LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, ReasonMaxWait, le.Reason)
		assert.Less(t, took, fast, "refused at once, not after %v", took)
		require.NoError(t, <-done)
	})
	t.Run("deadline", func(t *testing.T) {
		l := newSharedTB(t, srv.Client(t), "held-deadline", Every(300*time.Millisecond), 1, WithCommandTimeout(roomyTimeout))
		done := hold(t, l, l.Stats)
		dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := l.Wait(dctx, "k", 1, 0)
		took := time.Since(start)
		var le *LimitError
		if assert.ErrorAs(t, err, &le, "want a *LimitError, got %v after %v", err, took) {
			assert.Equal(t, ReasonDeadline, le.Reason)
		}
		assert.Less(t, took, fast, "refused at once, not after %v", took)
		require.NoError(t, <-done)
	})
	t.Run("pacer queue full", func(t *testing.T) {
		l := newSharedLB(t, srv.Client(t), "held-queue", Every(300*time.Millisecond), 1, WithCommandTimeout(roomyTimeout))
		done := hold(t, l, l.Stats)
		start := time.Now()
		_, err := l.Wait(ctx, "k", 1, 0)
		took := time.Since(start)
		assert.ErrorIs(t, err, ErrQueueFull)
		assert.Less(t, took, fast, "refused at once, not after %v", took)
		require.NoError(t, <-done)
	})
}

// TestSharedCoalescedBatchIsExact: 64 goroutines in one process, coalesced,
// still respect the bucket, and one call serves many of them.
func TestSharedCoalescedBatchIsExact(t *testing.T) {
	srv := redistest.Start(t)
	l := newSharedTB(t, srv.Client(t), "batch", PerSecond(100), 5, WithCommandTimeout(roomyTimeout))
	tl := hammer(t, []Limiter{l}, "k", 64, time.Second, oneUnit)
	worst := checkWindows(t, tl, 100, 5, 1)
	s := l.Stats()
	t.Logf("%d admitted, %d round trips, worst excess %.2f", len(tl.adm), s.RoundTrips, worst)
	assert.Less(t, s.RoundTrips*5, s.Admitted, "one call serves many waiters")
}

func TestParseReserve(t *testing.T) {
	tests := []struct {
		name  string
		reply any
		n     int
		want  []reserved
		isErr bool
	}{
		{"one admitted", []any{int64(0), "50", int64(0), int64(0), int64(1500)}, 1, []reserved{{code: 0, wait: 1500 * time.Microsecond}}, false},
		{"three", []any{int64(10), "50", int64(0), int64(0), int64(0), int64(1), int64(7), int64(2), int64(9)}, 3,
			[]reserved{{code: 0}, {code: 1, wait: 7 * time.Microsecond}, {code: 2, wait: 9 * time.Microsecond}}, false},
		{"empty batch", []any{int64(0), "50", int64(0)}, 0, []reserved{}, false},
		{"nil", nil, 1, nil, true},
		{"not an array", "OK", 1, nil, true},
		{"an integer", int64(3), 1, nil, true},
		{"empty array", []any{}, 1, nil, true},
		{"too short", []any{int64(0), "50", int64(0), int64(0)}, 1, nil, true},
		{"too long", []any{int64(0), "50", int64(0), int64(0), int64(0), int64(0)}, 1, nil, true},
		{"short for the batch", []any{int64(0), "50", int64(0), int64(0), int64(0)}, 2, nil, true},
		{"code as string", []any{int64(0), "50", int64(0), "0", int64(0)}, 1, nil, true},
		{"wait as string", []any{int64(0), "50", int64(0), int64(0), "12"}, 1, nil, true},
		{"wait as float", []any{int64(0), "50", int64(0), int64(0), 1.5}, 1, nil, true},
		{"nil element", []any{int64(0), "50", int64(0), nil, int64(0)}, 1, nil, true},
		{"nested array", []any{int64(0), "50", int64(0), []any{int64(0), "50", int64(0)}, int64(0)}, 1, nil, true},
		{"negative wait", []any{int64(0), "50", int64(0), int64(0), int64(-1)}, 1, nil, true},
		{"a probe", []any{int64(0), "50", int64(0), int64(3), int64(1500)}, 1, []reserved{{code: 0, wait: 1500 * time.Microsecond, probe: true}}, false},
		{"held back", []any{int64(0), "50", int64(0), int64(4), int64(20000)}, 1, []reserved{{code: 4, wait: 20 * time.Millisecond}}, false},
		{"code 5", []any{int64(0), "50", int64(0), int64(5), int64(0)}, 1, nil, true},
		{"code -1", []any{int64(0), "50", int64(0), int64(-1), int64(0)}, 1, nil, true},
		{"bad second request", []any{int64(0), "50", int64(0), int64(0), int64(0), int64(5), int64(0)}, 2, nil, true},
		{"moves", []any{int64(0), "50", int64(4), int64(0), int64(1500)}, 1, []reserved{{code: 0, wait: 1500 * time.Microsecond, moves: 4}}, false},
		{"moves negative", []any{int64(0), "50", int64(-1), int64(0), int64(0)}, 1, nil, true},
		{"moves as string", []any{int64(0), "50", "4", int64(0), int64(0)}, 1, nil, true},
		{"an error value", errors.New("ERR boom"), 1, nil, true},
		{"no rate", []any{int64(0)}, 0, nil, true},
		{"zero rate", []any{int64(0), "0", int64(0), int64(0), int64(0)}, 1, nil, true},
		{"rate as integer", []any{int64(0), int64(50), int64(0), int64(0), int64(0)}, 1, nil, true},
		{"rate not a number", []any{int64(0), "fast", int64(0), int64(0), int64(0)}, 1, nil, true},
		{"rate infinite", []any{int64(0), "inf", int64(0), int64(0), int64(0)}, 1, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []reserved
			var rate float64
			var err error
			require.NotPanics(t, func() { got, rate, err = parseReserve(tt.reply, tt.n) })
			if tt.isErr {
				assert.Error(t, err)
				assert.Nil(t, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, 50.0, rate, "the key's rate, sent as a string at full precision")
		})
	}
}

// TestBatchLaneFollowsRetimes: the turns a process holds, which its own
// checks count (queue full, too long a wait), move with the changes of the
// key's rate made after they were given, as its waiters' do.
func TestBatchLaneFollowsRetimes(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := time.Millisecond
	l := &batchLane{
		turns:  []heldTurn{{at: t0.Add(100 * ms), cost: 1}, {at: t0.Add(200 * ms), cost: 1}, {at: t0.Add(300 * ms), cost: 1, moves: 3}},
		held:   t0.Add(300 * ms),
		heldAt: 3,
	}
	l.retime(t0, 0.5, 3) // a raise the last turn was given after
	assert.Equal(t, []time.Time{t0.Add(50 * ms), t0.Add(100 * ms), t0.Add(300 * ms)},
		[]time.Time{l.turns[0].at, l.turns[1].at, l.turns[2].at}, "the turns given before it, brought in by 2")
	assert.Equal(t, t0.Add(300*ms), l.held, "the last, given after it, stays")
	l.retime(t0.Add(100*ms), 2, 4) // a lowering, from 100 ms on
	assert.Equal(t, []time.Time{t0.Add(50 * ms), t0.Add(100 * ms), t0.Add(500 * ms)},
		[]time.Time{l.turns[0].at, l.turns[1].at, l.turns[2].at}, "spread by 2 after 100 ms")
	assert.Equal(t, t0.Add(500*ms), l.held)
	assert.Equal(t, 1, l.waiting(t0.Add(60*ms), t0.Add(100*ms)), "one unit after 100 ms, the first turn past")
}
