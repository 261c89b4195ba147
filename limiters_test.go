package egress

// The edge cases the two local limiters share, run through one table over
// both shapes (limiterShapes), on fake clocks.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLocalLimiterEdges(t *testing.T) {
	const capacity = 3 // the burst, or the queue depth
	for _, tc := range []struct {
		name string
		// before takes what the case needs taken first; nil: nothing.
		before  func(t *testing.T, l Limiter)
		rate    Rate
		cost    int
		maxWait time.Duration
		// deadline, when not 0, is the context's, from the clock's start.
		deadline  time.Duration
		cancelled bool

		wantReason Reason        // 0: granted at once, or wantErr
		wantErr    string        // an error that is not a LimitError, containing this
		wantWait   time.Duration // the LimitError's Wait
		wantCtxErr bool          // ctx.Err() as it is
	}{
		{name: "cost 0 is free", rate: PerSecond(1), cost: 0},
		{name: "cost at the capacity", rate: PerSecond(1), cost: capacity},
		{name: "cost above the capacity", rate: PerSecond(1), cost: capacity + 1, wantReason: ReasonCostTooHigh},
		{name: "cost far above the capacity", rate: PerSecond(1), cost: 1 << 40, wantReason: ReasonCostTooHigh},
		{name: "negative cost", rate: PerSecond(1), cost: -1, wantErr: "negative"},
		{name: "cancelled context", rate: PerSecond(1), cost: 1, cancelled: true, wantCtxErr: true},
		{
			name: "max wait: refused at once with the wait", rate: Every(time.Second), cost: 1,
			before: takeCapacity(capacity), maxWait: 500 * time.Millisecond,
			wantReason: ReasonMaxWait, wantWait: time.Second,
		},
		{
			name: "max wait 1ns short: refused", rate: Every(time.Second), cost: 1,
			before: takeCapacity(capacity), maxWait: time.Second - 1,
			wantReason: ReasonMaxWait, wantWait: time.Second,
		},
		{
			name: "deadline: refused at once with the wait", rate: Every(time.Hour), cost: 1,
			before: takeCapacity(capacity), deadline: 30 * time.Minute,
			wantReason: ReasonDeadline, wantWait: time.Hour,
		},
		{
			name: "max wait and deadline both broken: max wait first", rate: Every(time.Hour), cost: 1,
			before: takeCapacity(capacity), maxWait: time.Minute, deadline: 30 * time.Minute,
			wantReason: ReasonMaxWait, wantWait: time.Hour,
		},
	} {
		for _, shape := range limiterShapes {
			t.Run(shape.name+"/"+tc.name, func(t *testing.T) {
				// The context's deadline is on the real clock: start the
				// fake clock at the real time, so that the two agree.
				start := time.Now()
				l, fc := shape.onFake(t, tc.rate, capacity, start)
				if tc.before != nil {
					tc.before(t, l)
				}
				var waitBefore time.Duration
				if tc.before != nil {
					waitBefore = probeWouldWait(t, l, "k")
				}

				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if tc.deadline != 0 {
					ctx, cancel = context.WithDeadline(ctx, start.Add(tc.deadline))
					defer cancel()
				}
				if tc.cancelled {
					cancel()
				}
				d, err := l.Wait(ctx, "k", tc.cost, tc.maxWait)
				assert.Zero(t, d, "returns at once")
				assert.Zero(t, fc.Timers(), "never waits")

				switch {
				case tc.wantCtxErr:
					assert.Same(t, context.Canceled, err, "ctx.Err() as it is")
				case tc.wantErr != "":
					require.Error(t, err)
					assert.NotErrorIs(t, err, ErrRateLimited)
					assert.Contains(t, err.Error(), tc.wantErr)
				case tc.wantReason != 0:
					var le *LimitError
					require.ErrorAs(t, err, &le)
					assert.ErrorIs(t, err, ErrRateLimited)
					assert.Equal(t, tc.wantReason == ReasonCostTooHigh, errors.Is(err, ErrCostTooHigh))
					assert.NotErrorIs(t, err, ErrQueueFull)
					assert.Equal(t, LimitError{Key: "k", Cost: tc.cost, Reason: tc.wantReason, Wait: tc.wantWait}, *le)
				default:
					require.NoError(t, err)
				}

				// A refused, cancelled or free request takes nothing.
				switch {
				case tc.before != nil:
					assert.Equal(t, waitBefore, probeWouldWait(t, l, "k"), "the refused request took no place")
				case err != nil || tc.cost == 0:
					assert.True(t, shape.untouched(t, l, "k"), "the key's capacity is all there")
				default:
					assert.False(t, shape.untouched(t, l, "k"), "the granted request took its place")
				}
			})
		}
	}
}

// takeCapacity returns a before func that empties key "k": a token
// bucket's burst of n is taken, a leaky bucket's lane has just released
// one. Either way the next unit is one interval away.
func takeCapacity(n int) func(t *testing.T, l Limiter) {
	return func(t *testing.T, l Limiter) {
		t.Helper()
		switch l := l.(type) {
		case *TokenBucket:
			delay, err := delayOf(l.reserve("k", n, budget{}))
			require.NoError(t, err)
			require.Zero(t, delay)
		case *LeakyBucket:
			w, _, err := l.arrive("k", 1, budget{})
			require.NoError(t, err)
			require.Nil(t, w, "the first goes at once")
		default:
			t.Fatalf("no takeCapacity for %T", l)
		}
	}
}
