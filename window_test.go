package egress

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/egress-go/egress/internal/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newWindowOnFake(t testing.TB, n int, w time.Duration) (*WindowLimit, *clock.Fake) {
	l, err := NewWindowLimit(n, w)
	require.NoError(t, err)
	fc := clock.NewFake(limiterEpoch)
	l.clock = fc
	return l, fc
}

func TestNewWindowLimitValidates(t *testing.T) {
	_, err := NewWindowLimit(0, time.Second)
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "NewWindowLimit: n 0")
	_, err = NewWindowLimit(10, -time.Second)
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "NewWindowLimit: window -1s")
	l, err := NewWindowLimit(1000, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, "1000/h", l.Rate().String())
}

// TestWindowLimitSteps: "3 per second" grants 3 at once, then each request
// when the one a window before it leaves; turns are in order, a refusal
// takes nothing, a cancelled turn is given back, and a cost above n can
// never be granted.
func TestWindowLimitSteps(t *testing.T) {
	l, fc := newWindowOnFake(t, 3, time.Second)
	at := func(d time.Duration) time.Time { return limiterEpoch.Add(d) }
	reserve := func(cost int, b budget) (time.Duration, error) {
		turn, now, err := l.reserve("k", cost, b)
		if err != nil {
			return 0, err
		}
		return turn.Sub(now), nil
	}
	for i := range 3 {
		d, err := reserve(1, budget{})
		require.NoError(t, err)
		assert.Zero(t, d, "request %d goes at once", i)
	}
	fc.Advance(200 * time.Millisecond)
	d, err := reserve(1, budget{})
	require.NoError(t, err)
	assert.Equal(t, 800*time.Millisecond, d, "the 4th goes when the 1st leaves the window")
	d, err = reserve(2, budget{})
	require.NoError(t, err)
	assert.Equal(t, 800*time.Millisecond, d, "cost 2 fits once the 2nd and 3rd leave too, at the same time")

	// Refused: the window ending at 1 s is full (the 4th and the cost-2
	// turn), so its turn is when the 4th leaves it, at 2 s: 1.8 s away.
	_, err = reserve(1, budget{maxWait: 100 * time.Millisecond})
	var le *LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, ReasonMaxWait, le.Reason)
	assert.Equal(t, 1800*time.Millisecond, le.Wait)
	assert.Equal(t, 3, l.Used("k"))

	// A cancelled turn is given back: with the cost-2 turn at 1 s gone, a
	// new request of cost 2 fits beside the 4th at 1 s.
	l.cancel("k", at(time.Second), 2)
	d, err = reserve(2, budget{})
	require.NoError(t, err)
	assert.Equal(t, 800*time.Millisecond, d)

	_, err = l.Wait(context.Background(), "k", 4, 0)
	require.ErrorIs(t, err, ErrCostTooHigh)

	// Another key has its own window; an idle key is dropped.
	d, err = func() (time.Duration, error) {
		turn, now, err := l.reserve("other", 3, budget{})
		return turn.Sub(now), err
	}()
	require.NoError(t, err)
	assert.Zero(t, d)
	fc.Advance(time.Hour)
	l.mu.Lock()
	l.logs.Sweep(fc.Now())
	assert.Empty(t, l.logs.M)
	l.mu.Unlock()
}

// TestWindowLimitWaitOnFakeClock: Wait sleeps until the turn, and a waiter
// whose context ends gives its turn back.
func TestWindowLimitWaitOnFakeClock(t *testing.T) {
	l, fc := newWindowOnFake(t, 1, time.Minute)
	ctx := context.Background()
	_, err := l.Wait(ctx, "k", 1, 0)
	require.NoError(t, err)
	done := make(chan time.Duration, 1)
	go func() {
		d, err := l.Wait(ctx, "k", 1, 0)
		assert.NoError(t, err)
		done <- d
	}()
	waitTimers(t, fc, 1)
	fc.Advance(time.Minute)
	assert.Equal(t, time.Minute, recvWithin(t, done))

	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := l.Wait(cctx, "k", 1, 0)
		errc <- err
	}()
	waitTimers(t, fc, 1)
	cancel()
	require.ErrorIs(t, recvWithin(t, errc), context.Canceled)
	l.mu.Lock()
	assert.Equal(t, 1, l.logs.M["k"].Sum, "the cancelled turn was given back")
	l.mu.Unlock()
}

// TestWindowLimitProperties: over 10,000 random schedules on a fake clock
// (arrivals, costs, budgets, cancelled turns, several keys), for every key
//
//	(a) every window (t−w, t] holds at most n granted units;
//	(b) each turn is the earliest one, after the turns given before it,
//	    that (a) allows, computed by an independent model;
//	(c) a request is refused only when that turn does not fit its budget,
//	    and then takes nothing.
func TestWindowLimitProperties(t *testing.T) {
	t.Parallel()
	seed := propertySeed(t)
	for i := range propertyRuns(propertySchedules) {
		rng := propRand(seed, i)
		n := 1 + rng.IntN(12)
		w := []time.Duration{time.Second, 7 * time.Second, time.Minute, time.Hour}[rng.IntN(4)]
		l, fc := newWindowOnFake(t, n, w)
		if err := propWindowRun(l, fc, rng, n, w); err != nil {
			t.Fatalf("schedule %d (seed %#x, n %d, window %v): %v", i, seed, n, w, err)
		}
	}
}

type propWindowGrant struct {
	at   time.Time
	cost int
	gone bool // cancelled
}

func propWindowRun(l *WindowLimit, fc *clock.Fake, rng *rand.Rand, n int, w time.Duration) error {
	grants := map[string][]propWindowGrant{}
	interval := w / time.Duration(n)
	for i := range 20 + rng.IntN(40) {
		fc.Advance(propGap(rng, interval))
		now := fc.Now()
		key := string(rune('a' + rng.IntN(2)))
		if g := grants[key]; len(g) > 0 && rng.IntN(8) == 0 {
			// Cancel a turn still in the future.
			j := rng.IntN(len(g))
			if !g[j].gone && g[j].at.After(now) {
				l.cancel(key, g[j].at, g[j].cost)
				g[j].gone = true
			}
		}
		cost := 1 + rng.IntN(n)
		maxWait, hasDeadline, deadline := propBudget(rng, 2*w)
		b := budget{maxWait: maxWait}
		if hasDeadline {
			b.deadline = now.Add(deadline)
		}
		want := propWindowTurn(grants[key], now, cost, n, w)
		turn, _, err := l.reserve(key, cost, b)
		if err != nil {
			le, lerr := propLimitErr(err)
			if lerr != nil {
				return fmt.Errorf("#%d: %v", i, lerr)
			}
			if le.Wait != want.Sub(now) {
				return fmt.Errorf("#%d: refused with wait %v, model's turn is %v away", i, le.Wait, want.Sub(now))
			}
			if b.refuse(now, key, cost, want.Sub(now)) == nil {
				return fmt.Errorf("#%d: refused (%s) but the model's turn %v fits", i, le.Reason, want.Sub(now))
			}
			continue
		}
		if !turn.Equal(want) {
			return fmt.Errorf("#%d: key %s cost %d at %v: turn %v, model says %v",
				i, key, cost, now.Sub(limiterEpoch), turn.Sub(limiterEpoch), want.Sub(limiterEpoch))
		}
		grants[key] = append(grants[key], propWindowGrant{at: turn, cost: cost})
	}
	for key, g := range grants {
		for _, end := range g {
			sum := 0
			for _, x := range g {
				if !x.gone && x.at.After(end.at.Add(-w)) && !x.at.After(end.at) {
					sum += x.cost
				}
			}
			if sum > n {
				return fmt.Errorf("key %s: %d units in the window ending at %v, limit %d", key, sum, end.at.Sub(limiterEpoch), n)
			}
		}
	}
	return nil
}

// propWindowTurn is the model: the earliest t, at or after now and after
// every turn given before, such that the grants in (t−w, t] plus cost are
// at most n. The candidates are now, the last turn, and each grant's exit
// from the window.
func propWindowTurn(g []propWindowGrant, now time.Time, cost, n int, w time.Duration) time.Time {
	floor := now
	for _, x := range g {
		if x.at.After(floor) {
			floor = x.at
		}
	}
	cands := []time.Time{floor}
	for _, x := range g {
		if e := x.at.Add(w); e.After(floor) {
			cands = append(cands, e)
		}
	}
	slices.SortFunc(cands, func(a, b time.Time) int { return a.Compare(b) })
	for _, t := range cands {
		sum := cost
		for _, x := range g {
			if !x.gone && x.at.After(t.Add(-w)) && !x.at.After(t) {
				sum += x.cost
			}
		}
		if sum <= n {
			return t
		}
	}
	panic("unreachable: the last exit empties the window")
}
