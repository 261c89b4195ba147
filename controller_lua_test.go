package egress

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/control"
	"github.com/egress-go/egress/internal/keyspace"
	"github.com/egress-go/egress/internal/lua"
	"github.com/egress-go/egress/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The Go and Lua versions of the same arithmetic, run on the same inputs:
// the scripts' pure functions (internal/control/rate.lua) are called through
// EVAL on a real redis-server, and compared with the Go that the local
// limiters and the controller run.

// evalFloats runs the scripts' prelude followed by body, which returns a
// table of numbers as strings, and parses them.
func evalFloats(t *testing.T, ctx context.Context, run func(ctx context.Context, script string) (any, error), body string) []float64 {
	t.Helper()
	reply, err := run(ctx, lua.Rate+body)
	require.NoError(t, err)
	vals, ok := reply.([]any)
	require.True(t, ok, "reply %v", reply)
	out := make([]float64, len(vals))
	for i, v := range vals {
		s, ok := v.(string)
		require.True(t, ok, "reply %v", reply)
		out[i], err = strconv.ParseFloat(s, 64)
		require.NoError(t, err)
	}
	return out
}

func TestLuaMatchesGo(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	run := func(ctx context.Context, script string) (any, error) { return rdb.Eval(ctx, script, nil, "@").Result() }

	t.Run("cubic", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(1, 2))
		var calls []string
		type in struct{ t, w0, wmax, c, p float64 }
		var ins []in
		for range 200 {
			wmax := 1 + rng.Float64()*1000
			x := in{t: rng.Float64() * 20, w0: wmax * (0.3 + 0.7*rng.Float64()), wmax: wmax, c: 0.0005 + rng.Float64()*0.05}
			if rng.IntN(2) == 0 {
				x.p = rng.Float64() * 8 // a plateau (plateauFor)
			}
			ins = append(ins, x)
			calls = append(calls, fmt.Sprintf("string.format('%%.17g', cubic(%.17g, %.17g, %.17g, %.17g, %.17g))", x.t, x.w0, x.wmax, x.c, x.p))
		}
		got := evalFloats(t, ctx, run, "return {"+strings.Join(calls, ", ")+"}")
		for i, x := range ins {
			want := control.Cubic(x.t, x.w0, x.wmax, x.c, x.p)
			assert.InEpsilon(t, want, got[i], 1e-12, "cubic(%v)", x)
		}
	})

	// The bucket: a schedule of requests at random times and costs, each
	// admitted as soon as the bucket allows (no budget), through the
	// script's turn and through the local TokenBucket on a fake clock: the
	// same waits, to the microsecond the script counts in.
	t.Run("bucket", func(t *testing.T) {
		for _, tc := range []struct {
			r      float64
			burst  int
			margin time.Duration
		}{{10, 5, 0}, {100, 10, 5 * time.Millisecond}, {3, 1, 5 * time.Millisecond}, {1000, 20, 5 * time.Millisecond}} {
			t.Run(fmt.Sprintf("%v/s burst %d margin %v", tc.r, tc.burst, tc.margin), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(3, uint64(tc.burst)))
				tb, fc := newTokenBucketOnFake(t, PerSecond(tc.r), tc.burst, WithTransitMargin(tc.margin))
				b := float64(tc.burst) - jitterMargin(PerSecond(tc.r), tc.burst, tc.margin)
				interval := 1e6 / tc.r
				var lines []string
				lines = append(lines, "local tat, out = 0, {}")
				var goWaits []float64
				at := 0.0 // us from the epoch
				for range 300 {
					at += rng.ExpFloat64() * interval * 0.8
					cost := 1 + rng.IntN(tc.burst)
					limAdvanceTo(fc, limiterEpoch.Add(time.Duration(at)*time.Microsecond))
					d, err := delayOf(tb.reserve("k", cost, budget{}))
					require.NoError(t, err)
					goWaits = append(goWaits, float64(d/time.Microsecond))
					now := math.Floor(at)
					lines = append(lines, fmt.Sprintf("do local nt, turnAt = turn(tat, %.0f, %d, %.17g, %.17g); tat = nt; out[#out+1] = string.format('%%.17g', turnAt - %.0f) end",
						now, cost, b, interval, now))
				}
				lines = append(lines, "return out")
				got := evalFloats(t, ctx, run, strings.Join(lines, "\n"))
				require.Len(t, got, len(goWaits))
				for i := range got {
					assert.InDelta(t, goWaits[i], got[i], 2, "request %d: Go waits %vus, Lua %vus", i, goWaits[i], got[i])
				}
			})
		}
	})
}

// admitted counts the requests of cost 1 l admits on key, one after the
// other, each waiting at most maxWait, up to most, and returns the wait of
// the first it refuses (0 when none was).
func admitted(t *testing.T, l Limiter, key string, maxWait time.Duration, most int) (int, time.Duration) {
	t.Helper()
	for n := 0; n < most; n++ {
		_, err := l.Wait(context.Background(), key, 1, maxWait)
		var le *LimitError
		if errors.As(err, &le) {
			return n, le.Wait
		}
		require.NoError(t, err)
	}
	return most, 0
}

// TestSharedBudgetMatchesGo: the budget (requests in flight count against
// the remaining quota) kept in Redis and spent by the reservation script
// grants as many requests as the Go controller's, and then holds the key
// as long. In the fleet the requests the provider has not counted yet are
// the turns granted after the reported request was sent (the script's
// ring of grants), which the Go counts as the requests in flight: the last
// case reports with no request in flight in this instance, as if another
// instance had sent them.
func TestSharedBudgetMatchesGo(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	report := func(remaining float64, inFlight int, reset time.Duration, kind ResetKind, sent, now time.Time) Signal {
		return Signal{Now: now, SentAt: sent, Status: 200, InFlight: inFlight, Quotas: []Quota{{
			Remaining: remaining, HasRemaining: true, Reset: reset, HasReset: true, Kind: kind,
		}}}
	}
	// goGrants counts the grants the Go controller makes after s, and its
	// hold then.
	goGrants := func(s Signal) (int, time.Duration) {
		cfg := control.DefaultConfig(1000)
		var st control.State
		learnSignal(&st, &cfg, &s)
		n := 0
		for st.Spend(s.Now, s.Now, 1, 1000) {
			n++
		}
		return n, st.Hold.Sub(s.Now)
	}
	sharedGrants := func(t *testing.T, l *SharedTokenBucket, key string) (int, time.Duration) {
		return admitted(t, l, key, 50*time.Millisecond, 100)
	}
	const tolerance = 40 * time.Millisecond
	for i, tc := range []struct {
		name      string
		remaining float64
		inFlight  int
		reset     time.Duration
		kind      ResetKind
	}{
		{"a window, 5 left with 2 in flight", 5, 2, 2 * time.Second, ResetKindWindow},
		{"a window, 3 left with 3 in flight", 3, 3, 2 * time.Second, ResetKindWindow},
		{"a shape not known yet, 2 left with 1 in flight", 2, 1, 2 * time.Second, ResetKindUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newSharedTB(t, srv.Client(t), fmt.Sprintf("budget%d", i), PerSecond(1000), 50, WithCommandTimeout(roomyTimeout))
			now := time.Now()
			s := report(tc.remaining, tc.inFlight, tc.reset, tc.kind, now, now)
			wantN, wantHold := goGrants(s)
			require.NoError(t, l.Learn(ctx, "k", s).Err)
			gotN, gotWait := sharedGrants(t, l, "k")
			assert.Equal(t, wantN, gotN, "grants before the hold")
			assert.InDelta(t, wantHold-time.Since(now), gotWait, float64(tolerance), "the hold")
		})
	}
	t.Run("the fleet's grants since the reported request was sent", func(t *testing.T) {
		l := newSharedTB(t, srv.Client(t), "budget-ring", PerSecond(1000), 50, WithCommandTimeout(roomyTimeout))
		now := time.Now()
		require.NoError(t, l.Learn(ctx, "k", report(10, 0, 2*time.Second, ResetKindWindow, now, now)).Err)
		_, err := l.Wait(ctx, "k", 1, 0) // A, the request reported below
		require.NoError(t, err)
		sentA := time.Now()
		time.Sleep(30 * time.Millisecond)
		for range 3 { // B, C, D: in flight, in the fleet
			_, err := l.Wait(ctx, "k", 1, 0)
			require.NoError(t, err)
		}
		now = time.Now()
		s := report(9, 0, 2*time.Second-now.Sub(sentA), ResetKindWindow, sentA, now)
		require.NoError(t, l.Learn(ctx, "k", s).Err)
		goS := s
		goS.InFlight = 3
		wantN, _ := goGrants(goS)
		gotN, gotWait := sharedGrants(t, l, "k")
		assert.Equal(t, wantN, gotN, "9 left, less B, C and D")
		assert.InDelta(t, 2*time.Second-time.Since(sentA), gotWait, float64(tolerance), "then held until the reset")
	})
}

// TestSharedBucketReportDrains: a success's count from a provider that
// refills continuously drains the fleet's bucket to what it leaves, as
// Decision.drain drains a local one: its remaining, less the turns the
// fleet was given since the reported request was sent (the ring of
// grants), owing when they are more.
func TestSharedBucketReportDrains(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	report := func(remaining float64, sent, now time.Time) Signal {
		return Signal{Now: now, SentAt: sent, Status: 200, Quotas: []Quota{{
			Remaining: remaining, HasRemaining: true, Reset: time.Second, HasReset: true, Kind: ResetKindBucket,
		}}}
	}
	atOnce := func(t *testing.T, l *SharedTokenBucket) (int, time.Duration) {
		return admitted(t, l, "k", time.Millisecond, 20)
	}
	const tolerance = 8 * time.Millisecond
	t.Run("2 left: 2 at once, the next a unit later", func(t *testing.T) {
		l := newSharedTB(t, srv.Client(t), "drain-left", PerSecond(100), 10, WithCommandTimeout(roomyTimeout))
		now := time.Now()
		require.NoError(t, l.Learn(ctx, "k", report(2, now, now)).Err)
		before := time.Since(now)
		n, wait := atOnce(t, l)
		took := time.Since(now) - before
		// The count goes to Redis with the first reservation; the bucket
		// refills from then, so a machine slow enough to take more than a
		// unit over the loop gives one more (never on an idle one).
		extra := int(took / (10 * time.Millisecond))
		assert.GreaterOrEqual(t, n, 2)
		assert.LessOrEqual(t, n, 2+extra)
		unitsLeft := time.Duration(n-1) * 10 * time.Millisecond
		assert.GreaterOrEqual(t, wait, unitsLeft-took-tolerance)
		assert.LessOrEqual(t, wait, unitsLeft+tolerance)
	})
	t.Run("0 left, with 3 more of the fleet's requests sent after the reported one: owing 3", func(t *testing.T) {
		l := newSharedTB(t, srv.Client(t), "drain-owed", PerSecond(100), 10, WithCommandTimeout(roomyTimeout))
		// A, the request reported below, sent as its turn came (taken before
		// the turn: the script counts A's own slot, and a busy machine can
		// return from Wait a slot later than the turn).
		sentA := time.Now()
		_, err := l.Wait(ctx, "k", 1, 0)
		require.NoError(t, err)
		time.Sleep(30 * time.Millisecond)
		for range 3 { // B, C, D, granted by the fleet after A was sent
			_, err := l.Wait(ctx, "k", 1, 0)
			require.NoError(t, err)
		}
		now := time.Now()
		require.NoError(t, l.Learn(ctx, "k", report(0, sentA, now)).Err)
		before := time.Since(now)
		n, wait := atOnce(t, l)
		after := time.Since(now)
		assert.Equal(t, 0, n)
		// The provider's next unit, and the 3 it owes B, C and D, less the
		// time that passed before the script ran (between before and after:
		// a busy machine may park this goroutine on either side of it).
		assert.GreaterOrEqual(t, wait, 40*time.Millisecond-after-tolerance)
		assert.LessOrEqual(t, wait, 40*time.Millisecond-before+tolerance)
	})
	t.Run("0 left, read 150 ms before it reaches Redis: the bucket refilled since, at the rate", func(t *testing.T) {
		l := newSharedTB(t, srv.Client(t), "drain-late", PerSecond(100), 10, WithCommandTimeout(roomyTimeout))
		now := time.Now()
		require.NoError(t, l.Learn(ctx, "k", report(0, now, now)).Err)
		time.Sleep(150 * time.Millisecond)
		// The count goes with this reservation, as of when it was read:
		// 15 units at 100/s have come since, the burst's 10 are there.
		// (Drained as of now, the bucket was empty again.)
		n, _ := atOnce(t, l)
		assert.GreaterOrEqual(t, n, 9)
	})
}

// TestSharedBudgetHoldsFromNow: while a key of a shape not known yet is
// held after a "remaining 0", the answers heard to requests sent before
// the hold (remaining a few) neither move its end nor hold the waiters
// behind it: the fleet's budget counts the requests in flight, not the
// turns given to waiters, and a spent one holds a probe from now, as the
// Go controller does. (Counting the waiters' turns, each such report
// found the budget spent and held the key a probe past the last turn:
// the last of the waiters below went twice as late.)
func TestSharedBudgetHoldsFromNow(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	l := newSharedTB(t, srv.Client(t), "budget-now", PerSecond(100), 10, WithCommandTimeout(roomyTimeout))
	report := func(remaining float64, sent, now time.Time) Signal {
		return Signal{Now: now, SentAt: sent, Status: 200, Quotas: []Quota{{
			Remaining: remaining, HasRemaining: true, Reset: time.Second, HasReset: true, Limit: 10, HasLimit: true,
		}}}
	}
	_, err := l.Wait(ctx, "k", 1, 0) // the ring of grants begins
	require.NoError(t, err)
	time.Sleep(30 * time.Millisecond)
	start := time.Now()
	d := l.Learn(ctx, "k", report(0, start.Add(-5*time.Millisecond), start))
	require.NoError(t, d.Err)
	require.False(t, d.Hold.IsZero(), "a zero of unknown shape holds the key")
	var wg sync.WaitGroup
	var mu sync.Mutex
	var last time.Duration
	for i := range 10 {
		time.Sleep(5 * time.Millisecond)
		now := time.Now()
		require.NoError(t, l.Learn(ctx, "k", report(3, start.Add(-time.Duration(i+1)*time.Millisecond), now)).Err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := l.Wait(ctx, "k", 1, 2*time.Second) // carries the report
			assert.NoError(t, err)
			mu.Lock()
			last = max(last, time.Since(start))
			mu.Unlock()
		}()
	}
	wg.Wait()
	// The hold (100 ms), then ten turns 10 ms apart: 0.2 s (0.4 s when
	// each report past the third moved the hold a probe further).
	t.Logf("the last waiter went %v after the hold began", last)
	assert.Less(t, last, 300*time.Millisecond, "the last waiter's turn")
}

// sharedBesideGo returns a SharedTokenBucket at 100/s (burst 10) on a new
// redis-server, its learning settings, a Go controller's state beside it,
// and a learn that hands a signal to both for key "k" (and, with carry,
// waits for a turn, whose reservation carries the signal's count to the
// script).
func sharedBesideGo(t *testing.T, name string, carry bool) (*SharedTokenBucket, *control.Config, *control.State, func(Signal)) {
	srv := redistest.Start(t)
	ctx := context.Background()
	l := newSharedTB(t, srv.Client(t), name, PerSecond(100), 10, WithCommandTimeout(roomyTimeout))
	cfg := l.learn
	goSt := new(control.State)
	return l, &cfg, goSt, func(s Signal) {
		learnSignal(goSt, &cfg, &s)
		require.NoError(t, l.Learn(ctx, "k", s).Err)
		if carry {
			_, err := l.Wait(ctx, "k", 1, time.Second)
			require.NoError(t, err)
		}
	}
}

// TestSharedBucketLevelsOff: climbing back after a decrease, a success
// that says the provider's bucket has no room left levels the fleet's
// climb off at the rate it has reached, as the Go controller levels off;
// unless the bucket holds one unit, which says 0 after every request.
func TestSharedBucketLevelsOff(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit float64 // stated by the provider; 0 for none
		lo    float64 // the Go controller's rate 1 s into the climb
		hi    float64
	}{
		{"no room at about 80/s: the climb levels off", 0, 70, 82},
		{"a bucket of one unit: the climb goes on", 1, 86, 90},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			l, cfg, goSt, learn := sharedBesideGo(t, "level", false)
			bucket := Quota{Remaining: 5, HasRemaining: true, Reset: time.Second, HasReset: true, Kind: ResetKindBucket}
			if tc.limit > 0 {
				bucket.Limit, bucket.HasLimit = tc.limit, true
			}
			start := time.Now()
			// A refusal: 70/s, climbing back to 100 (K = 3.9 s).
			refusal := bucket
			refusal.Remaining = 0
			learn(Signal{Now: start, SentAt: start, Status: 429, RetryAfter: 0, HasRetryAfter: true, Quotas: []Quota{refusal}})
			time.Sleep(500 * time.Millisecond)
			// No room left at about 80/s.
			now := time.Now()
			full := bucket
			full.Remaining = 0
			learn(Signal{Now: now, SentAt: now, Status: 200, Quotas: []Quota{full}})
			_, err := l.Wait(ctx, "k", 1, time.Second) // carries the report
			require.NoError(t, err)
			time.Sleep(500 * time.Millisecond)
			_, err = l.Wait(ctx, "k", 1, time.Second)
			require.NoError(t, err)
			now = time.Now()
			got, want := l.EffectiveRate("k").PerSecond(), goSt.Rate(cfg, now)
			assert.GreaterOrEqual(t, want, tc.lo, "the Go controller's rate (levelled off at about 80, climbing 88)")
			assert.Less(t, want, tc.hi, "the Go controller's rate (levelled off at about 80, climbing 88)")
			assert.InDelta(t, want, got, 1.5, "the fleet's rate")
		})
	}
}

// roomCount is a bucket's count at at: remaining of 10, full again in 1 s.
func roomCount(at time.Time, status int, remaining float64) Signal {
	return Signal{Now: at, SentAt: at, Status: status, Quotas: []Quota{{Limit: 10, HasLimit: true,
		Remaining: remaining, HasRemaining: true, Reset: time.Second, HasReset: true, Kind: ResetKindBucket}}}
}

// sendCounted sends for d through l, at share of the Go controller's rate
// (1: as fast as the fleet grants), each request granted by both
// controllers, and learns a count of remaining after each; the next
// reservation carries it to the script.
func sendCounted(t *testing.T, l *SharedTokenBucket, cfg *control.Config, goSt *control.State, learn func(Signal), d time.Duration, share, remaining float64) {
	t.Helper()
	ctx := context.Background()
	for end, next := time.Now().Add(d), time.Now(); time.Now().Before(end); {
		time.Sleep(time.Until(next))
		_, err := l.Wait(ctx, "k", 1, time.Second)
		require.NoError(t, err)
		now := time.Now()
		goSt.Spend(now, now, 1, goSt.Rate(cfg, now))
		learn(roomCount(now, 200, remaining))
		// (From the last turn, not from now: the calls' own time is not
		// added to every gap.)
		next = clock.Later(next, now.Add(-10*time.Millisecond)).Add(time.Duration(float64(time.Second) / (share * goSt.Rate(cfg, now))))
	}
}

// TestSharedBucketRoomClimbsFaster: as TestControllerRoomSteps, through
// Redis: a bucket's counts that show room, carried to the script by the
// next reservation (reserve.lua's drain), while the fleet sends at its
// rate, run the fleet's climb back four times as fast, as the Go
// controller's; a count with no room levels it off at the rate of the
// last one with room.
func TestSharedBucketRoomClimbsFaster(t *testing.T) {
	ctx := context.Background()
	l, cfg, goSt, learn := sharedBesideGo(t, "room", false)
	refusal := roomCount(time.Now(), 429, 0)
	refusal.HasRetryAfter = true
	learn(refusal) // 70/s, climbing back to 100 (K = 3.9 s)
	sendCounted(t, l, cfg, goSt, learn, 500*time.Millisecond, 1, 9)
	now := time.Now()
	got, want := l.EffectiveRate("k").PerSecond(), goSt.Rate(cfg, now)
	// (The fleet's clock runs ahead on the counts its reservations carry,
	// on Redis's clock: a little behind the Go controller's.)
	assert.Greater(t, want, 91.0, "the Go controller climbed faster (CUBIC alone: 80 after half a second)")
	assert.Greater(t, got, 87.0, "the fleet climbed faster (CUBIC alone: 80 after half a second)")
	assert.InDelta(t, want, got, 4, "the fleet's rate")
	// No room: levelled off at the last count with room (95/s or so),
	// where the climb, four times as fast, would reach the configured 100
	// by the end.
	learn(roomCount(time.Now(), 200, 0))
	time.Sleep(300 * time.Millisecond)
	_, err := l.Wait(ctx, "k", 1, time.Second)
	require.NoError(t, err)
	now = time.Now()
	gotAfter, wantAfter := l.EffectiveRate("k").PerSecond(), goSt.Rate(cfg, now)
	assert.LessOrEqual(t, wantAfter, want+0.1, "the Go controller levelled off")
	assert.LessOrEqual(t, gotAfter, got+0.5, "the fleet levelled off")
	assert.Less(t, gotAfter, 99.0, "the fleet levelled off")
	// (The Go controller remembers the rate its requests went at, in
	// whole requests of a quarter second, 4/s apart, and lower than the
	// key's when they lag it; the script, the key's rate while its turns
	// keep up: see roomy.)
	assert.InDelta(t, wantAfter, gotAfter, 10, "the fleet's rate, levelled off")
}

// TestSharedBucketRoomNeedsTheRate: as TestControllerRoomNeedsTheRate,
// through Redis: the same counts with room, while the fleet sends at 60%
// of its rate, say nothing of its rate, and neither the script nor the Go
// controller speeds the climb back (CUBIC alone: 87.5/s a second after
// the decrease; sped all along, the configured 100).
func TestSharedBucketRoomNeedsTheRate(t *testing.T) {
	l, cfg, goSt, learn := sharedBesideGo(t, "keepup", false)
	// In use for two seconds, in the fleet and in the Go: the refusal
	// below is no start-up collision.
	agedKey(t, l.shared, "k")
	goSt.Sent.First = time.Now().Add(-2 * time.Second).UnixNano()
	// At the configured rate first, counts with room: nothing to climb.
	sendCounted(t, l, cfg, goSt, learn, 300*time.Millisecond, 1, 9)
	refusal := roomCount(time.Now(), 429, 0)
	refusal.HasRetryAfter = true
	learn(refusal) // 70/s, climbing back to 100
	start := time.Now()
	sendCounted(t, l, cfg, goSt, learn, time.Second, 0.6, 9)
	now := time.Now()
	got, want := l.EffectiveRate("k").PerSecond(), goSt.Rate(cfg, now)
	// (The counts of the first quarter second after the decrease still
	// find the requests before it, at the configured rate, and speed the
	// climb by about a third of a second: 91 or so.)
	cubic := control.Cubic(now.Sub(start).Seconds(), 70, 100, cfg.C, 0)
	assert.Less(t, want, cubic+7, "the Go controller's climb was not sped (CUBIC alone: %.1f)", cubic)
	assert.Less(t, got, cubic+7, "the fleet's climb was not sped (CUBIC alone: %.1f)", cubic)
	assert.InDelta(t, want, got, 4, "the fleet's rate")
}

// TestSharedBucketLevelsAtTheRefill: as TestControllerLevelsAtTheRefill,
// through Redis: climbing back after a decrease, sent at its rate to a
// provider whose bucket refills at 80/s, the fleet's counts fall while the
// bucket has room, and the script levels the climb off at the refill they
// show (the fleet's turns granted since the first count below full, less
// what the count fell, over the time), as the Go controller beside it does
// with the successes it heard; the provider refuses nothing.
func TestSharedBucketLevelsAtTheRefill(t *testing.T) {
	ctx := context.Background()
	l, cfg, goSt, learn := sharedBesideGo(t, "refill", false)
	start := time.Now()
	refusal := Signal{Now: start, SentAt: start, Status: 429, HasRetryAfter: true, Quotas: []Quota{{Limit: 10, HasLimit: true,
		Remaining: 0, HasRemaining: true, Reset: time.Second, HasReset: true, Kind: ResetKindBucket}}}
	learn(refusal) // 70/s, climbing back to 100
	provider, refused := &simBucket{capacity: 10, rate: 80, level: 10}, 0
	var goLevel float64
	for time.Since(start) < 3*time.Second {
		_, err := l.Wait(ctx, "k", 1, time.Second) // at the fleet's rate; carries the last count
		require.NoError(t, err)
		now := time.Now()
		ok, q := provider.take(now.Sub(start), time.Second)
		if !ok {
			refused++
			continue
		}
		s := Signal{Now: now, SentAt: now, Status: 200, Quotas: []Quota{q}}
		if d := learnSignal(goSt, cfg, &s); d.Why == "counted" && goLevel == 0 {
			goLevel = d.New.PerSecond()
		}
		require.NoError(t, l.Learn(ctx, "k", s).Err)
	}
	got := l.EffectiveRate("k").PerSecond()
	t.Logf("the Go controller levelled off at %.1f/s; after 3 s it is at %.1f/s, the fleet at %.1f/s", goLevel, goSt.Rate(cfg, time.Now()), got)
	assert.Zero(t, refused, "the provider's bucket was never empty")
	// (A measure is the most whole counts allow, up to a unit over its
	// span, which is at least drainMin: 4/s above the refill. The fleet's
	// turns pace the provider's bucket here, and every level-off and
	// room count moves them: 82 to 86/s in runs at 13a5898, the fleet up
	// to 4/s below the Go controller 3 s on, and 6/s under CI's load.)
	assert.InDelta(t, 80, goLevel, 1/control.DrainMin.Seconds()+1, "the Go controller levelled off at the refill")
	assert.Less(t, got, 92.0, "the fleet levelled off (climbing, it would be at 100)")
	assert.InDelta(t, goSt.Rate(cfg, time.Now()), got, 8, "the fleet's rate beside the Go controller's")
}

// TestLuaMeasuresAnEmptyBucket: a bucket kept empty, its counts at 0, is
// measured by what it accepted since the mark. The Go counts the successes
// it hears; the script counts the turns it granted, less the refusals it
// heard since the mark ('drf', counted by control.lua): 35 turns at 70/s
// over half a second, 10 of them refused, measure (25 + 1)/0.5 = 52/s in
// both, and the climb levels off nearAim under it. (Counting the refused
// turns too, the script measured 72/s, the rate the fleet went at, and
// levelled it off at 69.8/s.)
func TestLuaMeasuresAnEmptyBucket(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	run := func(ctx context.Context, script string) (any, error) { return rdb.Eval(ctx, script, nil, "@").Result() }
	const turns, refused, span = 35, 10, 500 * time.Millisecond
	mark := control.DrainMark{At: ctlEpoch, Rem: 0, N: turns - refused}
	est, measured := mark.Refills(ctlEpoch.Add(span), 0)
	require.True(t, measured, "counts that stay at 0 measure")
	require.InDelta(t, 52, est, 1e-9)
	for _, tc := range []struct {
		name string
		drf  int
		want float64
	}{
		{"the refusals heard", refused, est * control.NearAim},
		{"none heard", 0, 72 * control.NearAim}, // (35 + 1)/0.5 = 72/s
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := fmt.Sprintf(`redis.call('DEL', 'de')
local base = math.floor(now / ringSlot) * ringSlot - 5000000
redis.call('HSET', 'de', field.hist, base - 1000000, field.climb, base - 1000000, field.wmax, 70, field.w0, 70)
drain('de', 0, now, base, 0, 0, 0, 1, 1000000 / 70, 70, 100, 1, 10, 10)
for i = 1, %d do grant('de', base + i * %d, 1) end
redis.call('HSET', 'de', field.drf, %d, field.climb, base) -- (a level-off sets the climb at the script's now)
drain('de', 0, now, base + %d, 0, 0, 0, 1, 1000000 / 70, 70, 100, 1, 10, 10)
return {redis.call('HGET', 'de', field.wmax)}`, turns, (span / turns).Microseconds(), tc.drf, span.Microseconds())
			got := evalFloats(t, ctx, run, body)
			assert.InDelta(t, tc.want, got[0], 1e-6, "the script's level")
		})
	}
	t.Run("control.lua counts the refusals sent after the mark", func(t *testing.T) {
		l := newSharedTB(t, rdb, "emptycount", PerSecond(100), 10, WithCommandTimeout(roomyTimeout))
		count := func(status int, sent time.Time) Signal {
			s := Signal{Now: time.Now(), SentAt: sent, Status: status, Quotas: []Quota{{Limit: 10, HasLimit: true,
				Remaining: 0, HasRemaining: true, Reset: time.Second, HasReset: true, Kind: ResetKindBucket}}}
			s.HasRetryAfter = status == 429
			return s
		}
		start := time.Now()
		require.NoError(t, l.Learn(ctx, "k", count(429, start)).Err) // 70/s, climbing back
		time.Sleep(20 * time.Millisecond)
		marked := time.Now()
		require.NoError(t, l.Learn(ctx, "k", count(200, marked)).Err) // the first count of 0: the mark
		_, err := l.Wait(ctx, "k", 1, time.Second)                    // (which carries it to the script)
		require.NoError(t, err)
		require.NoError(t, l.Learn(ctx, "k", count(429, marked.Add(-time.Millisecond))).Err)
		require.NoError(t, l.Learn(ctx, "k", count(429, time.Now())).Err)
		require.NoError(t, l.Learn(ctx, "k", count(429, time.Now())).Err)
		drf, err := rdb.HGet(ctx, l.redisKeys(keyspace.ID("k"))[2], fieldDrf).Int()
		require.NoError(t, err)
		assert.Equal(t, 2, drf, "the two refusals sent after the mark, not the one sent before it")
	})
}

// TestLuaRingLosesThePastToTurnsAhead: the ring of grants holds 2.56 s of
// turns, past and to come alike; turns given further ahead than it
// reaches back take the slots of the oldest, and a count of those slots
// is not known any more, not 0. A fleet climbing back at 140/s after a
// decrease from 200/s, its turns given 1.8 s ahead (256 instances' queue,
// spread by the decrease), hears a count of 0 for a request sent 1.7 s
// after the drain's mark (a count of 11): the provider took 340 turns
// meanwhile, 200/s less a fall of 11, and the Go controller, which
// counts the successes it heard, levels nothing below the rate; nor does
// the script, which no longer has those turns. (Counting the overwritten
// slots as empty, it measured (150 - 11 + 1)/1.7 = 82/s and levelled the
// climb off at 80/s: 140 to 81-98/s right after the decrease, in 3 runs
// of 5 of bench/fleet's 16x16x1 processes.)
func TestLuaRingLosesThePastToTurnsAhead(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	run := func(ctx context.Context, script string) (any, error) { return rdb.Eval(ctx, script, nil, "@").Result() }
	const rate, configured, span, ahead = 140.0, 200.0, 1700 * time.Millisecond, 1800 * time.Millisecond
	const unit = 5 * time.Millisecond // the turns, at 200/s
	n := float64(span / unit)
	m := control.DrainMark{At: ctlEpoch, Rem: 11, N: n}
	est, measured := m.Refills(ctlEpoch.Add(span), 0)
	require.True(t, measured)
	goLevel := min(rate, max(est*control.NearAim, control.DrainLow*rate))
	require.Equal(t, rate, goLevel, "the Go controller: %.0f/s measured, above the rate", est)
	body := fmt.Sprintf(`redis.call('DEL', 'ra')
local sent = math.floor(now / ringSlot) * ringSlot - 2000
local base = sent - %d
redis.call('HSET', 'ra', field.hist, base - 1000000, field.climb, base - 1000000, field.wmax, %g, field.w0, %g)
local function count(at, rem)
  drain('ra', 0, now, at, 0, 0, rem, 1, 1000000 / %g, %g, %g, 1, 10, 20)
end
count(base, 11) -- the mark
for at = base + %d, now + %d, %d do grant('ra', at, 1) end
redis.call('HSET', 'ra', field.climb, base) -- (a level-off sets the climb at the script's now)
local within = between('ra', now - 500000, sent, base - 1000000)
local past = between('ra', base, sent, base - 1000000)
count(sent, 0)
return {string.format('%%.0f', within), tostring(past or -1), redis.call('HGET', 'ra', field.wmax)}`,
		span.Microseconds(), rate, rate, rate, rate, configured, unit.Microseconds(), ahead.Microseconds(), unit.Microseconds())
	got := evalFloats(t, ctx, run, body)
	assert.InDelta(t, 100, got[0], 2, "the last half second: held whole")
	assert.Equal(t, -1.0, got[1], "since the mark: not known")
	assert.InDelta(t, goLevel, got[2], 1e-9, "the script's level: the key's rate, as the Go's")
}

// TestSharedEstimateGoesAtMostBetaTwice: outcomes not sent at the key's
// rate — a burst refused all at once — make an estimate far below it; one
// decrease goes at most to beta twice of the rate refused, in the Go and in
// the script (the next refusal finds a limit that low). Two accepted and
// nine refused, all sent at once, then a refusal after the first decrease
// (by beta: too few outcomes then): the estimate is 70 × 2/12 = 11.7/s,
// and the rate goes to 0.49 × 70 = 34.3/s.
func TestSharedEstimateGoesAtMostBetaTwice(t *testing.T) {
	fc := clock.NewFake(time.Now())
	l := newSharedTB(t, redistest.Start(t).Client(t), "deep", PerSecond(100), 10, WithCommandTimeout(roomyTimeout), onClock(fc))
	cfg, goSt := l.learn, new(control.State)
	learn := func(s Signal) {
		learnSignal(goSt, &cfg, &s)
		require.NoError(t, l.Learn(context.Background(), "k", s).Err)
	}
	refusal := func(sent time.Time) Signal {
		return Signal{Now: fc.Now(), SentAt: sent, Status: 429, HasRetryAfter: true, Quotas: []Quota{{Limit: 10, HasLimit: true,
			Remaining: 0, HasRemaining: true, Reset: time.Second, HasReset: true, Kind: ResetKindBucket}}}
	}
	burst := fc.Now()
	for range 2 {
		learn(Signal{Now: fc.Now(), SentAt: burst, Status: 200})
	}
	for range 9 {
		learn(refusal(burst))
	}
	require.InDelta(t, 70, goSt.Rate(&cfg, fc.Now()), 1e-6, "the first refusal: by beta")
	fc.Advance(5 * time.Millisecond)
	learn(refusal(fc.Now()))
	est, ok := goSt.Meter.Estimate(fc.Now(), 70)
	require.True(t, ok)
	require.Less(t, est, 15.0, "an estimate far below the rate")
	want := cfg.Beta * cfg.Beta * 70
	assert.InDelta(t, want, goSt.Rate(&cfg, fc.Now()), 1e-6, "the Go: beta twice")
	assert.InDelta(t, want, l.EffectiveRate("k").PerSecond(), 1e-6, "the script: beta twice")
}

// TestSharedControllerSteps runs the controller's step tables through a
// SharedTokenBucket's Learn, so through internal/control/control.lua on a real
// redis-server: the fleet's controller decides as the Go one does. The
// limiter and its script run on one fake clock with the Go controller
// (onClock), so holds agree to the microsecond (the script's unit). One
// difference is by design: a success saying "remaining 0" from a provider
// known to refill continuously holds the key for one unit in the Go, and
// not at all in the fleet (a Redis round trip per response would cost more
// than the unit it waits).
func TestSharedControllerSteps(t *testing.T) {
	srv := redistest.Start(t)
	for i, tc := range ctlTables() {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now().Truncate(time.Microsecond) // the script's keys expire on Redis's own clock
			fc := clock.NewFake(start)
			opts := []LimiterOption{WithCommandTimeout(roomyTimeout), onClock(fc)}
			for _, o := range tc.opts {
				opts = append(opts, o)
			}
			rdb := srv.Client(t)
			l := newSharedTB(t, rdb, fmt.Sprintf("steps%d", i), PerSecond(100), 10, opts...)
			var goSt control.State
			goCfg := l.learn
			require.True(t, goCfg.Fleet, "the fleet's controller")
			require.InDelta(t, ctlBurst, goCfg.Burst, 1, "the usable burst, about the tables'")
			for j, step := range tc.steps {
				s := *step.signal()
				s.SentAt, s.Now = start.Add(step.sent), start.Add(step.at)
				if step.granted > 0 {
					// Granted through the script, at their time.
					require.False(t, s.SentAt.Before(fc.Now()), "step %d: granted before the step before it", j)
					fc.Advance(s.SentAt.Sub(fc.Now()))
					for range step.granted {
						_, err := l.Wait(context.Background(), "k", 1, 0)
						require.NoError(t, err, "step %d: granted", j)
					}
				}
				fc.Advance(s.Now.Sub(fc.Now()))
				now := s.Now
				bucketBefore := goSt.Shape == control.ShapeBucket
				step.grant(&goSt, &goCfg, s.SentAt)
				if probe, _ := goSt.Storm.After(s.SentAt, goSt.Rate(&goCfg, now)); probe {
					// The fleet's probes are the turns the script tells as
					// probes (TestProbesAfterAHold): as if this one had been.
					l.mu.Lock()
					l.probedLocked(keyspace.ID("k"), s.SentAt)
					l.mu.Unlock()
				}
				want := learnSignal(&goSt, &goCfg, &s)
				got := l.Learn(context.Background(), "k", s)
				require.NoError(t, got.Err, "step %d", j)

				if (bucketBefore || step.kind == ResetKindBucket) && !s.throttled() {
					assert.True(t, got.Hold.IsZero(), "step %d: the fleet does not hold a bucket for a unit", j)
				} else {
					assert.WithinDuration(t, want.Hold, got.Hold, time.Microsecond, "step %d: hold", j)
				}
				assert.Equal(t, want.NotBefore.IsZero(), got.NotBefore.IsZero(), "step %d: not before", j)
				assert.Equal(t, want.Why, got.Why, "step %d: why", j)
				if got.Why != "" || !got.Hold.IsZero() {
					// The instance knows the rate the script last told it.
					assert.InDelta(t, goSt.Rate(&goCfg, now), l.EffectiveRate("k").PerSecond(), 1e-6, "step %d: rate", j)
				}
				// The climb's plateau (plateauFor), as the script keeps it.
				pl, err := rdb.HGet(context.Background(), l.redisKeys(keyspace.ID("k"))[2], fieldPl).Float64()
				if errors.Is(err, redis.Nil) {
					pl, err = 0, nil
				}
				require.NoError(t, err, "step %d", j)
				assert.InDelta(t, goSt.Plateau, pl, 1e-6, "step %d: plateau", j)
				l.mu.Lock()
				lr := l.learnt.M[keyspace.ID("k")]
				l.mu.Unlock()
				if lr != nil && (goSt.Shape != control.ShapeUnknown || lr.shape != control.ShapeUnknown) {
					assert.Equal(t, goSt.Shape, lr.shape, "step %d: shape", j)
				}
			}
		})
	}
}

// TestSharedFallbackKeepsTheLearntRate: while Redis is down, a key's share
// comes from the rate the fleet learnt for it (here advertised), not from
// the configured one.
func TestSharedFallbackKeepsTheLearntRate(t *testing.T) {
	srv := redistest.Start(t)
	l := newSharedTB(t, srv.Client(t), "learnt-fallback", PerSecond(100), 10, WithCommandTimeout(roomyTimeout))
	ctx := context.Background()
	now := time.Now()
	d := l.Learn(ctx, "k", Signal{Now: now, SentAt: now, Status: 200, Quotas: []Quota{{
		Limit: 20, HasLimit: true, Window: time.Second, HasWindow: true, Remaining: 10, HasRemaining: true,
	}}})
	require.NoError(t, d.Err)
	require.Equal(t, PerSecond(20), l.EffectiveRate("k"))

	srv.Stop()
	_, err := l.Wait(ctx, "k", 1, 0) // finds Redis down
	require.NoError(t, err)
	fb := l.fallback.Load()
	require.NotNil(t, fb)
	live := float64(max(1, l.Stats().LiveInstances))
	assert.InDelta(t, 20/live, fb.limiter.(*TokenBucket).EffectiveRate("k").PerSecond(), 1e-9, "the learnt rate's share")
	assert.InDelta(t, 100/live, fb.limiter.(*TokenBucket).EffectiveRate("other").PerSecond(), 1e-9, "a key that learnt nothing: the configured rate's share")
	srv.Restart(t)
	require.Eventually(t, func() bool { return !l.Stats().Fallback }, 5*time.Second, 10*time.Millisecond)
}

// TestSharedPreCheckUsesTheLearntRate: the pacer's in-process refusal of a
// request behind the turns it holds predicts the script with the key's
// learnt rate. At 100/s configured and 20/s advertised, with a queue of 10
// units (half a second at 20/s), a fifth request 200 ms behind is within
// the queue: predicting with 100/s (a queue of 100 ms) would refuse it as
// full, which the script would not.
func TestSharedPreCheckUsesTheLearntRate(t *testing.T) {
	srv := redistest.Start(t)
	l := newSharedLB(t, srv.Client(t), "precheck", PerSecond(100), 10, WithCommandTimeout(roomyTimeout))
	ctx := context.Background()
	now := time.Now()
	require.NoError(t, l.Learn(ctx, "k", Signal{Now: now, SentAt: now, Status: 200, Quotas: []Quota{{
		Limit: 20, HasLimit: true, Window: time.Second, HasWindow: true,
	}}}).Err)
	_, err := l.Wait(ctx, "k", 1, 0)
	require.NoError(t, err)
	require.Equal(t, PerSecond(20), l.EffectiveRate("k"))
	errs := make(chan error, 4)
	for range 4 {
		go func() { _, err := l.Wait(ctx, "k", 1, 0); errs <- err }()
	}
	require.Eventually(t, func() bool { return l.Stats().Admitted == 5 }, time.Second, time.Millisecond)
	_, err = l.Wait(ctx, "k", 1, 0)
	assert.NoError(t, err, "within the queue at the learnt rate")
	for range 4 {
		require.NoError(t, <-errs)
	}
}

func TestParseControl(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply []any
		ok    bool
	}{
		{"good", []any{"100", "70", int64(1000000), int64(2), int64(0), int64(0), "1700000000000000"}, true},
		{"in a storm", []any{"100", "100", int64(0), int64(0), int64(1), int64(0), "1700000000000000"}, true},
		{"probes after the hold", []any{"100", "70", int64(1000000), int64(0), int64(0), int64(3), "1700000000000000"}, true},
		{"nil", nil, false},
		{"short", []any{"100", "70", int64(0), int64(0), int64(0), int64(0)}, false},
		{"end not a number", []any{"100", "70", int64(0), int64(0), int64(0), int64(0), "x"}, false},
		{"end an integer", []any{"100", "70", int64(0), int64(0), int64(0), int64(0), int64(5)}, false},
		{"end negative", []any{"100", "70", int64(0), int64(0), int64(0), int64(0), "-5"}, false},
		{"long", []any{"100", "70", int64(0), int64(0), int64(0), int64(0), "0", int64(0)}, false},
		{"rate not a string", []any{int64(100), "70", int64(0), int64(0), int64(0), int64(0), "1700000000000000"}, false},
		{"rate garbage", []any{"x", "70", int64(0), int64(0), int64(0), int64(0), "1700000000000000"}, false},
		{"rate zero", []any{"100", "0", int64(0), int64(0), int64(0), int64(0), "1700000000000000"}, false},
		{"rate infinite", []any{"100", "inf", int64(0), int64(0), int64(0), int64(0), "1700000000000000"}, false},
		{"hold negative", []any{"100", "70", int64(-1), int64(0), int64(0), int64(0), "1700000000000000"}, false},
		{"hold a string", []any{"100", "70", "1", int64(0), int64(0), int64(0), "1700000000000000"}, false},
		{"shape unknown", []any{"100", "70", int64(0), int64(7), int64(0), int64(0), "1700000000000000"}, false},
		{"shape negative", []any{"100", "70", int64(0), int64(-1), int64(0), int64(0), "1700000000000000"}, false},
		{"storm neither 0 nor 1", []any{"100", "70", int64(0), int64(0), int64(2), int64(0), "1700000000000000"}, false},
		{"probes negative", []any{"100", "70", int64(0), int64(0), int64(0), int64(-1), "1700000000000000"}, false},
		{"probes too many", []any{"100", "70", int64(0), int64(0), int64(0), int64(control.StormProbes + 1), "1700000000000000"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			require.NotPanics(t, func() { _, err = parseControl(tc.reply) })
			assert.Equal(t, tc.ok, err == nil, "%v", err)
		})
	}
}

// TestLuaDrainMarkMatchesGo: the first count of a bucket's stretch below
// full, from which its counts measure the refill, is taken alike by the Go
// controller (drainMark) and the fleet's script (drain's dra and drr): a
// count that rises by two or more above the mark takes it again (what came
// before the rise says nothing of the fall after it), one that shows the
// bucket full drops it, and one two seconds on takes it again.
func TestLuaDrainMarkMatchesGo(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	run := func(ctx context.Context, script string) (any, error) { return rdb.Eval(ctx, script, nil, "@").Result() }
	type count struct {
		at  time.Duration
		rem float64
	}
	const ms = time.Millisecond
	for _, tc := range []struct {
		name   string
		counts []count
		want   *count // the mark; nil for none
	}{
		{"a rise of 8 takes it again", []count{{0, 0}, {100 * ms, 8}}, &count{100 * ms, 8}},
		{"a rise of 1 keeps it", []count{{0, 5}, {100 * ms, 6}}, &count{0, 5}},
		{"a fall keeps it", []count{{0, 5}, {100 * ms, 3}}, &count{0, 5}},
		{"full drops it", []count{{0, 3}, {100 * ms, 9}}, nil},
		{"two seconds on", []count{{0, 3}, {2100 * ms, 2}}, &count{2100 * ms, 2}},
		{"a rise of 2", []count{{0, 3}, {100 * ms, 5}}, &count{100 * ms, 5}},
		{"a rise after a fall, below the mark", []count{{0, 6}, {100 * ms, 2}, {200 * ms, 5}, {300 * ms, 3}}, &count{0, 6}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m control.DrainMark
			epoch := time.Unix(0, 0)
			lines := []string{"redis.call('DEL', 'dm')", "local base = now - 5000000"}
			for _, c := range tc.counts {
				m.Count(epoch.Add(c.at), control.Quota{Remaining: c.rem, HasRemaining: true, Limit: 10, HasLimit: true})
				lines = append(lines, fmt.Sprintf("drain('dm', 0, now, base + %d, %g, %g, %g, 1, 10000, 50, 100, 0, 10, 10)",
					c.at.Microseconds(), c.rem, c.rem, c.rem))
			}
			lines = append(lines, "local st = redis.call('HMGET', 'dm', field.dra, field.drr)",
				"if not st[1] then return {'-1', '-1'} end",
				"return {string.format('%.0f', tonumber(st[1]) - base), st[2]}")
			got := evalFloats(t, ctx, run, strings.Join(lines, "\n"))
			if tc.want == nil {
				assert.True(t, m.At.IsZero(), "no mark in Go")
				assert.Equal(t, []float64{-1, -1}, got, "no mark in Lua")
				return
			}
			assert.Equal(t, control.DrainMark{At: epoch.Add(tc.want.at), Rem: tc.want.rem}, m, "the Go mark")
			assert.Equal(t, []float64{float64(tc.want.at.Microseconds()), tc.want.rem}, got, "the Lua mark (us from the first count, remaining)")
		})
	}
}

// TestLuaRingMovesWithTheTurns: the ring of grants moves as a change of the
// rate moves the turns given (regrant), so that it still counts them when
// they go out; and a bucket's count leaves the units less the requests in
// flight when its answer was read, not less the turns given until the
// report reached the script (report).
func TestLuaRingMovesWithTheTurns(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	run := func(ctx context.Context, script string) (any, error) { return rdb.Eval(ctx, script, nil, "@").Result() }
	ring := `redis.call('DEL', 'rg')
local base = math.floor(now / ringSlot) * ringSlot - 1000000
redis.call('HSET', 'rg', field.hist, string.format('%.0f', base - 100000))
for i = 0, 9 do grant('rg', base + 5000 + i * ringSlot, 1) end
local function counts()
  return string.format('%.0f', between('rg', base - 1, base + 99999, base - 100000)),
    string.format('%.0f', between('rg', base - 1, base + 199999, base - 100000))
end
`
	// Ten units, one a slot over 100 ms; spread by 2 from the first slot's
	// start (which does not move): 5 within the first 100 ms, all 10 within
	// 200 ms. Brought back in by a half: all 10 within 100 ms again.
	got := evalFloats(t, ctx, run, ring+`local a, b = counts()
regrant('rg', base, base + 100000, 2)
local c, d = counts()
regrant('rg', base, base + 200000, 0.5)
local e, f = counts()
return {a, b, c, d, e, f}`)
	assert.Equal(t, []float64{10, 10, 5, 10, 10, 10}, got, "within 100 and 200 ms: before, spread by 2, brought back")

	// A count of 9 for the request of the first slot: read 2 ms after it
	// was sent, no other turn was in flight (the ring's slots, 10 ms wide,
	// count none between the two); read as the script runs, a second
	// later, the nine turns given since would be.
	got = evalFloats(t, ctx, run, ring+`local sent = base + 5000
local k1, l1 = report('rg', now, 9, 1000000, 100000, sent, 0, base + 100000, 2, 1000, sent + 2000)
local k2, l2 = report('rg', now, 9, 1000000, 100000, sent, 0, base + 100000, 2, 1000, now)
return {string.format('%.0f', k1), string.format('%.0f', l1), string.format('%.0f', k2), string.format('%.0f', l2)}`)
	assert.Equal(t, []float64{0, 9, 0, 0}, got, "keep (every turn given, less its own) and left: read at once, read late")
}

// TestSharedLearnsABucketFromItsGrants: more than twice a quota's limit
// granted by the fleet within its reset (here 5 turns, a limit of 1 in
// 1 s) shows a bucket; the script learns it while it applies the count of
// the response that says 0 is left, and that response then holds nothing
// (a bucket's success: the rate is the wait). The script once wrote the
// shape it had read before that count back over the one it learnt, and
// each such response held the fleet for a probe (100 ms): 9 a second,
// for seconds, against a provider enforcing 62/s with a burst of 1.
func TestSharedLearnsABucketFromItsGrants(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	l := newSharedTB(t, srv.Client(t), "grants-shape", PerSecond(100), 10, WithCommandTimeout(roomyTimeout))
	for range 5 {
		_, err := l.Wait(ctx, "k", 1, 0)
		require.NoError(t, err)
	}
	now := time.Now()
	d := l.Learn(ctx, "k", Signal{Now: now, SentAt: now.Add(-2 * time.Millisecond), Status: 200, Quotas: []Quota{{
		Limit: 1, HasLimit: true, Remaining: 0, HasRemaining: true, Reset: time.Second, HasReset: true,
	}}})
	require.NoError(t, d.Err)
	assert.True(t, d.Hold.IsZero(), "a bucket's success holds nothing; held %v", d.Hold.Sub(now))
	l.mu.Lock()
	lr := l.learnt.M[keyspace.ID("k")]
	l.mu.Unlock()
	require.NotNil(t, lr)
	assert.Equal(t, control.ShapeBucket, lr.shape)
}

// TestSharedTriesBackARateAccepted: as TestControllerTriesBackARateAccepted,
// through Redis: after a second of turns at 100/s granted and accepted, a
// throttle without counts sets a try of 100/s (from 95/s) two holds after
// the hold's end (the second throttle, early in the climb back, puts it
// off); the fleet's rate jumps back to it then, as the Go controller's; a
// try refused goes back to the climb, and the next waits twice as long.
func TestSharedTriesBackARateAccepted(t *testing.T) {
	const ms = time.Millisecond
	ctx := context.Background()
	l, cfg, goSt, learn := sharedBesideGo(t, "back", false)
	for start := time.Now(); time.Since(start) < 1100*ms; {
		_, err := l.Wait(ctx, "k", 1, time.Second)
		require.NoError(t, err)
		now := time.Now()
		learn(Signal{Now: now, SentAt: now, Status: 200})
	}
	const ra = 150 * ms // a hold: two of them are 300 ms
	throttle := func() Signal {
		now := time.Now()
		return Signal{Now: now, SentAt: now.Add(-ms), Status: 429, RetryAfter: ra, HasRetryAfter: true}
	}
	// rateAt waits for a turn at t or later, and returns the rate the
	// fleet granted it at and the Go controller's then.
	rateAt := func(at time.Time) (fleet, goRate float64) {
		time.Sleep(time.Until(at))
		_, err := l.Wait(ctx, "k", 1, time.Second)
		require.NoError(t, err)
		now := time.Now()
		return l.EffectiveRate("k").PerSecond(), goSt.Rate(cfg, now)
	}
	learn(throttle())
	require.Equal(t, 100.0, goSt.Good, "the rate accepted for a second")
	time.Sleep(ra + 20*ms)
	learn(throttle()) // early in the climb back: beta twice, a low aim
	back := goSt.Back
	require.WithinDuration(t, time.Now().Add(3*ra), back, 20*ms, "two holds after the hold's end")

	fleet, goRate := rateAt(back.Add(-80 * ms))
	assert.Less(t, goRate, 60.0, "the Go controller climbs back, before the try")
	assert.InDelta(t, goRate, fleet, 2, "the fleet's rate, before the try")
	fleet, goRate = rateAt(back.Add(10 * ms))
	assert.InDelta(t, 95, goRate, 0.5, "the Go controller tries 100/s, from a twentieth under")
	assert.InDelta(t, goRate, fleet, 0.5, "the fleet tries 100/s")

	learn(throttle()) // the try refused
	next := goSt.Back
	require.WithinDuration(t, time.Now().Add(ra+4*ra), next, 20*ms, "twice as long after the hold")
	fleet, goRate = rateAt(next.Add(-80 * ms))
	assert.Less(t, goRate, 60.0, "back to the climb")
	assert.InDelta(t, goRate, fleet, 2, "the fleet's rate, back to the climb")
	fleet, goRate = rateAt(next.Add(10 * ms))
	assert.InDelta(t, 95, goRate, 0.5)
	assert.InDelta(t, goRate, fleet, 0.5, "the fleet tries again")
}
