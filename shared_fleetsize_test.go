package egress

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/keyspace"
	"github.com/egress-go/egress/internal/lua"
	"github.com/egress-go/egress/internal/member"
	"github.com/egress-go/egress/internal/redistest"
)

// The causes the fleet-size scenario (bench/fleet, TestFleetSize) found at
// 64 and 256 instances, one test each.

// deadRedis is a client of a port nothing listens on.
func deadRedis(t *testing.T) redis.UniversalClient {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// TestSharedSlowAnswerIsNotAnOutage: a Redis that answers a little later
// than the command timeout, right after it answered in time (a machine
// busy with many instances), serves the request: no fallback. Before,
// each slow answer sent a request to the fallback (124 switches in the
// first second of 64 instances), whose whole burst drew refusals.
func TestSharedSlowAnswerIsNotAnOutage(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ev := &fallbackEvents{}
	const timeout = 50 * time.Millisecond
	l := newSharedTB(t, srv.Client(t), "slowish", PerSecond(1000), 10, WithCommandTimeout(timeout), WithFallbackObserver(ev.hook))
	ctx := context.Background()
	require.Eventually(t, func() bool {
		_, err := l.Wait(ctx, "k", 1, 0)
		return err == nil && !l.Stats().Fallback
	}, 3*time.Second, 10*time.Millisecond)
	before := len(ev.get())
	rt := l.Stats().RoundTrips

	require.NoError(t, admin.Do(ctx, "CLIENT", "PAUSE", "90", "ALL").Err()) // answers 90 ms late
	start := time.Now()
	_, err := l.Wait(ctx, "k", 1, 0)
	require.NoError(t, err)
	t.Logf("the Wait took %v", time.Since(start).Round(time.Millisecond))
	assert.False(t, l.Stats().Fallback, "a late answer is not an outage")
	assert.Empty(t, ev.get()[before:], "no switch to the fallback")
	assert.Greater(t, l.Stats().RoundTrips, rt, "served by Redis")
}

// TestSharedFallbackShareOfBurst: the fallbacks of a fleet of N instances
// at R/N each send at once no more than the burst between them (a share
// each, not a burst each), and still grant a cost of the whole burst.
func TestSharedFallbackShareOfBurst(t *testing.T) {
	const rate, burst = 200.0, 20
	for _, n := range []int{1, 4, 64, 256} {
		l, err := NewSharedTokenBucket(deadRedis(t), "share", PerSecond(rate), burst)
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close() })
		share := PerSecond(rate / float64(n))
		fb := l.local(share)
		now := 0
		for range burst + 1 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
			_, err := fb.Wait(ctx, "k", 1, time.Millisecond)
			cancel()
			if err != nil {
				break
			}
			now++
		}
		// Every instance alike: the fleet sends n times this at once.
		assert.LessOrEqual(t, n*now, burst, "%d instances: %d each at once", n, now)
		if n == 1 {
			assert.GreaterOrEqual(t, now, burst-1, "alone: the whole burst, less the jitter margin")
		}
	}
	t.Run("a cost of the whole burst is still granted", func(t *testing.T) {
		l, err := NewSharedTokenBucket(deadRedis(t), "costly", PerSecond(rate), burst)
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close() })
		fb := l.local(PerSecond(rate / 4)) // 50/s: the reserve of 15 units is 0.3 s
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		w, err := fb.Wait(ctx, "k", burst, 0)
		require.NoError(t, err)
		assert.InDelta(t, 0.3, w.Seconds(), 0.1, "waits for the share's reserve")
	})
}

// TestFallbackPhase: fallbacks entered together spread their first turns
// over one unit at the share; a fallback at the whole rate starts at once.
func TestFallbackPhase(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	whole := PerSecond(200)
	share := PerSecond(200.0 / 256) // a unit is 1.28 s
	assert.Equal(t, t0, phase(t0, whole, whole, 0.7))
	assert.Equal(t, t0, phase(t0, share, whole, 0))
	assert.Equal(t, t0.Add(640*time.Millisecond), phase(t0, share, whole, 0.5))
	// 256 instances whose draws spread evenly: at most R·1 s + 1 first
	// turns in any second (the unit is longer than a second).
	var firsts []time.Time
	for i := range 256 {
		firsts = append(firsts, phase(t0, share, whole, float64(i)/256))
	}
	most := 0
	for i := range firsts {
		n := 0
		for _, f := range firsts[i:] {
			if f.Sub(firsts[i]) < time.Second {
				n++
			}
		}
		most = max(most, n)
	}
	assert.LessOrEqual(t, most, 201)
}

// TestSharedStartMargin: a process's calls on a key give the fleet's
// bucket up to startTransit more of margin in its first startWindow on
// the key, the whole of it in a fleet of startFleet instances or more.
func TestSharedStartMargin(t *testing.T) {
	l, err := NewSharedTokenBucket(deadRedis(t), "start", PerSecond(100), 10)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	t0 := time.Unix(1_700_000_000, 0)
	l.mu.Lock()
	defer l.mu.Unlock()
	assert.Equal(t, l.usable, l.usableAt("id", t0), "no lane: the usable burst")
	l.lanes.Put("id", &batchLane{born: t0})
	steps := []struct {
		live int64
		at   time.Duration
		want float64
	}{
		{1, 10 * time.Millisecond, 9.5},               // alone: the transit margin only
		{17, 10 * time.Millisecond, 9.5 - 1.5},        // half of startFleet: half of 30 ms at 100/s
		{64, 10 * time.Millisecond, 9.5 - 3},          // 30 ms at 100/s
		{256, startWindow - time.Nanosecond, 9.5 - 3}, // still the first second
		{256, startWindow, 9.5},                       // after it
	}
	for i, st := range steps {
		l.member.Assume(st.live)
		assert.InDelta(t, st.want, l.usableAt("id", t0.Add(st.at)), 1e-9, "step %d: %+v", i, st)
	}
}

// startOf256 returns a SharedTokenBucket at 200/s (burst 20) on a fake
// clock begun at start, one of 256 live instances, and turn, which reserves
// a turn of cost 1 for a key at the clock's now (one script call a
// request) and returns the turn given.
func startOf256(t *testing.T, name string) (*SharedTokenBucket, *clock.Fake, time.Time, func(key string) time.Time) {
	srv := redistest.Start(t)
	start := time.Now().Truncate(time.Microsecond) // the script's keys expire on Redis's own clock
	fc := clock.NewFake(start)
	l := newSharedTB(t, srv.Client(t), name, PerSecond(200), 20, WithCommandTimeout(roomyTimeout), onClock(fc))
	l.coalesce = false // one call a request, at the fake clock's now
	return l, fc, start, func(key string) time.Time {
		t.Helper()
		id := keyspace.ID(key)
		l.mu.Lock()
		if _, ok := l.lanes.Get(id, fc.Now()); !ok {
			l.lanes.Put(id, &batchLane{born: start})
		}
		l.mu.Unlock()
		l.member.Assume(256) // (a heartbeat riding on a call counts this instance alone)
		res, _, err := l.runReserve(id, []*pending{{cost: 1}})
		require.NoError(t, err)
		require.Zero(t, res[0].code)
		return fc.Now().Add(res[0].wait)
	}
}

// TestSharedStartMarginIsNoRefill: the units a process's start margin
// keeps back come back to the fleet's bucket as it refills, never as
// turns among those already given. 256 instances at 200/s with a burst
// of 20 (19 usable, 13 in the start window) queue their turns 1.2 s
// ahead through the first second; the calls after it are given turns a
// unit apart after the last, as the calls before it were. (Given the
// whole usable burst as soon as the window ended, the first call after
// it went six units before the last turn given, and the next five among
// those turns: six turns in 30 ms, 1.2 s later, when the provider's
// bucket, behind the fleet's by the first requests' late arrival, had not
// those units: one refusal or more at 2.24 to 2.28 s in most runs of
// bench/fleet's TestFleetProcesses 16x16x1, and a decrease to 140/s.)
// Once the bucket has refilled, the whole usable burst goes at once.
func TestSharedStartMarginIsNoRefill(t *testing.T) {
	_, fc, start, turnOf := startOf256(t, "start-refill")
	turn := func() time.Time { t.Helper(); return turnOf("k") }
	const unit = 5 * time.Millisecond
	for i := range 13 {
		require.Equal(t, start, turn(), "request %d: within the start window's burst", i)
	}
	last := turn()
	require.Equal(t, start.Add(unit), last, "the 14th: a unit on")
	for range 255 - 13 {
		at := turn()
		require.Equal(t, last.Add(unit), at, "a unit after the last turn given")
		last = at
	}
	// The turns come and the instances ask again, one a unit, past the
	// end of the start window.
	for fc.Now().Before(start.Add(startWindow + 300*time.Millisecond)) {
		fc.Advance(unit)
		at := turn()
		require.Equal(t, last.Add(unit), at, "at %v: a unit after the last turn given, %v", fc.Now().Sub(start), last.Sub(start))
		last = at
	}
	// The queue goes out and the bucket refills: the whole usable burst
	// (19 units) then goes at once, and the next waits a unit.
	fc.Advance(last.Add(20 * unit).Sub(fc.Now()))
	for i := range 19 {
		require.Equal(t, fc.Now(), turn(), "request %d of the refilled bucket: at once", i)
	}
	assert.Equal(t, fc.Now().Add(unit), turn(), "the 20th: a unit on")
}

// TestSharedStartCollisionOfAQueuedTurn: 256 instances at 200/s (burst
// 20) queue their first turns 1.2 s ahead; a refusal sent at 1.14 s, its
// turn given in the key's first second, is the start's collision and
// lowers nothing (the script keeps the latest turn the first second gave);
// a refusal of a turn given after the first second is heard as any other.
// (Judged by its send alone, such a refusal lowered the fleet to 140/s in
// most runs of bench/fleet's TestFleetProcesses 16x16x1: about 5% of R
// over the run.)
func TestSharedStartCollisionOfAQueuedTurn(t *testing.T) {
	l, fc, start, turn := startOf256(t, "start-queued")
	refused := func(sent, read time.Duration) Signal {
		return Signal{Now: start.Add(read), SentAt: start.Add(sent), Status: http.StatusTooManyRequests,
			RetryAfter: time.Second, HasRetryAfter: true, Quotas: []Quota{{
				Remaining: 0, HasRemaining: true, Limit: 220, HasLimit: true, Reset: time.Second, HasReset: true,
			}}}
	}
	var last time.Time
	for i := range 256 {
		last = turn("queued")
		if i < 13 {
			turn("late") // the other key's start: its burst, at once
		}
	}
	require.Greater(t, last.Sub(start), 1200*time.Millisecond, "the first second's turns, queued past it")
	fc.Advance(1100 * time.Millisecond)
	require.Equal(t, fc.Now(), turn("late"), "given after the first second, at once")
	fc.Advance(50 * time.Millisecond)

	d := l.Learn(context.Background(), "queued", refused(1140*time.Millisecond, 1150*time.Millisecond))
	require.NoError(t, d.Err)
	assert.Empty(t, d.Why, "a turn the first second gave: the start's collision")
	assert.InDelta(t, 200, l.EffectiveRate("queued").PerSecond(), 1e-9)

	d = l.Learn(context.Background(), "late", refused(1140*time.Millisecond, 1150*time.Millisecond))
	require.NoError(t, d.Err)
	assert.Equal(t, "throttled", d.Why, "a turn given after the first second")
	assert.Less(t, l.EffectiveRate("late").PerSecond(), 200.0)
}

// cmdCounter counts the commands and pipelines a client sends.
type cmdCounter struct {
	mu    sync.Mutex
	beats int // heartbeats sent alone
	pipes int // pipelines of scripts
}

func (c *cmdCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *cmdCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) > 3 && (cmd.Name() == "evalsha" || cmd.Name() == "eval") && fmt.Sprint(args[2]) == "1" {
			if k, _ := args[3].(string); len(k) > 8 && k[len(k)-8:] == ":members" {
				c.mu.Lock()
				c.beats++
				c.mu.Unlock()
			}
		}
		return next(ctx, cmd)
	}
}
func (c *cmdCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() != "evalsha" && cmds[0].Name() != "eval" {
			return next(ctx, cmds) // a new connection's HELLO and CLIENT SETINFO
		}
		c.mu.Lock()
		c.pipes++
		c.mu.Unlock()
		return next(ctx, cmds)
	}
}

// newBeating returns a shared token bucket of burst 1 at 50/s named
// "beats" whose heartbeat period is hb.
func newBeating(t *testing.T, rdb redis.UniversalClient, hb time.Duration) *shared {
	s, err := newShared("t", rdb, "beats", PerSecond(50), []LimiterOption{WithCommandTimeout(roomyTimeout)})
	require.NoError(t, err)
	s.cfg.heartbeat = hb
	s.member = member.New(rdb, redis.NewScript(lua.Heartbeat), s.membersKey(), s.instanceTTL(), s.clock) // live for 3 × hb
	s.shape, s.burst, s.capacity, s.depth, s.usable = "tb", 1, 1, -1, 1
	s.local = func(share Rate) Limiter { return s.fallbackBucket(share) }
	s.start()
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestSharedBeatsRideOnReservations: a busy instance's heartbeats go in
// the round trips of its reservations, and it still counts as live; an
// idle one beats alone every idleBeat periods.
func TestSharedBeatsRideOnReservations(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	cc := &cmdCounter{}
	rdb.AddHook(cc)
	const hb = 200 * time.Millisecond
	s := newBeating(t, rdb, hb)
	newBeating(t, srv.Client(t), hb) // another instance, idle
	ctx := context.Background()

	start := time.Now()
	for time.Since(start) < 10*hb {
		_, err := s.Wait(ctx, "k", 1, 0) // 50/s: a reservation every 20 ms
		require.NoError(t, err)
	}
	cc.mu.Lock()
	busyBeats, pipes := cc.beats, cc.pipes
	cc.mu.Unlock()
	t.Logf("busy for %v: %d heartbeats alone, %d pipelines", 10*hb, busyBeats, pipes)
	assert.LessOrEqual(t, busyBeats, 2, "the start's beat, and a reload of the script at most")
	assert.GreaterOrEqual(t, pipes, 8, "a beat rides on a reservation every half period or so")
	assert.Equal(t, 2, s.Stats().LiveInstances, "still counted")

	time.Sleep(10 * hb)
	cc.mu.Lock()
	idleBeats := cc.beats - busyBeats
	cc.mu.Unlock()
	t.Logf("idle for %v: %d heartbeats", 10*hb, idleBeats)
	assert.InDelta(t, 10/idleBeat, idleBeats, 2, "idle: one every idleBeat periods")
	assert.Equal(t, 2, s.Stats().LiveInstances, "still counted")
}

// TestSharedNoScriptReloadsThePair: on a server that does not know the
// scripts (new or flushed), a reservation and the beat it carries are sent
// again with their source, side by side: two round trips, not three.
func TestSharedNoScriptReloadsThePair(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	cc := &cmdCounter{}
	rdb.AddHook(cc)
	ctx := context.Background()
	s := newBeating(t, rdb, 2*time.Second) // first tick at 500 ms
	require.Eventually(t, func() bool { return s.member.Beaten() }, 3*time.Second, 5*time.Millisecond, "the start's beat")
	require.NoError(t, rdb.ScriptFlush(ctx).Err())
	s.member.Forget() // the next reservation carries a beat
	cc.mu.Lock()
	cc.beats, cc.pipes = 0, 0
	cc.mu.Unlock()

	_, err := s.Wait(ctx, "k", 1, 0)
	require.NoError(t, err)
	cc.mu.Lock()
	beats, pipes := cc.beats, cc.pipes
	cc.mu.Unlock()
	assert.Zero(t, beats, "no heartbeat alone")
	assert.Equal(t, 2, pipes, "the pair by EVALSHA, then by EVAL")
	assert.Equal(t, int64(1), s.Stats().RoundTrips)

	// Loaded now: the next reservation that carries a beat is one pipeline.
	s.member.Forget()
	_, err = s.Wait(ctx, "k", 1, 0)
	require.NoError(t, err)
	cc.mu.Lock()
	assert.Equal(t, 3, cc.pipes)
	assert.Zero(t, cc.beats)
	cc.mu.Unlock()
}

// TestSharedFirstCallPatience: a process's first call on a key is waited
// for up to caller.MaxCommandWait: a Redis that answers it 250 ms late (a fleet
// starting at once on a busy machine) serves it, where a later call's
// patience (three times the timeout) would have sent it to the fallback.
func TestSharedFirstCallPatience(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ev := &fallbackEvents{}
	l := newSharedTB(t, srv.Client(t), "first", PerSecond(100), 10, WithCommandTimeout(50*time.Millisecond), WithFallbackObserver(ev.hook))
	require.Eventually(t, func() bool { return l.Stats().LiveInstances == 1 && !l.calls.Answered().IsZero() }, 3*time.Second, 5*time.Millisecond,
		"the first heartbeat answered")
	ctx := context.Background()
	require.NoError(t, admin.Do(ctx, "CLIENT", "PAUSE", "250", "ALL").Err())
	start := time.Now()
	_, err := l.Wait(ctx, "fresh", 1, 0)
	require.NoError(t, err)
	t.Logf("the first Wait took %v", time.Since(start).Round(time.Millisecond))
	assert.False(t, l.Stats().Fallback)
	assert.Empty(t, ev.get(), "no switch to the fallback")
	assert.Equal(t, int64(1), l.Stats().Admitted, "served by Redis")
}
