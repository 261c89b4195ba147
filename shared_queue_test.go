package egress

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/redistest"
)

// TestSharedPacerQueueAfterRateRise: the shared pacer's queue depth is in
// units. Turns given at a low rate reach further than the depth would at
// a higher one; when the key's rate rises (an advertised limit raised, a
// storm's decreases undone), a request that finds fewer units queued than
// the depth is queued, not refused with ErrQueueFull.
func TestSharedPacerQueueAfterRateRise(t *testing.T) {
	srv := redistest.Start(t)
	l := newSharedLB(t, srv.Client(t), "queue-rise", PerSecond(100), 8, WithCommandTimeout(roomyTimeout))
	ctx := context.Background()
	advertisePerSecond(ctx, l, "k", 10)
	require.Equal(t, PerSecond(10), l.EffectiveRate("k"))
	var wg sync.WaitGroup
	for range 4 { // 4 units queued at 10/s: turns up to 300 ms ahead
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := l.Wait(ctx, "k", 1, 0)
			require.NoError(t, err)
		}()
	}
	spinUntil(t, "4 turns given", func() bool { return l.Stats().Admitted >= 4 })
	advertisePerSecond(ctx, l, "k", 100) // the rate rises: 8 units at 100/s would be 80 ms
	_, err := l.Wait(ctx, "k", 1, 0)
	require.NoError(t, err, "4 units queued of 8: not full")
	wg.Wait()
}

// advertisePerSecond has l learn that the provider states a limit of
// perSec requests a second for key, as a response read now would say.
func advertisePerSecond(ctx context.Context, l Learner, key string, perSec float64) {
	now := time.Now()
	l.Learn(ctx, key, Signal{Now: now, SentAt: now, Status: 200, Quotas: []Quota{{
		Dimension: Requests, Limit: perSec, HasLimit: true, Window: time.Second, HasWindow: true}}})
}
