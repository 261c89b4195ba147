package egress

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/redistest"
)

// newSharedInFlight makes a SharedInFlightLimit that t's cleanup closes.
func newSharedInFlight(t *testing.T, rdb redis.UniversalClient, name string, n int, opts ...InFlightOption) *SharedInFlightLimit {
	t.Helper()
	l, err := NewSharedInFlightLimit(rdb, name, n, append([]InFlightOption{WithCommandTimeout(roomyTimeout)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func TestSharedInFlightLimitValidates(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	for _, tc := range []struct {
		rdb  redis.UniversalClient
		name string
		n    int
		opts []InFlightOption
		want string
	}{
		{nil, "x", 1, nil, "rdb nil"},
		{rdb, "bad name", 1, nil, "name"},
		{rdb, "x", 0, nil, "n 0"},
		{rdb, "x", 1, []InFlightOption{WithLiveness(0)}, "WithLiveness 0s"},
		{rdb, "x", 1, []InFlightOption{WithCommandTimeout(-1)}, "WithCommandTimeout"},
	} {
		_, err := NewSharedInFlightLimit(tc.rdb, tc.name, tc.n, tc.opts...)
		require.ErrorIs(t, err, ErrInvalidConfig, tc.want)
		assert.Contains(t, err.Error(), tc.want)
	}
	// The Redis options are refused by the local limit.
	_, err := NewInFlightLimit(2, WithFailClosed())
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "applies to a SharedInFlightLimit only")
}

// TestSharedInFlightFleetCap: three instances with their own clients, 8
// goroutines each, never have more than n requests in flight at the
// upstream together, and use the cap; on a single server and on a Cluster.
func TestSharedInFlightFleetCap(t *testing.T) {
	for _, tc := range []struct {
		name   string
		client func(t *testing.T) func() redis.UniversalClient
	}{
		{"server", func(t *testing.T) func() redis.UniversalClient {
			srv := redistest.Start(t)
			return func() redis.UniversalClient { return srv.Client(t) }
		}},
		{"cluster", func(t *testing.T) func() redis.UniversalClient {
			c := redistest.StartCluster(t)
			return func() redis.UniversalClient { return c.Client(t) }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := tc.client(t)
			const n, instances, workers, each = 4, 3, 8, 15
			up := newInFlightServer(t, 5*time.Millisecond)
			var wg sync.WaitGroup
			for range instances {
				l := newSharedInFlight(t, client(), "fleet-cap", n)
				tr := mustNewTransport(t, up.pooled(t), WithInFlightLimit(l))
				for range workers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range each {
							resp, err := tr.RoundTrip(newPlainGet(t, context.Background(), up.URL))
							if !assert.NoError(t, err) {
								return
							}
							resp.Body.Close()
						}
					}()
				}
			}
			wg.Wait()
			assert.Equal(t, instances*workers*each, up.count())
			assert.LessOrEqual(t, up.most.Load(), int64(n), "never more than n in flight across the fleet")
			assert.Equal(t, int64(n), up.most.Load(), "the cap is used")
		})
	}
}

// TestSharedInFlightReleaseWakes: a slot released by one instance wakes a
// waiter of another within milliseconds (the channel, not the poll).
func TestSharedInFlightReleaseWakes(t *testing.T) {
	srv := redistest.Start(t)
	a := newSharedInFlight(t, srv.Client(t), "wake", 1)
	b := newSharedInFlight(t, srv.Client(t), "wake", 1)
	ctx := context.Background()
	release, _, err := a.Acquire(ctx, "k", 0)
	require.NoError(t, err)
	got := acquireAsync(b, ctx, "k", 0)
	time.Sleep(30 * time.Millisecond) // b is waiting
	released := time.Now()
	release()
	r := recvWithin(t, got)
	require.NoError(t, r.err)
	woke := time.Since(released)
	t.Logf("the waiter got the slot %v after its release", woke)
	assert.Less(t, woke, slotPoll/2, "woken by the release, not by the poll")
	r.release()
	n, err := a.InFlight(ctx, "k")
	require.NoError(t, err)
	assert.Zero(t, n)
}

// TestSharedInFlightLeaves: a waiter whose max wait ends gets
// ErrTooManyInFlight, one whose context ends its error; neither holds a
// slot afterwards.
func TestSharedInFlightLeaves(t *testing.T) {
	srv := redistest.Start(t)
	l := newSharedInFlight(t, srv.Client(t), "leaves", 1)
	ctx := context.Background()
	release, _, err := l.Acquire(ctx, "k", 0)
	require.NoError(t, err)
	_, waited, err := l.Acquire(ctx, "k", 80*time.Millisecond)
	require.ErrorIs(t, err, ErrTooManyInFlight)
	assert.GreaterOrEqual(t, waited, 80*time.Millisecond)
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, _, err = l.Acquire(cctx, "k", 0)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	release()
	release() // once only
	n, err := l.InFlight(ctx, "k")
	require.NoError(t, err)
	assert.Zero(t, n)
}

// TestSharedInFlightUnclosedBody: through a Transport, a body nobody
// closes gives its slot back when its lease time ends (renewals stop,
// and the lease expires within the liveness period).
func TestSharedInFlightUnclosedBody(t *testing.T) {
	srv := redistest.Start(t)
	l := newSharedInFlight(t, srv.Client(t), "unclosed", 1, WithLeaseTime(300*time.Millisecond), WithLiveness(300*time.Millisecond))
	up := newInFlightServer(t, 0)
	tr := mustNewTransport(t, up.pooled(t), WithInFlightLimit(l))
	leaked, err := tr.RoundTrip(newPlainGet(t, context.Background(), up.URL))
	require.NoError(t, err)
	start := time.Now()
	resp, err := tr.RoundTrip(newPlainGet(t, context.Background(), up.URL))
	require.NoError(t, err)
	took := time.Since(start)
	resp.Body.Close()
	t.Logf("the next request went %v after the leaked one", took)
	assert.GreaterOrEqual(t, took, 300*time.Millisecond, "not before the lease time")
	assert.Less(t, took, 300*time.Millisecond+300*time.Millisecond+slotPoll+200*time.Millisecond, "within the liveness after it")
	leaked.Body.Close()
}

// TestSharedInFlightFallback: with Redis down, each instance falls back to
// its share of n (here 3 live instances of n = 3: 1 each), and returns to
// shared mode once Redis is back; fail-closed refuses instead.
func TestSharedInFlightFallback(t *testing.T) {
	srv := redistest.Start(t)
	var switches atomic.Int64
	obs := WithFallbackObserver(func(string, bool, error) { switches.Add(1) })
	a := newSharedInFlight(t, srv.Client(t), "fallback", 3, obs, WithCommandTimeout(100*time.Millisecond))
	newSharedInFlight(t, srv.Client(t), "fallback", 3, WithCommandTimeout(100*time.Millisecond)) // a third instance
	closed := newSharedInFlight(t, srv.Client(t), "fallback", 3, WithFailClosed(), WithCommandTimeout(100*time.Millisecond))
	spinUntil(t, "three live instances", func() bool { return a.liveN.Load() == 3 })
	srv.Stop()
	ctx := context.Background()
	release, _, err := a.Acquire(ctx, "k", 0)
	require.NoError(t, err)
	require.True(t, a.Fallback())
	_, _, err = a.Acquire(ctx, "k", 50*time.Millisecond)
	require.ErrorIs(t, err, ErrTooManyInFlight, "the share is used up")
	_, _, err = closed.Acquire(ctx, "k", 0)
	require.ErrorIs(t, err, ErrSharedUnavailable)
	release()
	srv.Restart(t)
	spinUntil(t, "back in shared mode", func() bool { return !a.Fallback() })
	r, _, err := a.Acquire(ctx, "k", time.Second)
	require.NoError(t, err)
	r()
	assert.Equal(t, int64(2), switches.Load(), "to the fallback and back")
}

// TestFleetInFlightKilled: a process that holds slots is killed with
// SIGKILL; its slots come back within the liveness period.
func TestFleetInFlightKilled(t *testing.T) {
	srv := redistest.Start(t)
	const liveness = time.Second
	cmd := exec.Command(os.Args[0], "-test.run=^TestSharedInFlightHolder$", "-test.count=1")
	cmd.Env = append(os.Environ(), "EGRESS_SLOT_HOLDER="+srv.Addr)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	held := false
	for sc.Scan() {
		if strings.Contains(sc.Text(), "holding") {
			held = true
			break
		}
	}
	require.True(t, held, "the holder took its slots")

	l := newSharedInFlight(t, srv.Client(t), "killed", 2, WithLiveness(liveness))
	n, err := l.InFlight(context.Background(), "k")
	require.NoError(t, err)
	require.Equal(t, 2, n, "the holder's slots are held")
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	killed := time.Now()
	var releases []func()
	for range 2 {
		r, _, err := l.Acquire(context.Background(), "k", 5*time.Second)
		require.NoError(t, err)
		releases = append(releases, r)
	}
	back := time.Since(killed)
	t.Logf("the killed process's 2 slots came back %v after SIGKILL (liveness %v)", back, liveness)
	assert.Less(t, back, liveness+slotPoll+300*time.Millisecond)
	for _, r := range releases {
		r()
	}
}

// TestSharedInFlightHolder is the process TestFleetInFlightKilled kills: it
// takes two slots and holds them until it is killed.
func TestSharedInFlightHolder(t *testing.T) {
	addr := os.Getenv("EGRESS_SLOT_HOLDER")
	if addr == "" {
		t.Skip("the process TestFleetInFlightKilled starts and kills")
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	l, err := NewSharedInFlightLimit(rdb, "killed", 2, WithLiveness(time.Second), WithCommandTimeout(time.Second))
	require.NoError(t, err)
	for range 2 {
		_, _, err := l.Acquire(context.Background(), "k", 0)
		require.NoError(t, err)
	}
	os.Stdout.WriteString("holding\n")
	time.Sleep(time.Minute) // until killed
	t.Fatal("not killed")
}

// TestSharedInFlightRenews: a slot held longer than the liveness period is
// renewed by its instance, so it stays held until released.
func TestSharedInFlightRenews(t *testing.T) {
	srv := redistest.Start(t)
	l := newSharedInFlight(t, srv.Client(t), "renews", 1, WithLiveness(300*time.Millisecond))
	ctx := context.Background()
	release, _, err := l.Acquire(ctx, "k", 0)
	require.NoError(t, err)
	time.Sleep(time.Second) // three liveness periods
	n, err := l.InFlight(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "renewed, still held")
	_, _, err = l.Acquire(ctx, "k", 50*time.Millisecond)
	require.ErrorIs(t, err, ErrTooManyInFlight)
	release()
	n, err = l.InFlight(ctx, "k")
	require.NoError(t, err)
	assert.Zero(t, n)
}
