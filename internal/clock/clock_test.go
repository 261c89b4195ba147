package clock

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

var epoch = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// fired returns the value a timer has fired with, or false when it has not
// fired.
func fired(tm Timer) (time.Time, bool) {
	select {
	case v := <-tm.C():
		return v, true
	default:
		return time.Time{}, false
	}
}

func TestFakeNowAndAdvance(t *testing.T) {
	f := NewFake(epoch)
	assert.Equal(t, epoch, f.Now())
	f.Advance(1500 * time.Millisecond)
	assert.Equal(t, epoch.Add(1500*time.Millisecond), f.Now())
	f.Advance(0)
	assert.Equal(t, epoch.Add(1500*time.Millisecond), f.Now())
}

func TestFakeTimersFireInOrderOnAdvance(t *testing.T) {
	f := NewFake(epoch)
	// Made out of order on purpose: they fire by deadline.
	t3 := f.NewTimer(3 * time.Second)
	t1 := f.NewTimer(1 * time.Second)
	t2 := f.NewTimer(2 * time.Second)
	t2b := f.NewTimer(2 * time.Second)
	require.Equal(t, 4, f.Timers())

	for _, step := range []struct {
		advance   time.Duration
		wantFired []Timer
		wantAt    []time.Duration // the value each fired timer sends: its deadline
		wantLeft  int
	}{
		{advance: 999 * time.Millisecond, wantLeft: 4},
		{advance: time.Millisecond, wantFired: []Timer{t1}, wantAt: []time.Duration{time.Second}, wantLeft: 3},
		{advance: 500 * time.Millisecond, wantLeft: 3},
		// One Advance past several deadlines fires them all, each with its
		// own deadline, not the clock's new time.
		{advance: 10 * time.Second, wantFired: []Timer{t2, t2b, t3}, wantAt: []time.Duration{2 * time.Second, 2 * time.Second, 3 * time.Second}, wantLeft: 0},
	} {
		f.Advance(step.advance)
		for i, tm := range step.wantFired {
			v, ok := fired(tm)
			require.True(t, ok, "timer %d should have fired", i)
			assert.Equal(t, epoch.Add(step.wantAt[i]), v)
		}
		for _, tm := range []Timer{t1, t2, t2b, t3} {
			_, ok := fired(tm)
			assert.False(t, ok, "a timer fires once, when it falls due")
		}
		assert.Equal(t, step.wantLeft, f.Timers())
	}
	// Stop after firing reports false.
	assert.False(t, t1.Stop())
}

func TestFakeTimerStop(t *testing.T) {
	f := NewFake(epoch)
	a := f.NewTimer(time.Second)
	b := f.NewTimer(2 * time.Second)
	require.Equal(t, 2, f.Timers())

	assert.True(t, a.Stop(), "stopping a pending timer")
	assert.Equal(t, 1, f.Timers())
	assert.False(t, a.Stop(), "stopping it again")

	f.Advance(5 * time.Second)
	_, ok := fired(a)
	assert.False(t, ok, "a stopped timer never fires")
	v, ok := fired(b)
	assert.True(t, ok)
	assert.Equal(t, epoch.Add(2*time.Second), v)
	assert.Zero(t, f.Timers())
}

func TestFakeNewTimerNotPositiveFiresAtOnce(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second} {
		t.Run(d.String(), func(t *testing.T) {
			f := NewFake(epoch)
			tm := f.NewTimer(d)
			v, ok := fired(tm)
			require.True(t, ok)
			assert.Equal(t, epoch, v, "fires with the clock's time")
			assert.Zero(t, f.Timers(), "is never pending")
			assert.False(t, tm.Stop())
		})
	}
}

func TestFakeWaitTimers(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := NewFake(epoch)

	f.WaitTimers(0) // returns at once

	done := make(chan struct{})
	go func() {
		defer close(done)
		f.WaitTimers(2)
	}()

	f.NewTimer(time.Second)
	select {
	case <-done:
		t.Fatal("WaitTimers(2) returned with one timer pending")
	default:
	}
	f.NewTimer(time.Second)
	<-done // returns once the second timer is pending
	assert.Equal(t, 2, f.Timers())
}

func TestFakeWaitTimersWakesParkedGoroutine(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := NewFake(epoch)
	got := make(chan time.Time)
	go func() {
		tm := f.NewTimer(time.Minute)
		got <- <-tm.C()
	}()
	f.WaitTimers(1) // the goroutine is parked on its timer
	f.Advance(time.Minute)
	assert.Equal(t, epoch.Add(time.Minute), <-got)
}

func TestRealClock(t *testing.T) {
	var c Clock = Real{}

	before := time.Now()
	now := c.Now()
	assert.False(t, now.Before(before))
	assert.WithinDuration(t, time.Now(), now, time.Second)

	tm := c.NewTimer(time.Millisecond)
	v := <-tm.C()
	assert.False(t, v.Before(before.Add(time.Millisecond)))
	assert.False(t, tm.Stop(), "a fired timer cannot be stopped")

	long := c.NewTimer(time.Hour)
	assert.True(t, long.Stop(), "a pending timer can be stopped")
}

// TestRealNowFromItsAnchor: Real's readings, an anchor moved on by the
// monotonic clock, keep a monotonic reading, never go back, and stay with
// the wall clock; an anchor a second old, or from a clock that went back,
// is taken again.
func TestRealNowFromItsAnchor(t *testing.T) {
	prev := Real{}.Now()
	for range 1000 {
		before := time.Now()
		now := Real{}.Now()
		after := time.Now()
		require.False(t, now.Before(prev), "a reading went back")
		require.False(t, now.Before(before) || now.After(after), "a reading outside the wall clock's: %v not in [%v, %v]", now, before, after)
		require.NotEqual(t, now, now.Round(0), "a reading without its monotonic clock")
		// Its wall clock reading: the anchor's moved on, which a slewed
		// wall clock leaves within half a millisecond a second.
		require.WithinDuration(t, time.Now().Round(0), now.Round(0), 10*time.Millisecond)
		prev = now
	}

	for _, age := range []time.Duration{time.Second, 2 * time.Hour, -time.Minute} {
		old := time.Now().Add(-age) // (Add keeps the monotonic reading)
		anchor.Store(&old)
		before := time.Now()
		now := Real{}.Now()
		assert.False(t, now.Before(before), "an anchor %v old was used", age)
		assert.False(t, anchor.Load().Before(before), "an anchor %v old was not taken again", age)
	}
}
