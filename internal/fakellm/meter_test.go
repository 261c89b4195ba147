package fakellm

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// meterStep is one step of a meter through time: at t0+at, spend (and
// remember the mark), or adjust the mark of step of by delta, then check
// the state.
type meterStep struct {
	at    time.Duration // since t0
	spend int           // units to spend; 0 for none
	of    int           // the step whose mark to adjust
	delta int           // the adjustment; 0 for none
	left  float64       // after the step
	need  int           // the units wait is asked about
	wait  time.Duration // until need units fit
	reset time.Duration // until the quota is whole
}

func runMeter(t *testing.T, m meter, steps []meterStep) {
	t.Helper()
	marks := make([]mark, len(steps))
	for i, s := range steps {
		m.at(t0.Add(s.at))
		if s.spend > 0 {
			marks[i] = m.spend(s.spend)
		}
		if s.delta != 0 {
			m.adjust(marks[s.of], s.delta)
		}
		assert.InDelta(t, s.left, m.left(), 1e-9, "step %d: left", i)
		assert.Equal(t, s.wait, m.wait(s.need), "step %d: wait(%d)", i, s.need)
		assert.Equal(t, s.reset, m.reset(), "step %d: reset", i)
	}
}

// TestBucketMeter: 60 per second refilled at 60 per minute: 1 per second.
func TestBucketMeter(t *testing.T) {
	m := newMeter(TokenBucket, 60, time.Minute, t0)
	runMeter(t, m, []meterStep{
		{at: 0, left: 60, need: 60, wait: 0, reset: 0},
		{at: 0, spend: 10, left: 50, need: 55, wait: 5 * time.Second, reset: 10 * time.Second},
		{at: 2 * time.Second, left: 52, need: 1, wait: 0, reset: 8 * time.Second},
		{at: 2 * time.Second, of: 1, delta: -4, left: 56, need: 60, wait: 4 * time.Second, reset: 4 * time.Second}, // a refund
		{at: 2 * time.Second, spend: 56, left: 0, need: 1, wait: time.Second, reset: time.Minute},
		{at: 1 * time.Second, left: 0, need: 1, wait: time.Second, reset: time.Minute},                               // time going back changes nothing
		{at: 3 * time.Second, of: 4, delta: -100, left: 60, need: 60, wait: 0, reset: 0},                             // a refund stops at the quota
		{at: 3 * time.Second, of: 4, delta: 70, left: -10, need: 1, wait: 11 * time.Second, reset: 70 * time.Second}, // debt
		{at: 13 * time.Second, left: 0, need: 60, wait: time.Minute, reset: time.Minute},
	})
}

// TestFixedWindowMeter: 10 per second, windows aligned on the second.
func TestFixedWindowMeter(t *testing.T) {
	m := newMeter(FixedWindow, 10, time.Second, t0.Add(300*ms))
	runMeter(t, m, []meterStep{
		{at: 300 * ms, spend: 6, left: 4, need: 5, wait: 700 * ms, reset: 700 * ms}, // the window began at t0
		{at: 400 * ms, of: 0, delta: -2, left: 6, need: 6, wait: 0, reset: 600 * ms},
		{at: 500 * ms, spend: 6, left: 0, need: 1, wait: 500 * ms, reset: 500 * ms},
		{at: 1100 * ms, of: 2, delta: -3, left: 10, need: 10, wait: 0, reset: 0},            // a refund from a window that is over
		{at: 1200 * ms, of: 2, delta: 5, left: 5, need: 6, wait: 800 * ms, reset: 800 * ms}, // an extra charge, now
		{at: 1200 * ms, spend: 5, left: 0, need: 1, wait: 800 * ms, reset: 800 * ms},
		{at: 1300 * ms, of: 5, delta: 6, left: -6, need: 1, wait: 700 * ms, reset: 700 * ms}, // over the quota
		{at: 2000 * ms, left: 10, need: 10, wait: 0, reset: 0},
	})
}

// TestSlidingWindowMeter: at most 10 in any second.
func TestSlidingWindowMeter(t *testing.T) {
	m := newMeter(SlidingWindow, 10, time.Second, t0)
	runMeter(t, m, []meterStep{
		{at: 0, spend: 4, left: 6, need: 8, wait: time.Second, reset: time.Second},
		{at: 300 * ms, spend: 5, left: 1, need: 5, wait: 700 * ms, reset: time.Second},
		{at: 400 * ms, of: 0, delta: -3, left: 4, need: 5, wait: 600 * ms, reset: 900 * ms},    // step 0 now holds 1
		{at: 400 * ms, of: 0, delta: -3, left: 5, need: 5, wait: 0, reset: 900 * ms},           // a refund stops at the entry's units
		{at: 1000 * ms, left: 5, need: 6, wait: 300 * ms, reset: 300 * ms},                     // step 0 expired, empty
		{at: 1100 * ms, of: 0, delta: -1, left: 5, need: 5, wait: 0, reset: 200 * ms},          // gone: nothing to refund
		{at: 1100 * ms, of: 1, delta: 3, left: 2, need: 3, wait: 200 * ms, reset: time.Second}, // an extra charge, now
		{at: 1300 * ms, left: 7, need: 10, wait: 800 * ms, reset: 800 * ms},
		{at: 2100 * ms, left: 10, need: 10, wait: 0, reset: 0},
	})
}

// TestAdmitNamesTheBindingLimit: a refusal names the limit with the
// longest wait, and a request over a whole quota is too large.
func TestAdmitNamesTheBindingLimit(t *testing.T) {
	s := newLimitSet(Config{RPM: 2, TPM: 100, OutputTPM: 50, Minute: time.Second}, t0)
	steps := []struct {
		c        cost
		ok       bool
		tooLarge bool
		by       dimension
		wait     time.Duration
	}{
		{cost{1, 60, 10, 50}, true, false, 0, 0},
		{cost{1, 30, 10, 20}, false, false, dimOutput, 400 * ms}, // tokens fit; output waits 20/50s
		{cost{1, 50, 10, 0}, false, false, dimTokens, 100 * ms},  // tokens wait 10/100 s
		{cost{1, 101, 10, 0}, false, true, dimTokens, 0},         // never fits
		{cost{1, 40, 0, 0}, true, false, 0, 0},
		{cost{1, 0, 0, 0}, false, false, dimRequests, 500 * ms}, // 2 requests spent: 1 back in 500ms
	}
	for i, st := range steps {
		v := s.admit(t0, st.c)
		assert.Equal(t, st.ok, v.ok, "step %d: ok", i)
		if !st.ok {
			assert.Equal(t, st.tooLarge, v.tooLarge, "step %d: tooLarge", i)
			assert.Equal(t, st.by, s.limits[v.by].dim, "step %d: by", i)
			assert.Equal(t, st.wait, v.wait, "step %d: wait", i)
		}
	}
	assert.Equal(t, []int{1, 2, 1}, []int{s.limits[0].refused, s.limits[1].refused, s.limits[2].refused})
}
