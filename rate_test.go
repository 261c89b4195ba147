package egress

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRate(t *testing.T) {
	for _, tc := range []struct {
		name          string
		rate          Rate
		wantPerSecond float64
		wantInterval  time.Duration
		wantString    string
	}{
		{"per second", PerSecond(30), 30, 33333334 * time.Nanosecond, "30/s"},
		{"per second, fractional", PerSecond(0.5), 0.5, 2 * time.Second, "0.5/s"},
		{"per minute", PerMinute(100), 100.0 / 60, 600 * time.Millisecond, "100/min"},
		{"per hour", Per(1000, time.Hour), 1000.0 / 3600, 3600 * time.Millisecond, "1000/h"},
		{"per odd period", Per(3, 2*time.Second), 1.5, 666666667 * time.Nanosecond, "3/2s"},
		{"every", Every(250 * time.Millisecond), 4, 250 * time.Millisecond, "1/250ms"},
		{"every second", Every(time.Second), 1, time.Second, "1/s"},
		{"every minute", Every(time.Minute), 1.0 / 60, time.Minute, "1/min"},
		{"faster than a nanosecond", PerSecond(1e12), 1e12, time.Nanosecond, "1e+12/s"},
		{"slower than MaxInt64", PerSecond(1e-10), 1e-10, time.Duration(math.MaxInt64), "1e-10/s"},
		{"zero period", Per(1, 0), 0, time.Nanosecond, "1/0s"},
		{"zero value", Rate{}, 0, time.Nanosecond, "0/0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.InDelta(t, tc.wantPerSecond, tc.rate.PerSecond(), 1e-12*max(1, tc.wantPerSecond))
			assert.Equal(t, tc.wantInterval, tc.rate.Interval())
			assert.Equal(t, tc.wantString, tc.rate.String())
		})
	}
}

func TestNewRejectsInvalidRate(t *testing.T) {
	for _, tc := range []struct {
		name string
		rate Rate
	}{
		{"zero", PerSecond(0)},
		{"negative", PerSecond(-1)},
		{"NaN", PerSecond(math.NaN())},
		{"+Inf", PerSecond(math.Inf(1))},
		{"-Inf", PerSecond(math.Inf(-1))},
		{"Every(0)", Every(0)},
		{"Every(-1)", Every(-1)},
		{"Per(1, -1s)", Per(1, -time.Second)},
		{"zero Rate", Rate{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, ctor := range []struct {
				name string
				new  func(Rate) (any, error)
			}{
				{"NewTokenBucket", func(r Rate) (any, error) { return NewTokenBucket(r, 1) }},
				{"NewLeakyBucket", func(r Rate) (any, error) { return NewLeakyBucket(r, 1) }},
			} {
				l, err := ctor.new(tc.rate)
				require.Error(t, err, ctor.name)
				assert.Nil(t, l, ctor.name)
				assert.ErrorIs(t, err, ErrInvalidConfig, ctor.name)
				assert.NotErrorIs(t, err, ErrRateLimited, ctor.name)
				assert.Contains(t, err.Error(), ctor.name+": rate", "the error names the setting")
				assert.Contains(t, err.Error(), tc.rate.String(), "the error names the value")
			}
		})
	}
}

func TestNewRejectsInvalidSize(t *testing.T) {
	for _, tc := range []struct {
		name     string
		new      func() (any, error)
		wantText string
	}{
		{"burst 0", func() (any, error) { return NewTokenBucket(PerSecond(1), 0) }, "NewTokenBucket: burst 0"},
		{"burst -1", func() (any, error) { return NewTokenBucket(PerSecond(1), -1) }, "NewTokenBucket: burst -1"},
		{"queueDepth -1", func() (any, error) { return NewLeakyBucket(PerSecond(1), -1) }, "NewLeakyBucket: queueDepth -1"},
		{"queueDepth MinInt", func() (any, error) { return NewLeakyBucket(PerSecond(1), math.MinInt) }, fmt.Sprintf("NewLeakyBucket: queueDepth %d", math.MinInt)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := tc.new()
			require.Error(t, err)
			assert.Nil(t, l)
			assert.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), tc.wantText)
		})
	}
}

func TestNewAcceptsValidConfig(t *testing.T) {
	tb, err := NewTokenBucket(PerSecond(1), 1)
	require.NoError(t, err)
	require.NotNil(t, tb)

	lb, err := NewLeakyBucket(PerSecond(1), 0) // depth 0: go at once or refuse
	require.NoError(t, err)
	require.NotNil(t, lb)

	var _ Limiter = tb
	var _ Limiter = lb
}

func TestLimitErrorLinks(t *testing.T) {
	for _, tc := range []struct {
		reason        Reason
		wantQueueFull bool
		wantCostHigh  bool
		wantName      string
	}{
		{ReasonDeadline, false, false, "deadline"},
		{ReasonMaxWait, false, false, "max wait"},
		{ReasonQueueFull, true, false, "queue full"},
		{ReasonCostTooHigh, false, true, "cost too high"},
		{Reason(0), false, false, "Reason(0)"},
		{Reason(42), false, false, "Reason(42)"},
	} {
		t.Run(tc.wantName, func(t *testing.T) {
			assert.Equal(t, tc.wantName, tc.reason.String())

			e := &LimitError{Key: "api.example.com", Cost: 2, Reason: tc.reason, Wait: 1500 * time.Millisecond}
			for _, err := range []error{e, fmt.Errorf("calling the provider: %w", e)} {
				assert.ErrorIs(t, err, ErrRateLimited, "every LimitError is ErrRateLimited")
				assert.Equal(t, tc.wantQueueFull, errors.Is(err, ErrQueueFull))
				assert.Equal(t, tc.wantCostHigh, errors.Is(err, ErrCostTooHigh))
				assert.NotErrorIs(t, err, ErrInvalidConfig)

				var got *LimitError
				require.ErrorAs(t, err, &got)
				assert.Same(t, e, got)
			}
		})
	}
}

func TestSentinelsLink(t *testing.T) {
	assert.ErrorIs(t, ErrQueueFull, ErrRateLimited)
	assert.ErrorIs(t, ErrCostTooHigh, ErrRateLimited)
	assert.NotErrorIs(t, ErrQueueFull, ErrCostTooHigh)
	assert.NotErrorIs(t, ErrCostTooHigh, ErrQueueFull)
	assert.NotErrorIs(t, ErrInvalidConfig, ErrRateLimited)
}

func TestLimitErrorText(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      *LimitError
		want     []string
		wantNone []string
	}{
		{
			name: "with wait",
			err:  &LimitError{Key: "acct-42", Cost: 3, Reason: ReasonMaxWait, Wait: 1500 * time.Millisecond},
			want: []string{`"acct-42"`, "cost 3", "max wait", "1.5s"},
		},
		{
			name: "deadline",
			err:  &LimitError{Key: "api.example.com", Cost: 1, Reason: ReasonDeadline, Wait: 250 * time.Millisecond},
			want: []string{`"api.example.com"`, "deadline", "250ms"},
		},
		{
			name:     "no wait when waiting cannot help",
			err:      &LimitError{Key: "k", Cost: 11, Reason: ReasonCostTooHigh},
			want:     []string{`"k"`, "cost 11", "cost too high"},
			wantNone: []string{"would wait"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.err.Error()
			for _, w := range tc.want {
				assert.Contains(t, s, w)
			}
			for _, w := range tc.wantNone {
				assert.NotContains(t, s, w)
			}
		})
	}
}
