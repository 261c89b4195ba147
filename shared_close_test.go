package egress

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/egress-go/egress/internal/redistest"
)

// TestSharedClientClosedFirst: closing the Redis client before the limiter
// (or without closing the limiter) must not crash the process. The limiter
// then behaves as one whose Redis is down: fallback, or ErrSharedUnavailable
// when fail-closed; and Close still returns.
func TestSharedClientClosedFirst(t *testing.T) {
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name       string
		failClosed bool
	}{{"fallback", false}, {"fail closed", true}} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := srv.Client(t)
			opts := []LimiterOption{WithCommandTimeout(roomyTimeout)}
			if tc.failClosed {
				opts = append(opts, WithFailClosed())
			}
			tb, err := NewSharedTokenBucket(rdb, "closed-"+tc.name[:4], PerSecond(100), 5, opts...)
			require.NoError(t, err)
			lb, err := NewSharedLeakyBucket(rdb, "closed-"+tc.name[:4], PerSecond(100), 5, opts...)
			require.NoError(t, err)
			ctx := context.Background()
			for _, l := range []Limiter{tb, lb} {
				_, err := l.Wait(ctx, "k", 1, time.Second)
				require.NoError(t, err, "shared mode before the client closes")
			}
			require.False(t, tb.Stats().Fallback)

			require.NoError(t, rdb.Close())
			// Let the background goroutines see the closed subscription.
			time.Sleep(100 * time.Millisecond)
			for _, l := range []Limiter{tb, lb} {
				_, err := l.Wait(ctx, "k", 1, time.Second)
				if tc.failClosed {
					require.ErrorIs(t, err, ErrSharedUnavailable)
				} else {
					require.NoError(t, err, "the fallback admits")
				}
			}
			assert.True(t, tb.Stats().Fallback && lb.Stats().Fallback, "a closed client is a Redis that is down")

			done := make(chan error, 2)
			go func() { done <- tb.Close() }()
			go func() { done <- lb.Close() }()
			for range 2 {
				select {
				case err := <-done:
					if err != nil {
						assert.True(t, errors.Is(err, redis.ErrClosed), "Close: %v", err)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("Close did not return")
				}
			}
		})
	}
}

// TestSharedCloseEndsTheLead: a lead goroutine waiting until shortly
// before the last turn its process holds (up to 128/rate away) ends at
// Close, and a waiter still queued behind it returns (through the
// fallback) instead of hanging.
func TestSharedCloseEndsTheLead(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	before := goleak.IgnoreCurrent()
	l, err := NewSharedTokenBucket(rdb, "close-lead", PerSecond(1), 1, WithCommandTimeout(roomyTimeout))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = l.Wait(ctx, "k", 1, 0)
		}()
	}
	require.Eventually(t, func() bool { return l.Stats().Admitted >= 3 }, 2*time.Second, time.Millisecond)
	cancel()
	wg.Wait()
	require.NoError(t, l.Close())
	goleak.VerifyNone(t, before, goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"))
}
