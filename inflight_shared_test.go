package egress

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/keyspace"
	"github.com/egress-go/egress/internal/redistest"
)

// newSharedInFlight makes a SharedInFlightLimit that t's cleanup closes.
func newSharedInFlight(t *testing.T, rdb redis.UniversalClient, name string, n int, opts ...LimiterOption) *SharedInFlightLimit {
	t.Helper()
	l, err := NewSharedInFlightLimit(rdb, name, n, append([]LimiterOption{WithCommandTimeout(roomyTimeout)}, opts...)...)
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
		opts []LimiterOption
		want string
	}{
		{nil, "x", 1, nil, "rdb nil"},
		{rdb, "bad name", 1, nil, "name"},
		{rdb, "x", 0, nil, "n 0"},
		{rdb, "x", 1, []LimiterOption{WithLiveness(0)}, "WithLiveness 0s"},
		{rdb, "x", 1, []LimiterOption{WithCommandTimeout(-1)}, "WithCommandTimeout"},
	} {
		_, err := NewSharedInFlightLimit(tc.rdb, tc.name, tc.n, tc.opts...)
		require.ErrorIs(t, err, ErrInvalidConfig, tc.want)
		assert.Contains(t, err.Error(), tc.want)
	}
}

// TestLimiterOptionsApplyWhereTheySay: every limiter takes the options
// its constructor's kind takes, and refuses the others by name.
func TestLimiterOptionsApplyWhereTheySay(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	makers := map[string]func(...LimiterOption) error{
		"NewTokenBucket":   func(o ...LimiterOption) error { _, err := NewTokenBucket(PerSecond(10), 5, o...); return err },
		"NewLeakyBucket":   func(o ...LimiterOption) error { _, err := NewLeakyBucket(PerSecond(10), 5, o...); return err },
		"NewInFlightLimit": func(o ...LimiterOption) error { _, err := NewInFlightLimit(2, o...); return err },
		"NewSharedInFlightLimit": func(o ...LimiterOption) error {
			l, err := NewSharedInFlightLimit(rdb, "x", 2, o...)
			if err == nil {
				l.Close()
			}
			return err
		},
		"NewSharedTokenBucket": func(o ...LimiterOption) error {
			l, err := NewSharedTokenBucket(rdb, "x", PerSecond(10), 5, o...)
			if err == nil {
				l.Close()
			}
			return err
		},
		"NewSharedLimits": func(o ...LimiterOption) error {
			l, err := NewSharedLimits(rdb, "x", []Limit{WindowOf(Requests, 10, time.Second)}, o...)
			if err == nil {
				l.Close()
			}
			return err
		},
	}
	rate := []string{"NewTokenBucket", "NewLeakyBucket", "NewSharedTokenBucket", "NewSharedLimits"}
	redisKept := []string{"NewSharedTokenBucket", "NewSharedLimits", "NewSharedInFlightLimit"}
	for _, tc := range []struct {
		opt   LimiterOption
		name  string
		takes []string
	}{
		{WithoutDiscovery(), "WithoutDiscovery", rate},
		{WithTransitMargin(time.Millisecond), "WithTransitMargin", rate},
		{WithCommandTimeout(time.Second), "WithCommandTimeout", redisKept},
		{WithFailClosed(), "WithFailClosed", redisKept},
		{WithFallbackObserver(func(string, bool, error) {}), "WithFallbackObserver", redisKept},
		{WithFallbackRate(PerSecond(1)), "WithFallbackRate", []string{"NewSharedTokenBucket"}}, // a SharedLimits falls back to its share
		{WithLeaseTime(time.Minute), "WithLeaseTime", []string{"NewInFlightLimit", "NewSharedInFlightLimit"}},
		{WithLiveness(time.Second), "WithLiveness", []string{"NewSharedInFlightLimit"}},
	} {
		for op, make := range makers {
			err := make(tc.opt)
			if slices.Contains(tc.takes, op) {
				assert.NoError(t, err, "%s takes %s", op, tc.name)
				continue
			}
			require.ErrorIs(t, err, ErrInvalidConfig, "%s refuses %s", op, tc.name)
			assert.Contains(t, err.Error(), op+": "+tc.name)
		}
	}
	var typedNil *limiterOption
	for op, make := range makers {
		err := make(typedNil)
		require.ErrorIs(t, err, ErrInvalidConfig, op)
		assert.Contains(t, err.Error(), op+": option nil")
	}
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
			const hold = 5 * time.Millisecond
			up := newInFlightServer(t, hold)
			var wg sync.WaitGroup
			var limits []*SharedInFlightLimit
			for range instances {
				l := newSharedInFlight(t, client(), "fleet-cap", n)
				limits = append(limits, l)
			}
			start := time.Now()
			for _, l := range limits {
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
			took := time.Since(start)
			const total = instances * workers * each
			ideal := total * hold / n
			var trips, admitted int64
			for _, l := range limits {
				trips += l.Stats().RoundTrips
				admitted += l.Stats().Admitted
			}
			t.Logf("%d requests in %v (the cap's ideal %v: %.0f%% used); at most %d in flight; %.1f acquire scripts a request",
				total, took, ideal, 100*float64(ideal)/float64(took), up.most.Load(), float64(trips)/float64(admitted))
			assert.Equal(t, total, up.count())
			assert.Equal(t, int64(total), admitted)
			assert.LessOrEqual(t, up.most.Load(), int64(n), "never more than n in flight across the fleet")
			assert.Equal(t, int64(n), up.most.Load(), "the cap is used")
			assert.Less(t, took, 8*ideal, "slots are reused promptly")
			assert.Less(t, float64(trips)/float64(admitted), 8.0, "waiters do not spin")
			for _, l := range limits {
				m, err := l.InFlight(context.Background(), up.host())
				require.NoError(t, err)
				assert.Zero(t, m, "every slot given back")
			}
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
// closes gives its slot back when its lease time ends: its lease in Redis
// ends then, however long the liveness period.
func TestSharedInFlightUnclosedBody(t *testing.T) {
	srv := redistest.Start(t)
	const lease = 300 * time.Millisecond // the liveness stays 10 s
	l := newSharedInFlight(t, srv.Client(t), "unclosed", 1, WithLeaseTime(lease))
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
	assert.GreaterOrEqual(t, took, lease-10*time.Millisecond, "not before the lease time")
	assert.Less(t, took, lease+slotPoll+150*time.Millisecond, "at the lease time, not a liveness period later")
	leaked.Body.Close()
}

// TestSharedInFlightFallback: with Redis down, each instance falls back to
// its share of n (here 3 live instances of n = 3: 1 each), and returns to
// shared mode once Redis is back, where the slots held through the outage
// (one taken before it, one in the fallback) count against n again;
// fail-closed refuses instead, at once after the first failure. Both tell
// their observer of each switch.
func TestSharedInFlightFallback(t *testing.T) {
	srv := redistest.Start(t)
	var switches, closedSwitches atomic.Int64
	fast := WithCommandTimeout(100 * time.Millisecond)
	a := newSharedInFlight(t, srv.Client(t), "fallback", 3, fast, WithLiveness(600*time.Millisecond),
		WithFallbackObserver(func(string, bool, error) { switches.Add(1) }))
	newSharedInFlight(t, srv.Client(t), "fallback", 3, fast) // a third instance
	closed := newSharedInFlight(t, srv.Client(t), "fallback", 3, fast, WithFailClosed(),
		WithFallbackObserver(func(string, bool, error) { closedSwitches.Add(1) }))
	spinUntil(t, "three live instances", func() bool { return a.Stats().LiveInstances == 3 })
	ctx := context.Background()
	before, _, err := a.Acquire(ctx, "k", 0)
	require.NoError(t, err)

	srv.Stop()
	during, _, err := a.Acquire(ctx, "k", 0)
	require.NoError(t, err)
	require.True(t, a.Fallback())
	_, _, err = a.Acquire(ctx, "k", 50*time.Millisecond)
	require.ErrorIs(t, err, ErrTooManyInFlight, "the share (1) is used up")
	_, _, err = closed.Acquire(ctx, "k", 0)
	require.ErrorIs(t, err, ErrSharedUnavailable)
	start := time.Now()
	_, _, err = closed.Acquire(ctx, "k", 0)
	require.ErrorIs(t, err, ErrSharedUnavailable)
	assert.Less(t, time.Since(start), 50*time.Millisecond, "refused at once, not after a command timeout")
	assert.Equal(t, int64(1), closedSwitches.Load())

	srv.Restart(t) // empty
	spinUntil(t, "back in shared mode", func() bool { return !a.Fallback() && !closed.Fallback() })
	spinUntil(t, "both slots held through the outage counted in Redis", func() bool {
		n, err := a.InFlight(ctx, "k")
		return err == nil && n == 2
	})
	r, _, err := closed.Acquire(ctx, "k", time.Second)
	require.NoError(t, err)
	_, _, err = closed.Acquire(ctx, "k", 50*time.Millisecond)
	require.ErrorIs(t, err, ErrTooManyInFlight, "n = 3 are held")
	for _, release := range []func(){r, during, before} {
		release()
	}
	n, err := a.InFlight(ctx, "k")
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.Equal(t, int64(2), switches.Load(), "to the fallback and back")
	assert.Equal(t, int64(2), closedSwitches.Load(), "to the fallback and back")
}

// TestSharedInFlightSlowRedis: a slot Redis grants after its waiter left is
// given back: when the waiter's context ended during the call, at once;
// when the call timed out (the reply lost), as soon as Redis answers again,
// not a liveness period (10 s) later.
func TestSharedInFlightSlowRedis(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	// pause keeps the server busy for d: commands sent meanwhile run after
	// it, their callers having given up on them.
	pause := func(d time.Duration) {
		done := make(chan error, 1)
		go func() {
			done <- admin.Eval(ctx, `local t = redis.call('TIME')
local till = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1])
repeat t = redis.call('TIME') until tonumber(t[1]) * 1000000 + tonumber(t[2]) >= till
return 1`, nil, d.Microseconds()).Err()
		}()
		t.Cleanup(func() { require.NoError(t, <-done) })
		// It runs once a PING goes unanswered for 20 ms, where an idle
		// server answers in a fraction of one: a sleep hoping it has
		// begun let the command under test run first on a slow machine.
		probe := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 20 * time.Millisecond, MaxRetries: -1, PoolSize: 1,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
		defer probe.Close()
		spinUntil(t, "the server busy with the pause", func() bool { return probe.Ping(ctx).Err() != nil })
	}

	t.Run("context ends", func(t *testing.T) {
		l := newSharedInFlight(t, srv.Client(t), "slow-ctx", 1)
		spinUntil(t, "a heartbeat", func() bool { return l.Stats().LiveInstances == 1 })
		warm, _, err := l.Acquire(ctx, "k", 0) // a connection in the pool: no dial in the pause
		require.NoError(t, err)
		warm()
		pause(200 * time.Millisecond)
		cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, _, err = l.Acquire(cctx, "k", 0)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, int64(2), l.Stats().Admitted, "Redis granted the slot")
		n, err := l.InFlight(ctx, "k")
		require.NoError(t, err)
		assert.Zero(t, n, "and it was given back")
	})

	t.Run("reply lost", func(t *testing.T) {
		l := newSharedInFlight(t, srv.Client(t), "slow-lost", 1, WithCommandTimeout(50*time.Millisecond))
		spinUntil(t, "a heartbeat", func() bool { return l.Stats().LiveInstances == 1 })
		warm, _, err := l.Acquire(ctx, "k", 0) // a connection in the pool: no dial in the pause
		require.NoError(t, err)
		warm()
		pause(300 * time.Millisecond)
		release, _, err := l.Acquire(ctx, "k", 0)
		require.NoError(t, err, "granted by the fallback")
		assert.True(t, l.Fallback())
		release()
		time.Sleep(300 * time.Millisecond) // the script runs now, its reply unread
		start := time.Now()
		require.Eventually(t, func() bool {
			n, err := l.InFlight(ctx, "k")
			return err == nil && n == 0 && !l.Fallback()
		}, 2*time.Second, 5*time.Millisecond, "the lost lease removed when Redis answers, not when it expires (10 s)")
		t.Logf("the lost lease was removed %v after the pause", time.Since(start))
	})
}

// TestSharedInFlightTransport: through a Transport, the slot is held until
// the body is read to its end or closed; a request queued behind it goes
// within milliseconds of the release; one whose context ends while queued
// fails with the context's error and takes no slot.
func TestSharedInFlightTransport(t *testing.T) {
	srv := redistest.Start(t)
	l := newSharedInFlight(t, srv.Client(t), "transport", 1)
	up := newInFlightServer(t, 0)
	tr := mustNewTransport(t, up.pooled(t), WithInFlightLimit(l))
	ctx := context.Background()
	inFlight := func() int {
		n, err := l.InFlight(ctx, up.host())
		require.NoError(t, err)
		return n
	}

	resp, err := tr.RoundTrip(newPlainGet(t, ctx, up.URL))
	require.NoError(t, err)
	assert.Equal(t, 1, inFlight(), "held while the body is open")
	cctx, cancel := context.WithTimeout(ctx, 80*time.Millisecond)
	defer cancel()
	_, err = tr.RoundTrip(newPlainGet(t, cctx, up.URL))
	require.ErrorIs(t, err, context.DeadlineExceeded, "queued until its context ended")
	assert.Equal(t, 1, inFlight(), "the request that left took no slot")
	assert.Equal(t, 1, up.count())
	_, err = io.ReadAll(resp.Body) // to EOF, not closed
	require.NoError(t, err)
	assert.Zero(t, inFlight(), "freed at EOF")
	resp.Body.Close()

	resp, err = tr.RoundTrip(newPlainGet(t, ctx, up.URL))
	require.NoError(t, err)
	type result struct {
		at  time.Time
		err error
	}
	queued := make(chan result, 1)
	go func() {
		r, err := tr.RoundTrip(newPlainGet(t, ctx, up.URL))
		if err == nil {
			r.Body.Close()
		}
		queued <- result{time.Now(), err}
	}()
	time.Sleep(50 * time.Millisecond)
	closed := time.Now()
	resp.Body.Close()
	got := recvWithin(t, queued)
	require.NoError(t, got.err)
	t.Logf("the queued request was answered %v after the body's Close", got.at.Sub(closed))
	assert.Less(t, got.at.Sub(closed), slotPoll/2, "woken by the release")
	assert.Zero(t, inFlight(), "freed at Close")
	assert.Equal(t, 3, up.count())
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
	assert.Greater(t, back, liveness/2, "they expired: renewed up to a third of the liveness before the kill")
	assert.Less(t, back, liveness+slotPoll+300*time.Millisecond, "within the liveness period")
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
	// The key expires a second after its latest lease, so idle keys vanish.
	rdb := srv.Client(t)
	ttl, err := rdb.PTTL(ctx, l.slotsKey(keyspace.ID("k"))).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, time.Second)
	assert.LessOrEqual(t, ttl, 300*time.Millisecond+time.Second)
	ttl, err = rdb.PTTL(ctx, l.membersKey()).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, time.Duration(0), "the heartbeat's key expires too")
	_, _, err = l.Acquire(ctx, "k", 50*time.Millisecond)
	require.ErrorIs(t, err, ErrTooManyInFlight)
	release()
	n, err = l.InFlight(ctx, "k")
	require.NoError(t, err)
	assert.Zero(t, n)
	exists, err := rdb.Exists(ctx, l.slotsKey(keyspace.ID("k"))).Result()
	require.NoError(t, err)
	assert.Zero(t, exists, "a key with no lease is gone")
}

// TestSharedInFlightClose: Close gives back the slots the instance holds
// and leaves the fleet's count; afterwards Acquire fails and a late
// release frees nothing more.
func TestSharedInFlightClose(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	other := newSharedInFlight(t, srv.Client(t), "close", 2)
	l, err := NewSharedInFlightLimit(srv.Client(t), "close", 2, WithCommandTimeout(roomyTimeout))
	require.NoError(t, err)
	admin := srv.Client(t)
	spinUntil(t, "two live instances", func() bool { return admin.ZCard(ctx, other.membersKey()).Val() == 2 })
	r1, _, err := l.Acquire(ctx, "k", 0)
	require.NoError(t, err)
	_, _, err = l.Acquire(ctx, "k", 0)
	require.NoError(t, err)
	mine, _, err := other.Acquire(ctx, "k", 30*time.Millisecond)
	require.ErrorIs(t, err, ErrTooManyInFlight)
	require.Nil(t, mine)

	require.NoError(t, l.Close())
	n, err := other.InFlight(ctx, "k")
	require.NoError(t, err)
	assert.Zero(t, n, "both slots given back")
	live, err := admin.ZCard(ctx, other.membersKey()).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), live, "out of the fleet's count")
	_, _, err = l.Acquire(ctx, "k", 0)
	require.Error(t, err)
	r1() // frees nothing more
	require.NoError(t, l.Close(), "twice is fine")
}
