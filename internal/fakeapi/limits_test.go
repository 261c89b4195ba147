package fakeapi

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const ms = time.Millisecond

// meterStep is one step of a meter through time: at t0+at, spend n units
// if they fit (n = 0 only looks), then check the state.
type meterStep struct {
	at   time.Duration // since t0
	n    int           // units to spend; 0 to look only
	ok   bool          // whether n fit
	left int           // after the step
	wait time.Duration // until 1 unit fits, after the step
	full time.Duration // until the whole quota is back, after the step
}

func runMeter(t *testing.T, m meter, t0 time.Time, steps []meterStep) {
	t.Helper()
	for i, s := range steps {
		m.at(t0.Add(s.at))
		if s.n > 0 {
			ok := m.room(s.n)
			assert.Equal(t, s.ok, ok, "step %d: room(%d)", i, s.n)
			if ok {
				m.spend(s.n)
			}
		}
		assert.Equal(t, s.left, m.left(), "step %d: left", i)
		assert.Equal(t, s.wait, m.wait(1), "step %d: wait(1)", i)
		assert.Equal(t, s.full, m.full(), "step %d: full", i)
	}
}

// TestFixedWindow: 3 per second, the quota back all at once at the
// window's end, windows aligned on the second.
func TestFixedWindow(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	m := newFixedWindow(3, time.Second, t0.Add(300*ms))
	runMeter(t, m, t0, []meterStep{
		{300 * ms, 1, true, 2, 0, 700 * ms}, // the window began at t0, not at the first request
		{300 * ms, 1, true, 1, 0, 700 * ms},
		{400 * ms, 1, true, 0, 600 * ms, 600 * ms},
		{900 * ms, 1, false, 0, 100 * ms, 100 * ms},
		{800 * ms, 1, false, 0, 100 * ms, 100 * ms}, // time going back changes nothing
		{1000 * ms, 1, true, 2, 0, time.Second},     // all three back at once
		{1000 * ms, 2, true, 0, time.Second, time.Second},
		{2500 * ms, 0, false, 3, 0, 500 * ms}, // an idle window skipped
		{2600 * ms, 4, false, 3, 0, 400 * ms}, // more than the quota never fits
	})
	assert.Equal(t, 400*ms, m.wait(4), "a cost above the quota waits for the window's end")
}

// TestSlidingWindow: at most 3 in any second; a unit spent at t is back at
// t+1s.
func TestSlidingWindow(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	m := newSlidingWindow(3, time.Second, t0)
	runMeter(t, m, t0, []meterStep{
		{0, 1, true, 2, 0, time.Second},
		{200 * ms, 1, true, 1, 0, time.Second},
		{400 * ms, 1, true, 0, 600 * ms, time.Second},
		{900 * ms, 1, false, 0, 100 * ms, 500 * ms},
		{700 * ms, 1, false, 0, 100 * ms, 500 * ms}, // time going back changes nothing
		{1000 * ms, 1, true, 0, 200 * ms, time.Second},
		{1100 * ms, 0, false, 0, 100 * ms, 900 * ms},
		{1200 * ms, 1, true, 0, 200 * ms, time.Second},
	})
	// Spent at 400ms, 1000ms, 1200ms.
	assert.Equal(t, 800*ms, m.wait(2), "two units: after the second oldest leaves")
	assert.Equal(t, time.Second, m.wait(4), "above the quota: until all are back")
	m.at(t0.Add(5 * time.Second))
	assert.Equal(t, 3, m.left())
	assert.Zero(t, m.full())
	assert.Empty(t, m.spent, "expired units are dropped")
}

// TestWindowsAtTheBoundary: a fixed window lets 2N through around its end;
// a sliding window never more than N in any window.
func TestWindowsAtTheBoundary(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	for _, c := range []struct {
		m    meter
		want int
	}{
		{newFixedWindow(5, time.Second, t0), 10},
		{newSlidingWindow(5, time.Second, t0), 5},
	} {
		var accepted []time.Time
		for i := range 40 { // every 50ms from 750ms to 2.7s
			now := t0.Add(750*ms + time.Duration(i)*50*ms)
			c.m.at(now)
			if c.m.room(1) {
				c.m.spend(1)
				accepted = append(accepted, now)
			}
		}
		assert.Equal(t, c.want, MaxInWindow(accepted, time.Second), "%T", c.m)
	}
}

func TestSetRateOnWindows(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	s := newLimitSet(resolveNames([]Limit{Fixed(10, time.Minute)}), t0)
	s.setRate(0.5, t0)
	assert.Equal(t, 30, s.limits[0].Quota, "0.5/s over a minute")
	assert.Equal(t, 0.5, s.limits[0].perSecond())
	s.setRate(0.001, t0)
	assert.Equal(t, 1, s.limits[0].Quota, "at least 1")
	ok, _, _ := s.fit(t0, cost{})
	require.True(t, ok)
	s.charge(cost{})
	ok, by, _ := s.fit(t0, cost{})
	assert.False(t, ok)
	assert.Equal(t, 0, by)
}

// setStep is one request to a limitSet: fit, then charge if it fits.
type setStep struct {
	at   time.Duration
	c    cost
	ok   bool
	by   int           // when refused
	wait time.Duration // when refused
	left []int         // every limit's left after the step
}

func runSet(t *testing.T, s *limitSet, t0 time.Time, steps []setStep) {
	t.Helper()
	for i, st := range steps {
		ok, by, wait := s.fit(t0.Add(st.at), st.c)
		assert.Equal(t, st.ok, ok, "step %d: fits", i)
		if ok {
			s.charge(st.c)
		} else {
			assert.Equal(t, st.by, by, "step %d: refused by", i)
			assert.Equal(t, st.wait, wait, "step %d: wait", i)
		}
		var left []int
		for _, r := range s.read(ResetFull) {
			left = append(left, r.remaining)
		}
		assert.Equal(t, st.left, left, "step %d: left", i)
	}
}

// TestSeveralLimits: 4/s with a burst of 2, and 3 per second in a fixed
// window: a request counts against both only when both have room.
func TestSeveralLimits(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	s := newLimitSet(resolveNames([]Limit{Bucket(4, 2), Fixed(3, time.Second)}), t0)
	runSet(t, &s, t0, []setStep{
		{0, cost{}, true, 0, 0, []int{1, 2}},
		{0, cost{}, true, 0, 0, []int{0, 1}},
		{0, cost{}, false, 0, 250 * ms, []int{0, 1}}, // the bucket refuses; the window is not charged
		{250 * ms, cost{}, true, 0, 0, []int{0, 0}},
		{300 * ms, cost{}, false, 1, 700 * ms, []int{0, 0}}, // both refuse; the window holds it longer
		{900 * ms, cost{}, false, 1, 100 * ms, []int{2, 0}}, // the window refuses; the bucket is not charged
		{1000 * ms, cost{}, true, 0, 0, []int{1, 2}},        // the window is back whole
		{1000 * ms, cost{}, true, 0, 0, []int{0, 1}},
		{1000 * ms, cost{}, false, 0, 250 * ms, []int{0, 1}},
	})
}

// TestTokenLimits: requests, tokens, and input tokens at once; a request
// too costly for one dimension spends nothing in any.
func TestTokenLimits(t *testing.T) {
	t0 := time.Unix(1_700_000_040, 0) // on the minute
	s := newLimitSet(resolveNames([]Limit{
		{Quota: 10, Rate: 1},
		Fixed(200, time.Minute).Of(Tokens),
		Sliding(60, time.Minute).Of(InputTokens),
	}), t0)
	runSet(t, &s, t0, []setStep{
		{0, cost{input: 30, output: 50}, true, 0, 0, []int{9, 120, 30}},
		{time.Second, cost{input: 10, output: 150}, false, 1, 59 * time.Second, []int{10, 120, 30}},
		{time.Second, cost{input: 40, output: 0}, false, 2, 59 * time.Second, []int{10, 120, 30}},
		{time.Second, cost{input: 20, output: 0}, true, 0, 0, []int{9, 100, 10}},
		{time.Minute, cost{input: 0, output: 100}, true, 0, 0, []int{9, 100, 40}}, // a new window; the input at t0 has left
	})
	assert.Equal(t, []string{"requests-0", "tokens-1", "input-tokens-2"},
		[]string{s.limits[0].Name, s.limits[1].Name, s.limits[2].Name})
}

// TestResetModes: a bucket's and a sliding window's reset is until full or
// until the next unit; a fixed window's is its end either way.
func TestResetModes(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	s := newLimitSet(resolveNames([]Limit{Bucket(2, 4), Sliding(3, time.Second), Fixed(5, 10*time.Second)}), t0)
	for range 3 {
		ok, _, _ := s.fit(t0, cost{})
		require.True(t, ok)
		s.charge(cost{})
	}
	s.fit(t0.Add(100*ms), cost{})
	resets := func(m ResetMode) []time.Duration {
		var ds []time.Duration
		for _, r := range s.read(m) {
			ds = append(ds, r.reset)
		}
		return ds
	}
	// The bucket holds 1.2 of 4; the window spent 3 at t0; the fixed window ends at t0+10s.
	assert.Equal(t, []time.Duration{1400 * ms, 900 * ms, 9900 * ms}, resets(ResetFull))
	assert.Equal(t, []time.Duration{0, 900 * ms, 9900 * ms}, resets(ResetNext))
}

func TestTightest(t *testing.T) {
	rs := []reading{
		{Limit: Limit{Name: "a"}, remaining: 5, reset: time.Second},
		{Limit: Limit{Name: "b"}, remaining: 2, reset: time.Second},
		{Limit: Limit{Name: "c"}, remaining: 2, reset: time.Minute},
		{Limit: Limit{Name: "t", Unit: Tokens}, remaining: 0},
	}
	r, ok := tightest(rs, Requests)
	assert.True(t, ok)
	assert.Equal(t, "c", r.Name, "fewest left, then the latest reset")
	r, ok = tightest(rs, Tokens)
	assert.True(t, ok)
	assert.Equal(t, "t", r.Name)
	_, ok = tightest(rs, OutputTokens)
	assert.False(t, ok)
}

func TestLimitValidation(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"rate with limits", Config{Rate: 1, Burst: 1, Limits: []Limit{Bucket(1, 1)}}, []string{"must be zero when Limits are set"}},
		{"bucket without rate", Config{Limits: []Limit{{Quota: 1}}}, []string{"Limits[0]: Rate 0"}},
		{"bucket with window", Config{Limits: []Limit{{Quota: 1, Rate: 1, Window: time.Second}}}, []string{"Limits[0]: Window 1s"}},
		{"window with rate", Config{Limits: []Limit{{Kind: FixedWindow, Quota: 1, Rate: 1, Window: time.Second}}}, []string{"Limits[0]: Rate 1"}},
		{"short window", Config{Limits: []Limit{Sliding(1, time.Microsecond)}}, []string{"Window 1µs"}},
		{"zero quota", Config{Limits: []Limit{Bucket(1, 1), Fixed(0, time.Second)}}, []string{"Limits[1]: Quota 0"}},
		{"unknown kind", Config{Limits: []Limit{{Kind: 7, Quota: 1}}}, []string{"Kind 7"}},
		{"unknown unit", Config{Limits: []Limit{{Unit: 9, Quota: 1, Rate: 1}}}, []string{"Unit 9"}},
		{"same name", Config{Limits: []Limit{Bucket(1, 1).Named("x"), Fixed(1, time.Second).Named("x")}}, []string{`Name "x": used twice`}},
		{"reset mode", Config{Rate: 1, Burst: 1, BucketReset: 5}, []string{"BucketReset 5"}},
		{"dialect", Config{Rate: 1, Burst: 1, Dialect: 99}, []string{"Dialect 99"}},
		{"billing share", Config{Rate: 1, Burst: 1, InsufficientQuota: 2}, []string{"InsufficientQuota 2"}},
		{"storm", Config{Rate: 1, Burst: 1, Storm: Storm{Share: -1, Status: 500, RetryAfter: -1}},
			[]string{"Storm.Share -1", "Storm.Status 500", "Storm.RetryAfter -1ns"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			api, err := Start(c.cfg)
			require.Error(t, err)
			assert.Nil(t, api)
			for _, w := range c.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}
