package egress

// Tests of the per-key pauses (cooldown.go) and of how the Transport learns
// them from responses, with and without retries. The helpers are in
// helpers_test.go and retry_test.go.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/control"
)

func TestHoldsRemaining(t *testing.T) {
	var clk clock.Clock = clock.NewFake(limiterEpoch)
	fc := clk.(*clock.Fake)
	h := newHolds(&clk)
	ctx := context.Background()

	d, now := h.remaining("a")
	assert.Zero(t, d)
	assert.True(t, now.IsZero(), "with no hold ever made, remaining reads no clock")

	require.False(t, h.Learn(ctx, "a", holdSignal(limiterEpoch, 2*time.Second)).Hold.IsZero())
	require.False(t, h.Learn(ctx, "b", holdSignal(limiterEpoch, 500*time.Millisecond)).Hold.IsZero())

	type want struct {
		key  string
		left time.Duration
	}
	for _, s := range []struct {
		advance time.Duration
		wants   []want
	}{
		{0, []want{{"a", 2 * time.Second}, {"b", 500 * time.Millisecond}, {"c", 0}}},
		{499 * time.Millisecond, []want{{"a", 1501 * time.Millisecond}, {"b", time.Millisecond}, {"c", 0}}},
		{time.Millisecond, []want{{"a", 1500 * time.Millisecond}, {"b", 0}}},
		{1499 * time.Millisecond, []want{{"a", time.Millisecond}, {"b", 0}}},
		{time.Millisecond, []want{{"a", 0}, {"b", 0}, {"c", 0}}},
		{time.Hour, []want{{"a", 0}}},
	} {
		fc.Advance(s.advance)
		for _, w := range s.wants {
			d, now := h.remaining(w.key)
			assert.Equal(t, w.left, d, "key %s at epoch+%v", w.key, fc.Now().Sub(limiterEpoch))
			assert.Equal(t, fc.Now(), now, "remaining returns the time it read")
		}
	}
}

func TestHoldsOnlyExtend(t *testing.T) {
	var clk clock.Clock = clock.NewFake(limiterEpoch)
	h := newHolds(&clk)
	ctx := context.Background()
	now := limiterEpoch
	for i, s := range []struct {
		wait     time.Duration // asked for
		extended bool
		left     time.Duration // the hold left afterwards
	}{
		{2 * time.Second, true, 2 * time.Second},
		{time.Second, false, 2 * time.Second},     // shorter: ignored
		{2 * time.Second, false, 2 * time.Second}, // the same: not an extension
		{3 * time.Second, true, 3 * time.Second},
	} {
		d := h.Learn(ctx, "k", holdSignal(now, s.wait))
		assert.Equal(t, s.extended, !d.Hold.IsZero(), "step %d", i)
		left, _ := h.remaining("k")
		assert.Equal(t, s.left, left, "step %d", i)
	}
	// Another key has its own hold.
	require.False(t, h.Learn(ctx, "other", holdSignal(now, time.Second)).Hold.IsZero())
	d, _ := h.remaining("other")
	assert.Equal(t, time.Second, d)
}

func TestHoldsSweepDropsKeysAtRest(t *testing.T) {
	var clk clock.Clock = clock.NewFake(limiterEpoch)
	h := newHolds(&clk)
	ctx := context.Background()
	now := limiterEpoch
	// 60 short holds and 4 long ones fill the table to the sweep size.
	for i := range 60 {
		h.Learn(ctx, fmt.Sprintf("short-%d", i), holdSignal(now, time.Second))
	}
	for i := range 4 {
		h.Learn(ctx, fmt.Sprintf("long-%d", i), holdSignal(now, time.Hour))
	}
	h.mu.Lock()
	assert.Len(t, h.keys, 64, "keys at rest are dropped lazily, not before the table reaches the sweep size")
	h.mu.Unlock()

	// Past the short holds, the next new key sweeps them out.
	later := now.Add(2 * time.Second)
	h.Learn(ctx, "new", holdSignal(later, time.Second))
	h.mu.Lock()
	keys := make([]string, 0, len(h.keys))
	for k := range h.keys {
		keys = append(keys, k)
	}
	sweepAt := h.sweepAt
	h.mu.Unlock()
	assert.ElementsMatch(t, []string{"long-0", "long-1", "long-2", "long-3", "new"}, keys)
	assert.Equal(t, 64, sweepAt, "the next sweep waits for the table to grow again")

	clk.(*clock.Fake).Advance(2 * time.Second)
	for _, k := range []string{"short-0", "short-59"} {
		d, _ := h.remaining(k)
		assert.Zero(t, d, "a swept key is not held")
	}
	d, _ := h.remaining("long-2")
	assert.Equal(t, time.Hour-2*time.Second, d, "a hold still running survives the sweep")
}

func TestHoldsSweepSizeGrowsWithTheTable(t *testing.T) {
	var clk clock.Clock = clock.NewFake(limiterEpoch)
	h := newHolds(&clk)
	for i := range 200 {
		h.Learn(context.Background(), fmt.Sprintf("k%d", i), holdSignal(limiterEpoch, time.Hour))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	assert.Len(t, h.keys, 200, "running holds are never dropped")
	assert.GreaterOrEqual(t, h.sweepAt, len(h.keys)/2, "the sweep is amortised: not on every hold")
}

func TestCooldownWhatPausesAKey(t *testing.T) {
	tests := []struct {
		name   string
		answer rtyAnswer
		retry  *RetryPolicy
		want   time.Duration // the pause; 0 for none
	}{
		{"429 with Retry-After", rtyA(429, "Retry-After", "1"), nil, time.Second},
		{"429 with a decimal Retry-After", rtyA(429, "Retry-After", "1.5"), nil, 1500 * time.Millisecond},
		{"503 with Retry-After", rtyA(503, "Retry-After", "2"), nil, 2 * time.Second},
		{"429 with an HTTP-date Retry-After", rtyA(429, "Retry-After", limiterEpoch.Add(30*time.Second).Format(http.TimeFormat)), nil, 30 * time.Second},
		// Remaining 0 on a success, from a provider whose reset's meaning is
		// not known yet: a short hold, and the next request tells.
		{"200 with X-RateLimit-Remaining 0 and Reset", rtyA(200, "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1"), nil, control.ProbeHold},
		{"200 with an epoch X-RateLimit-Reset", rtyA(200, "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", fmt.Sprint(limiterEpoch.Add(4*time.Second).Unix())), nil, control.ProbeHold},
		{"200 with the structured RateLimit field", rtyA(200, "RateLimit", `"default";r=0;t=5`), nil, control.ProbeHold},
		{"200 with Remaining 0 and a reset sooner than the probe", rtyA(200, "RateLimit", `"default";r=0;t=0.05`), nil, 50 * time.Millisecond},
		{"Retry-After with Remaining 0: the Retry-After", rtyA(429, "Retry-After", "1", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "3"), nil, time.Second},
		{"429 with Retry-After over the default cap: two minutes", rtyA(429, "Retry-After", "86400"), nil, 2 * time.Minute},
		{"200 with requests remaining: no pause", rtyA(200, "X-RateLimit-Remaining", "1", "X-RateLimit-Reset", "1"), nil, 0},
		{"Remaining 0 without a reset: no pause", rtyA(200, "X-RateLimit-Remaining", "0"), nil, 0},
		{"429 without Retry-After: no pause", rtyA(429), nil, 0},
		{"429 with Retry-After 0: no pause", rtyA(429, "Retry-After", "0"), nil, 0},
		{"429 with a garbage Retry-After: no pause", rtyA(429, "Retry-After", "-5"), nil, 0},
		{"500 with Retry-After: no pause", rtyA(500, "Retry-After", "1"), nil, 0},
		{"200 with Retry-After: no pause", rtyA(200, "Retry-After", "1"), nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newRecServer(t, rtyScript(tt.answer))
			rec := &obsRecorder{}
			opts := []Option{WithObserver(rec.observer())}
			if tt.retry != nil {
				opts = append(opts, WithRetry(*tt.retry))
			}
			tr, err := New(srv.pooled(t), opts...)
			require.NoError(t, err)
			fc := clock.NewFake(limiterEpoch)
			tr.clock = fc

			resp, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodGet, srv.URL+"/v1", ""))
			require.NoError(t, err)
			assert.Equal(t, tt.answer.status, resp.StatusCode, "the response comes back as it is")
			assert.Equal(t, fmt.Sprintf("attempt 1: %d", tt.answer.status), rtyRead(t, resp))
			assert.Equal(t, 1, srv.count())

			pauses, _, _ := rec.coolLog()
			left, _ := tr.holds.remaining(srv.host())
			assert.Equal(t, tt.want, left)
			if tt.want == 0 {
				assert.Empty(t, pauses)
				return
			}
			assert.Equal(t, []obsCooldown{{key: srv.host(), until: limiterEpoch.Add(tt.want)}}, pauses)
		})
	}
}

// coolLearner is a Limiter that is also a Learner, as a user's own
// fleet-wide limiter (or a decorator around one of ours) would be; it
// records the signals it is given and holds as told.
type coolLearner struct {
	err error // the Decision's Err

	mu      sync.Mutex
	waits   int
	signals []Signal
	ctxOK   []bool // whether Learn got the request's context values
}

type coolCtxKey struct{}

func (l *coolLearner) Wait(context.Context, string, int, time.Duration) (time.Duration, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.waits++
	return 0, nil
}

func (l *coolLearner) Learn(ctx context.Context, key string, s Signal) Decision {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.signals = append(l.signals, s)
	l.ctxOK = append(l.ctxOK, ctx.Value(coolCtxKey{}) == "the request's")
	if !s.HasRetryAfter || s.RetryAfter == 0 {
		return Decision{}
	}
	return Decision{Hold: s.Now.Add(s.RetryAfter), Err: l.err}
}

// TestCooldownLearnerDecides: a limiter that is a Learner gets every
// response's signal, with the request's context values, and its decision
// is the Transport's: its holds and errors reach OnCooldown, and the
// Transport keeps no holds of its own.
func TestCooldownLearnerDecides(t *testing.T) {
	tests := []struct {
		name   string
		answer rtyAnswer
		err    error
		want   time.Duration // the hold; 0 for none
	}{
		{"429 with Retry-After", rtyA(429, "Retry-After", "3"), nil, 3 * time.Second},
		{"503 with Retry-After", rtyA(503, "Retry-After", "2"), nil, 2 * time.Second},
		{"the Learner's error reaches OnCooldown", rtyA(429, "Retry-After", "3"), errors.New("redis: connection refused"), 3 * time.Second},
		{"no Retry-After: no hold", rtyA(429), nil, 0},
		{"a success", rtyA(200), nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newRecServer(t, rtyScript(tt.answer))
			lim := &coolLearner{err: tt.err}
			rec := &obsRecorder{}
			tr, err := New(srv.pooled(t), WithLimiter(lim), WithObserver(rec.observer()))
			require.NoError(t, err)
			require.Nil(t, tr.holds, "the Learner holds its keys")
			fc := clock.NewFake(limiterEpoch)
			tr.clock = fc
			ctx := context.WithValue(context.Background(), coolCtxKey{}, "the request's")

			resp, err := tr.RoundTrip(rtyRequest(t, ctx, http.MethodGet, srv.URL+"/v1", ""))
			require.NoError(t, err, "a Learner's error does not fail the request")
			assert.Equal(t, tt.answer.status, resp.StatusCode)
			rtyRead(t, resp)

			lim.mu.Lock()
			defer lim.mu.Unlock()
			assert.Equal(t, 1, lim.waits)
			require.Len(t, lim.signals, 1, "every response is heard")
			assert.Equal(t, tt.answer.status, lim.signals[0].Status)
			assert.Equal(t, limiterEpoch, lim.signals[0].Now)
			assert.Equal(t, []bool{true}, lim.ctxOK, "Learn gets the request's context values")
			pauses, _, _ := rec.coolLog()
			if tt.want == 0 {
				assert.Empty(t, pauses)
				return
			}
			assert.Equal(t, []obsCooldown{{key: srv.host(), until: limiterEpoch.Add(tt.want), err: tt.err}}, pauses)
		})
	}
}

func TestCooldownRefusesAWaitThatCannotFit(t *testing.T) {
	tests := []struct {
		name       string
		maxWait    time.Duration
		deadline   time.Duration // 0: none
		wantReason Reason
	}{
		{"the deadline ends before the pause", 0, 300 * time.Millisecond, ReasonDeadline},
		{"the pause is longer than the maximum wait", 500 * time.Millisecond, 0, ReasonMaxWait},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			paused := newRecServer(t, rtyScript(rtyA(429, "Retry-After", "1"), rtyA(200)))
			other := newRecServer(t, rtyScript(rtyA(200)))
			base := paused.pooled(t)
			rec := &obsRecorder{}
			opts := []Option{WithObserver(rec.observer())}
			if tt.maxWait > 0 {
				opts = append(opts, WithMaxWait(tt.maxWait))
			}
			tr, err := New(base, opts...)
			require.NoError(t, err)
			// A fake clock that reads the wall clock's time: the pause is
			// exactly a second, and the context's deadline is real.
			fc := clock.NewFake(time.Now())
			tr.clock = fc

			resp, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodGet, paused.URL+"/v1", ""))
			require.NoError(t, err)
			assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
			rtyRead(t, resp)

			ctx := context.Background()
			if tt.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.deadline)
				defer cancel()
			}
			body := newSpyBody("amount=5")
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, paused.URL+"/v1", body)
			require.NoError(t, err)
			start := time.Now()
			resp, err = tr.RoundTrip(req)
			elapsed := time.Since(start)

			require.Error(t, err)
			assert.Nil(t, resp)
			assert.Less(t, elapsed, rtyPromptly, "refused at once, not after waiting")
			assert.ErrorIs(t, err, ErrRateLimited)
			var le *LimitError
			require.ErrorAs(t, err, &le)
			assert.Equal(t, LimitError{Key: paused.host(), Cost: 1, Reason: tt.wantReason, Wait: time.Second}, *le)
			assert.True(t, body.closed(), "the refused request's body is closed")
			assert.Equal(t, 1, paused.count(), "the refused request is not sent")
			_, rejects, _ := rec.coolLog()
			require.Len(t, rejects, 1)
			var rejected *LimitError
			require.ErrorAs(t, rejects[0], &rejected)
			assert.Same(t, le, rejected, "OnReject gets the error RoundTrip returns")

			// Another key is not paused.
			req, err = http.NewRequestWithContext(ctx, http.MethodGet, other.URL+"/v1", nil)
			require.NoError(t, err)
			resp, err = tr.RoundTrip(req)
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			rtyRead(t, resp)
		})
	}
}

func TestCooldownCancelWhileWaitingOutAPause(t *testing.T) {
	srv := newRecServer(t, rtyScript(rtyA(429, "Retry-After", "5"), rtyA(200)))
	tr, err := New(srv.pooled(t))
	require.NoError(t, err)
	fc := clock.NewFake(time.Now())
	tr.clock = fc

	resp, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodGet, srv.URL+"/v1", ""))
	require.NoError(t, err)
	rtyRead(t, resp)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	req := rtyRequest(t, ctx, http.MethodGet, srv.URL+"/v1", "")
	go func() {
		resp, err := tr.RoundTrip(req)
		if resp != nil {
			resp.Body.Close()
			err = fmt.Errorf("got a response, status %d", resp.StatusCode)
		}
		done <- err
	}()
	if !timersPending(fc, 1) {
		cancel()
		<-done
		t.Fatal("the second request did not wait out the pause")
	}
	cancel()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, context.Canceled)
		var le *LimitError
		assert.False(t, errors.As(err, &le), "a cancelled wait is the context's error, not a refusal")
	case <-time.After(5 * time.Second):
		fc.Advance(time.Hour)
		<-done
		t.Fatal("cancelling did not end the wait")
	}
	assert.Equal(t, 1, srv.count())
	assert.Zero(t, fc.Timers(), "the pause's timer is stopped")
}

func TestRealTimeCooldownHoldsTheKey(t *testing.T) {
	tests := []struct {
		name  string
		first rtyAnswer
		hold  time.Duration
	}{
		{"429 with Retry-After: 1", rtyA(429, "Retry-After", "1"), time.Second},
		// A provider whose reset's meaning is not known yet: a short hold,
		// and the next request tells (see TestControllerSteps).
		{"200 with X-RateLimit-Remaining: 0 and X-RateLimit-Reset: 1", rtyA(200, "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1"), control.ProbeHold},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			paused := newRecServer(t, rtyScript(tt.first, rtyA(200)))
			other := newRecServer(t, rtyScript(rtyA(200)))
			rec := &obsRecorder{}
			tr, err := New(paused.pooled(t), WithObserver(rec.observer())) // no WithRetry
			require.NoError(t, err)

			before := time.Now()
			resp, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodGet, paused.URL+"/v1", ""))
			require.NoError(t, err)
			assert.Equal(t, tt.first.status, resp.StatusCode)
			rtyRead(t, resp)
			after := time.Now()
			require.Equal(t, 1, paused.count(), "without WithRetry nothing is retried")

			pauses, _, _ := rec.coolLog()
			require.Len(t, pauses, 1)
			assert.Equal(t, paused.host(), pauses[0].key)
			until := pauses[0].until
			assert.False(t, until.Before(before.Add(tt.hold)), "held for the time decided")
			assert.False(t, until.After(after.Add(tt.hold)), "and no longer")

			// Then two requests from other goroutines: one to the paused
			// key, one to another key.
			type result struct {
				start, end time.Time
				err        error
			}
			send := func(target string, out chan<- result) {
				start := time.Now()
				req, err := http.NewRequest(http.MethodGet, target, nil)
				if err == nil {
					var resp *http.Response
					if resp, err = tr.RoundTrip(req); err == nil {
						resp.Body.Close()
						if resp.StatusCode != http.StatusOK {
							err = fmt.Errorf("status %d", resp.StatusCode)
						}
					}
				}
				out <- result{start, time.Now(), err}
			}
			onPaused, onOther := make(chan result, 1), make(chan result, 1)
			go send(paused.URL+"/v1", onPaused)
			go send(other.URL+"/v1", onOther)
			rp, ro := <-onPaused, <-onOther

			require.NoError(t, rp.err)
			require.NoError(t, ro.err)
			held := rp.end.Sub(rp.start)
			assert.GreaterOrEqual(t, held, until.Sub(rp.start)-time.Millisecond, "held until the pause ends")
			assert.Greater(t, held, tt.hold*7/10, "held about the time decided")
			assert.Less(t, held, tt.hold+800*time.Millisecond, "and not much more")
			assert.Less(t, ro.end.Sub(ro.start), 500*time.Millisecond, "another key is not held")

			hits := paused.arrivals()
			require.Len(t, hits, 2)
			assert.GreaterOrEqual(t, hits[1].at.Sub(hits[0].at), tt.hold-5*time.Millisecond, "measured at the server")
			assert.False(t, hits[1].at.Before(until.Add(-5*time.Millisecond)), "nothing reaches the server before the pause ends")
			_, _, waits := rec.coolLog()
			require.Len(t, waits, 1, "OnWait reports the held request")
			assert.InDelta(t, float64(until.Sub(rp.start)), float64(waits[0]), float64(50*time.Millisecond))
		})
	}
}
