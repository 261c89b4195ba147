package egress

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/redistest"
)

// pacerWaits starts n waits of one unit on key "k", one at a time, each
// once the one before has its turn, through next() (one limiter, or one
// instance of the fleet each), and returns a channel of their results.
func pacerWaits(t *testing.T, next func() *SharedLeakyBucket, n int) <-chan error {
	t.Helper()
	done := make(chan error, n)
	t0 := time.Now()
	for range n {
		l := next()
		before := l.Stats().Admitted
		go func() {
			_, err := l.Wait(context.Background(), "k", 1, 0)
			done <- err
		}()
		spinUntil(t, "a turn given", func() bool {
			select {
			case err := <-done:
				require.NoError(t, err, "a wait ended before its turn was given (wait %d, %v after the first)", len(done), time.Since(t0))
				done <- err // a turn that came already
			default:
			}
			return l.Stats().Admitted > before
		})
	}
	return done
}

// waitAll collects n results of pacerWaits.
func waitAll(t *testing.T, done <-chan error, n int) {
	t.Helper()
	for range n {
		require.NoError(t, <-done)
	}
}

// TestSharedPacerQueueCountsUnits: the shared pacer's queue counts the
// units waiting until their turns come, whatever the rate they were given
// at. Three turns given at 10/s, 100 to 300 ms ahead, are spread by 4 when
// the key's rate falls to 2.5/s (an advertised limit): 150 ms on, the
// first of them, due at 100 ms before, still waits, and the queue, 8 deep,
// holds five more and refuses the sixth. Each wait is another instance's,
// so that each reserves at once (a process keeps its own waiters back
// until shortly before the last turn it holds).
//
// (Had the spread left the queue's members at their old times, the first
// would have left the count at 100 ms, and the sixth been queued.)
func TestSharedPacerQueueCountsUnits(t *testing.T) {
	srv := redistest.Start(t)
	instance := func() *SharedLeakyBucket {
		return newSharedLB(t, srv.Client(t), "queue-units", PerSecond(10), 8, WithCommandTimeout(roomyTimeout))
	}
	l := instance()
	ctx := context.Background()
	t0 := time.Now()
	first := pacerWaits(t, instance, 4) // one goes at once, three queue, 100 ms apart
	advertisePerSecond(ctx, l, "k", 2.5)
	require.Equal(t, PerSecond(2.5), l.EffectiveRate("k"))
	t.Logf("the four turns given in %v", time.Since(t0))
	if time.Since(t0) > 90*time.Millisecond {
		t.Skipf("the turns were given over %v: too slow a machine for the first to be still to come", time.Since(t0))
	}
	time.Sleep(time.Until(t0.Add(150 * time.Millisecond)))
	next := pacerWaits(t, instance, 5) // eight units queued in all
	_, err := instance().Wait(ctx, "k", 1, 0)
	var le *LimitError
	require.ErrorAs(t, err, &le, "the ninth finds eight units queued")
	assert.Equal(t, ReasonQueueFull, le.Reason)
	waitAll(t, first, 4)
	waitAll(t, next, 5)
}

// TestSharedPacerQueueAfterBudgetHold: a spent budget holds the key in the
// reservation script without a word on the channel; the queue counts from
// the hold's end there, and so must the process's own check, which refuses
// at once without a round trip. A window's report of one left: the first
// request spends it, the second's turn moves to the reset, 1 s away, and
// the third, in the same process, queues behind it (depth 1).
//
// (Counted from now, the process refused the third request at once with
// ErrQueueFull: the turn it held, 1 s away, looked like 100 units queued.)
func TestSharedPacerQueueAfterBudgetHold(t *testing.T) {
	srv := redistest.Start(t)
	l := newSharedLB(t, srv.Client(t), "queue-budget", PerSecond(100), 1, WithCommandTimeout(roomyTimeout))
	ctx := context.Background()
	now := time.Now()
	l.Learn(ctx, "k", Signal{Now: now, SentAt: now, Status: 200, Quotas: []Quota{{
		Dimension: Requests, Remaining: 1, HasRemaining: true, Reset: time.Second, HasReset: true, Kind: ResetKindWindow}}})
	_, err := l.Wait(ctx, "k", 1, 0)
	require.NoError(t, err, "the budget's one unit")
	start := time.Now()
	held := pacerWaits(t, func() *SharedLeakyBucket { return l }, 1) // at the reset
	_, err = l.Wait(ctx, "k", 1, 0)
	require.NoError(t, err, "one queued behind the turn at the hold's end")
	assert.Greater(t, time.Since(start), 800*time.Millisecond, "its turn came after the budget's reset")
	waitAll(t, held, 1)
}
