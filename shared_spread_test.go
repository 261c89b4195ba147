package egress

import (
	"context"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/redistest"
)

// TestSharedDecreaseSpreadsGivenTurns: instance B's waiters hold turns given
// at 100/s, a turn every 10 ms for 0.4 s; a throttle heard by instance A
// lowers the key's rate. The turns still to come go at the new rate from the
// decrease on (the script moves the bucket's last turn, and tells every
// instance on the channel), not at the old one, and a turn given after the
// decrease queues behind them.
func TestSharedDecreaseSpreadsGivenTurns(t *testing.T) {
	srv := redistest.Start(t)
	opts := []SharedOption{WithCommandTimeout(roomyTimeout)}
	a := newSharedTB(t, srv.Client(t), "spread", PerSecond(100), 1, opts...)
	b := newSharedTB(t, srv.Client(t), "spread", PerSecond(100), 1, opts...)
	ctx := context.Background()
	const key, waiters = "api.example.com", 40

	var (
		mu   sync.Mutex
		done []time.Time
		wg   sync.WaitGroup
	)
	wait := func() {
		defer wg.Done()
		_, err := b.Wait(ctx, key, 1, 0)
		assert.NoError(t, err)
		mu.Lock()
		done = append(done, time.Now())
		mu.Unlock()
	}
	start := time.Now()
	for range waiters {
		wg.Add(1)
		go wait()
	}
	// Every waiter has its turn once the first few have gone.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(done) >= 3
	}, time.Second, time.Millisecond)
	at := time.Now()
	d := a.Learn(ctx, key, Signal{Status: http.StatusTooManyRequests, Now: at, SentAt: at.Add(-time.Millisecond)})
	require.Less(t, d.New.PerSecond(), d.Old.PerSecond(), "the throttle lowers the rate: %+v", d)
	factor := d.Old.PerSecond() / d.New.PerSecond()
	wg.Add(1)
	go wait() // a turn given after the decrease
	wg.Wait()

	sort.Slice(done, func(i, j int) bool { return done[i].Before(done[j]) })
	lastDue := start.Add(time.Duration(waiters-1) * 10 * time.Millisecond) // at the old rate
	spread := at.Add(time.Duration(float64(lastDue.Sub(at)) * factor))
	t.Logf("decrease at %v by %.2f; the old rate's last turn due at %v, spread to %v; the last two went at %v, %v",
		at.Sub(start), factor, lastDue.Sub(start), spread.Sub(start), done[waiters-1].Sub(start), done[waiters].Sub(start))
	assert.True(t, done[waiters-1].After(spread.Add(-40*time.Millisecond)),
		"the last turn given before the decrease goes at the new rate: at %v, spread to %v (%v at the old rate)",
		done[waiters-1].Sub(start), spread.Sub(start), lastDue.Sub(start))
	unit := time.Duration(float64(time.Second) / d.New.PerSecond())
	assert.GreaterOrEqual(t, done[waiters].Sub(done[waiters-1]), unit/2,
		"the turn given after the decrease queues behind the spread ones")
}

// TestSharedHearsDecreases: the channel's decrease message, "<id>
// x<factor> <us until the spread starts>", spreads a turn given before it;
// anything else that is not a hold is ignored.
func TestSharedHearsDecreases(t *testing.T) {
	srv := redistest.Start(t)
	l := newSharedTB(t, srv.Client(t), "hear", PerSecond(100), 1, WithCommandTimeout(roomyTimeout))
	s := l.shared
	given := s.clock.Now()
	due := given.Add(time.Second)
	for _, p := range []string{"k x", "k x2", "k xNaN 0", "k x0.5 0", "k x-2 0", "k x+Inf 0", "k x2 -1", "k x2 9223372036854775807", "k", "k y2 0", "x2 0"} {
		s.hear(p)
	}
	assert.InDelta(t, time.Second, s.lag("k", given, due), float64(50*time.Millisecond), "nothing spreads")
	s.hear("k x2 0")
	assert.InDelta(t, 2*time.Second, s.lag("k", given, due), float64(50*time.Millisecond), "spread by 2 from the decrease")
	s.hear("j x2 500000")
	assert.InDelta(t, 1500*time.Millisecond, s.lag("j", given, due), float64(50*time.Millisecond), "spread by 2 from the hold's end, 0.5 s on")
	assert.InDelta(t, time.Second, s.lag("i", given, due), float64(50*time.Millisecond), "another key")
}

// TestSharedFleetEstimate: the fleet's refusals, counted in Redis, with the
// turns it was granted, estimate the limit when no instance has seen
// enough refusals for an estimate of its own: a throttle after 4 of the
// last second's 40 turns were refused lowers the rate to just under 36/40
// of it, not by beta.
func TestSharedFleetEstimate(t *testing.T) {
	srv := redistest.Start(t)
	opts := []SharedOption{WithCommandTimeout(roomyTimeout)}
	a := newSharedTB(t, srv.Client(t), "estimate", PerSecond(100), 1, opts...)
	b := newSharedTB(t, srv.Client(t), "estimate", PerSecond(100), 1, opts...)
	ctx := context.Background()
	const key = "api.example.com"
	for range 40 { // 0.4 s of turns at 100/s
		_, err := b.Wait(ctx, key, 1, 0)
		require.NoError(t, err)
	}
	// Four refusals, each heard by another instance. The first lowers by
	// beta (no estimate yet); the next three were sent before that
	// decrease: they lower nothing, but they count.
	now := time.Now()
	d := a.Learn(ctx, key, Signal{Status: http.StatusTooManyRequests, Now: now, SentAt: now.Add(-time.Millisecond)})
	require.Equal(t, "throttled", d.Why)
	assert.InDelta(t, 70, d.New.PerSecond(), 0.5, "the first: by beta")
	for range 3 {
		now := time.Now()
		d := b.Learn(ctx, key, Signal{Status: http.StatusTooManyRequests, Now: now, SentAt: now.Add(-100 * time.Millisecond)})
		assert.Equal(t, d.Old, d.New, "sent before the decrease: the same episode")
	}
	time.Sleep(100 * time.Millisecond) // a request sent after the decrease, not among the first after its hold (a storm's sign)
	now = time.Now()
	d = b.Learn(ctx, key, Signal{Status: http.StatusTooManyRequests, Now: now, SentAt: now.Add(-time.Millisecond)})
	require.Equal(t, "throttled", d.Why)
	old := d.Old.PerSecond()
	t.Logf("%v → %v", d.Old, d.New)
	// 5 of the 40 turns refused (the last one counts too): 35/40 of the rate, less 8%.
	assert.InDelta(t, old*35/40*0.92, d.New.PerSecond(), 1.5, "the fleet's estimate: 35/40 of %.1f/s, less the margin", old)
}
