package fakeapi

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestBucket steps a bucket of 2/s, burst 3, through time: no clock.
func TestBucket(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	b := newBucket(2, 3, t0)
	steps := []struct {
		at        time.Duration // since t0
		op        string        // "take" or "setRate"
		rate      float64       // for setRate
		ok        bool          // for take
		remaining int           // after the step
		next      time.Duration // untilNext after the step
		full      time.Duration // untilFull after the step
	}{
		{0, "take", 0, true, 2, 0, 500 * time.Millisecond},
		{0, "take", 0, true, 1, 0, time.Second},
		{0, "take", 0, true, 0, 500 * time.Millisecond, 1500 * time.Millisecond},
		{0, "take", 0, false, 0, 500 * time.Millisecond, 1500 * time.Millisecond},
		{250 * time.Millisecond, "take", 0, false, 0, 250 * time.Millisecond, 1250 * time.Millisecond},
		{500 * time.Millisecond, "take", 0, true, 0, 500 * time.Millisecond, 1500 * time.Millisecond},
		{400 * time.Millisecond, "take", 0, false, 0, 500 * time.Millisecond, 1500 * time.Millisecond}, // time going back refills nothing
		{10 * time.Second, "take", 0, true, 2, 0, 500 * time.Millisecond},                              // capped at the burst
		{10 * time.Second, "setRate", 10, false, 2, 0, 100 * time.Millisecond},
		{10*time.Second + 50*time.Millisecond, "take", 0, true, 1, 0, 150 * time.Millisecond}, // 2.5 tokens, one taken
	}
	for i, s := range steps {
		now := t0.Add(s.at)
		switch s.op {
		case "take":
			assert.Equal(t, s.ok, b.take(now), "step %d: take", i)
		case "setRate":
			b.setRate(s.rate, now)
		}
		assert.Equal(t, s.remaining, b.remaining(), "step %d: remaining", i)
		assert.InDelta(t, s.next, b.untilNext(), float64(time.Microsecond), "step %d: untilNext", i)
		assert.InDelta(t, s.full, b.untilFull(), float64(time.Microsecond), "step %d: untilFull", i)
	}
}

func TestCeilSeconds(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int64
	}{
		{-time.Second, 0}, {0, 0}, {time.Nanosecond, 1}, {time.Second, 1},
		{time.Second + 1, 2}, {1500 * time.Millisecond, 2}, {30 * time.Second, 30},
	} {
		assert.Equal(t, c.want, ceilSeconds(c.d), "ceilSeconds(%v)", c.d)
	}
}
