//go:build go1.25

package egress

// The local TokenBucket's waiters on the fake clock of a testing/synctest
// bubble, measured to the nanosecond.

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTokenBucketDecreaseSpreadsReservedTurns: waiters that reserved their
// turns at 100/s, when a throttle lowers the key's rate, go at the new rate
// from the decrease on, not at the old one: otherwise every turn reserved
// before the decrease (a queue of waiters is a backlog of seconds) reaches
// the provider faster than it allows, and meets a throttle of its own.
// Turns reserved after the decrease queue behind them, at the new rate.
func TestTokenBucketDecreaseSpreadsReservedTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tb, err := NewTokenBucket(PerSecond(100), 1, WithTransitMargin(0))
		require.NoError(t, err)
		ctx := context.Background()
		start := time.Now()
		const before, after = 20, 5
		turns := newTurnLog(t, tb, start)
		wait, done := turns.wait, turns.done
		for i := range before {
			wait(i)
		}
		// The first turn went at once; the rest are due every 10 ms.
		time.Sleep(5 * time.Millisecond)
		now := time.Now()
		// (A Retry-After of a unit: one that says nothing at all holds a
		// unit at the floor rate, see unsaid.)
		d := tb.Learn(ctx, "k", Signal{Status: http.StatusTooManyRequests, SentAt: now.Add(-time.Millisecond), Now: now,
			RetryAfter: 10 * time.Millisecond, HasRetryAfter: true})
		require.Equal(t, "throttled", d.Why)
		lowered := d.New.PerSecond()
		require.Less(t, lowered, 100.0)
		for i := range after {
			wait(before + i)
		}
		turns.wg.Wait()

		unit := time.Duration(float64(time.Second) / lowered)
		assert.Equal(t, time.Duration(0), done[0], "the first took the bucket's token")
		// Turn i was due at i × 10 ms. The throttle holds the key for one
		// unit, until 5 ms + 10 ms: a turn that falls within the hold is
		// taken again after it; from the hold's end on, the rest of a
		// turn's wait is spread by 100/lowered.
		holdEnd := 15 * time.Millisecond
		spread := func(i int) time.Duration {
			return holdEnd + time.Duration(float64(time.Duration(i)*10*time.Millisecond-holdEnd)*100/lowered)
		}
		for i := 1; i < before; i++ {
			if time.Duration(i)*10*time.Millisecond < holdEnd {
				assert.GreaterOrEqual(t, done[i], holdEnd, "turn %d, within the hold", i)
				continue
			}
			assert.InDelta(t, spread(i), done[i], float64(time.Millisecond), "turn %d, reserved before the decrease", i)
		}
		last := spread(before - 1)
		for i := range after {
			assert.GreaterOrEqual(t, done[before+i], last+time.Duration(i+1)*unit-time.Millisecond,
				"turn %d, reserved after the decrease: behind the spread turns, at the new rate", before+i)
		}
	})
}

// TestTokenBucketSpreadTurnKeepsMaxWait: a waiter whose turn, spread by a
// decrease, would come after its max wait is refused with ReasonMaxWait
// when the spread is known, and its tokens are given back; one whose
// spread turn fits goes.
func TestTokenBucketSpreadTurnKeepsMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tb, err := NewTokenBucket(PerSecond(100), 1, WithTransitMargin(0))
		require.NoError(t, err)
		ctx := context.Background()
		_, err = tb.Wait(ctx, "k", 1, 0) // the bucket's token
		require.NoError(t, err)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i, maxWait := range []time.Duration{100 * time.Millisecond, 25 * time.Millisecond} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = tb.Wait(ctx, "k", 1, maxWait)
			}()
			synctest.Wait() // due at 10 ms, then 20 ms
		}
		time.Sleep(time.Millisecond)
		now := time.Now()
		d := tb.Learn(ctx, "k", Signal{Status: http.StatusTooManyRequests, SentAt: now, Now: now, RetryAfter: 0, HasRetryAfter: true})
		require.Equal(t, "throttled", d.Why)
		require.InDelta(t, 70, d.New.PerSecond(), 0.5)
		wg.Wait()
		assert.NoError(t, errs[0], "10 ms spread to 14 ms from 1 ms: within 100 ms")
		var le *LimitError
		require.ErrorAs(t, errs[1], &le, "20 ms spread to 28 ms from 1 ms: past 25 ms")
		assert.Equal(t, ReasonMaxWait, le.Reason)
	})
}

// TestTokenBucketRaiseBringsReservedTurnsIn: waiters that reserved their
// turns at an advertised 50/s, when the provider advertises 100/s, go at
// the new rate from the raise on, woken early: otherwise the queue (a
// backlog of seconds at a low rate) goes at the old rate for as long as
// it lasts, and what the provider's counts say of the key's rate is that
// much old (see tokenBucket.retime). Turns reserved after the raise queue
// behind them, at the new rate.
func TestTokenBucketRaiseBringsReservedTurnsIn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tb, err := NewTokenBucket(PerSecond(100), 1, WithTransitMargin(0))
		require.NoError(t, err)
		ctx := context.Background()
		start := time.Now()
		advertise := func(limit float64) Decision {
			now := time.Now()
			return tb.Learn(ctx, "k", Signal{Status: http.StatusOK, SentAt: now, Now: now, Quotas: []Quota{{
				Dimension: Requests, Limit: limit, HasLimit: true, Window: time.Second, HasWindow: true,
				Remaining: limit / 2, HasRemaining: true,
			}}})
		}
		_, err = tb.Wait(ctx, "k", 1, 0) // the bucket's token, at 0
		require.NoError(t, err)
		require.InDelta(t, 50, advertise(50).New.PerSecond(), 1e-9, "lowered to the advertised 50/s")
		const before, after = 10, 3
		turns := newTurnLog(t, tb, start)
		wait, done := turns.wait, turns.done
		for i := range before {
			wait(i) // due at 20, 40, ... 200 ms
		}
		time.Sleep(30 * time.Millisecond)
		require.InDelta(t, 100, advertise(100).New.PerSecond(), 1e-9, "raised to the advertised 100/s")
		for i := range after {
			wait(before + i)
		}
		turns.wg.Wait()

		ms := time.Millisecond
		assert.Equal(t, 20*ms, done[0], "due before the raise: went at its time")
		// Turn i was due at (i+1) × 20 ms; from the raise at 30 ms on, the
		// rest of its wait is halved.
		for i := 1; i < before; i++ {
			want := 30*ms + (time.Duration(i+1)*20*ms-30*ms)/2
			assert.Equal(t, want, done[i], "turn %d, reserved before the raise", i)
		}
		last := 30*ms + (before*20*ms-30*ms)/2
		for i := range after {
			assert.InDelta(t, last+time.Duration(i+1)*10*ms, done[before+i], float64(ms),
				"turn %d, reserved after the raise: behind the brought-in turns, at the new rate", before+i)
		}
	})
}

// turnLog starts waiters of tb's key "k", one at a time, and records when
// each got its turn, from start.
type turnLog struct {
	t     *testing.T
	tb    *TokenBucket
	start time.Time
	mu    sync.Mutex
	done  map[int]time.Duration // guarded by mu until wg is done
	wg    sync.WaitGroup
}

func newTurnLog(t *testing.T, tb *TokenBucket, start time.Time) *turnLog {
	return &turnLog{t: t, tb: tb, start: start, done: map[int]time.Duration{}}
}

// wait starts waiter i and returns once it has reserved its turn.
func (l *turnLog) wait(i int) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		_, err := l.tb.Wait(context.Background(), "k", 1, 0)
		assert.NoError(l.t, err)
		l.mu.Lock()
		l.done[i] = time.Since(l.start)
		l.mu.Unlock()
	}()
	synctest.Wait() // reserved, in this order
}
