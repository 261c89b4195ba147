package caller

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestCommandTimeoutPatience: a command is waited for Patience times the
// timeout while Redis is known to answer (never asked yet, or answered
// within AnsweredRecently), the timeout alone once it has been silent; and
// never less than the round trips seen lately.
func TestCommandTimeoutPatience(t *testing.T) {
	s := &Caller{Timeout: 50 * time.Millisecond}
	t0 := time.Unix(1_700_000_000, 0)
	steps := []struct {
		answered time.Time // zero: never
		now      time.Time
		want     time.Duration
	}{
		{time.Time{}, t0, 150 * time.Millisecond},
		{t0, t0.Add(10 * time.Millisecond), 150 * time.Millisecond},
		{t0, t0.Add(AnsweredRecently), 150 * time.Millisecond},
		{t0, t0.Add(AnsweredRecently + time.Millisecond), 50 * time.Millisecond},
	}
	for i, st := range steps {
		s.answered.Store(0)
		if !st.answered.IsZero() {
			s.answered.Store(st.answered.UnixNano())
		}
		assert.Equal(t, st.want, s.CommandTimeout(st.now), "step %d", i)
	}
	// Round trips of 200 ms (a busy machine): srtt 200 ms, rttvar 100 ms.
	s.rtt.observe(200 * time.Millisecond)
	s.answered.Store(t0.UnixNano())
	assert.Equal(t, 600*time.Millisecond, s.CommandTimeout(t0.Add(2*AnsweredRecently)), "srtt + 4·rttvar")
	assert.Equal(t, MaxCommandWait, s.CommandTimeout(t0), "Patience times that, at most MaxCommandWait")
}

// TestWithPatience: a command that overruns d is given up at d when
// nothing else was answered meanwhile (a Redis that answers nobody), and
// waited for, up to most, while other commands keep being answered (a
// process short of cores, whose replies wait for the scheduler).
func TestWithPatience(t *testing.T) {
	const d, most = 40 * time.Millisecond, 400 * time.Millisecond
	slow := func(reply time.Duration) func(context.Context) error {
		return func(ctx context.Context) error {
			select {
			case <-time.After(reply):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	var answered atomic.Int64

	// Nobody answered: given up at d.
	start := time.Now()
	err := WithPatience(context.Background(), d, most, &answered, slow(time.Second))
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), most/2, "given up at d, not at most")

	// Others answered every 10 ms: the reply at 150 ms is waited for.
	stop := make(chan struct{})
	go func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-tick.C:
				answered.Store(now.UnixNano())
			}
		}
	}()
	err = WithPatience(context.Background(), d, most, &answered, slow(150*time.Millisecond))
	assert.NoError(t, err, "waited for while others were answered")

	// Still bounded by most.
	start = time.Now()
	err = WithPatience(context.Background(), d, most, &answered, slow(time.Second))
	close(stop)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), most+d, "never past most")
}
