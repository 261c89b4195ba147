package egress

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/fakeapi"
	"github.com/egress-go/egress/internal/keyspace"
	"github.com/egress-go/egress/internal/redistest"
)

// The probes after a hold, and the storms they tell apart (see storm in
// internal/control), in real time: the limiters part the probes, and a
// provider whose burst is a unit or two is not taken for a storm.

// TestProbesAfterAHold: a throttle without counts holds the key for its
// 1 s Retry-After, and the second request after the hold is refused the
// same way: a sign of a storm, whose hold has three probes (at 100/s
// configured: a floor of 10/s; their gaps take a quarter of the hold).
// Waiters queued meanwhile go after it, the first three a floor's unit
// (100 ms) apart, the rest at the key's rate again; a probe refused the
// same way is a storm's: for every limiter of the package that keeps a
// rate, local and shared.
func TestProbesAfterAHold(t *testing.T) {
	limiters := map[string]func(t *testing.T) Limiter{
		"TokenBucket": func(t *testing.T) Limiter {
			l, err := NewTokenBucket(PerSecond(100), 1)
			require.NoError(t, err)
			return l
		},
		"LeakyBucket": func(t *testing.T) Limiter {
			l, err := NewLeakyBucket(PerSecond(100), 64)
			require.NoError(t, err)
			return l
		},
	}
	for name, newShared := range bothShared() {
		limiters[name] = func(t *testing.T) Limiter {
			return newShared(t, redistest.Start(t).Client(t), "probes")
		}
	}
	for name, newLimiter := range limiters {
		t.Run(name, func(t *testing.T) {
			l := newLimiter(t)
			const key, probes, waiters, gap = "api.example.com", 3, 6, 100 * time.Millisecond
			// took is how long the last call took: a shared limiter's
			// hold ends on Redis's clock, and the Decision dates it from the
			// reply's receipt, up to that much after its true end.
			var took time.Duration
			throttle := func(sent time.Time) Decision {
				start := time.Now()
				defer func() { took = time.Since(start) }()
				return l.(Learner).Learn(context.Background(), key, Signal{
					Status: http.StatusTooManyRequests, Now: start, SentAt: sent,
					RetryAfter: time.Second, HasRetryAfter: true,
				})
			}
			d := throttle(time.Now().Add(-time.Millisecond))
			require.False(t, d.Hold.IsZero(), "the throttle holds the key: %+v", d)
			time.Sleep(time.Until(d.Hold.Add(20 * time.Millisecond)))
			d = throttle(d.Hold.Add(15 * time.Millisecond)) // the second request after the hold
			require.False(t, d.Hold.IsZero(), "the sign holds the key: %+v", d)
			wait, _ := startWaiters(t, l, key, waiters)
			done := wait()
			unit := time.Duration(float64(time.Second) / l.(interface{ EffectiveRate(string) Rate }).EffectiveRate(key).PerSecond())
			var offs []time.Duration
			for _, at := range done {
				offs = append(offs, at.Sub(d.Hold).Round(time.Millisecond))
			}
			t.Logf("after the hold's end: %v (a unit at the rate %v; the call that set the hold took %v)", offs, unit, took.Round(100*time.Microsecond))
			assert.GreaterOrEqual(t, offs[0], -5*time.Millisecond-took, "nothing goes before the hold's end")
			assert.Less(t, offs[0], gap/2, "the first probe at the hold's end")
			for i := 1; i < probes; i++ {
				assert.GreaterOrEqual(t, done[i].Sub(done[i-1]), gap-10*time.Millisecond, "probe %d a floor's unit after the one before", i+1)
			}
			for i := probes; i < waiters; i++ {
				assert.Less(t, done[i].Sub(done[i-1]), gap/2, "request %d at the key's rate again", i+1)
			}
			// A probe, refused the same way: a storm. (For the shared
			// limiters, a probe is a turn the script told as one.) A probe
			// granted more than a unit after it was due may have gone with
			// the request after it, and is no probe: the first that went on
			// time is taken (on a busy machine, a waiter wakes late).
			due := d.Hold
			for i := range probes {
				if done[i].Sub(due) < unit-3*time.Millisecond {
					d = throttle(done[i])
					assert.Equal(t, "storm", d.Why, "probe %d, refused: %+v", i+1, d)
					return
				}
				due = done[i].Add(gap)
			}
			t.Logf("every probe went more than a unit late: none is checked")
		})
	}
}

// TestSmallBurstIsNoStorm: the provider enforces 62/s with a burst of one
// and sends no counts; the clients are configured at 100/s. After a hold,
// the second request at the lowered rate (70/s) finds the provider's bucket
// empty: it is refused for the quota. Taken for a storm (as a refusal among
// the first two requests after a hold was before the probes), the key's
// decreases were undone and it sent at 100/s with half its requests
// refused, for as long as it ran. Now it is a sign: the probes after the
// next hold are a floor's unit apart, none is refused, and the key follows
// the limit as discovery finds it.
func TestSmallBurstIsNoStorm(t *testing.T) {
	for name, newLimiter := range map[string]func() (Limiter, error){
		"TokenBucket": func() (Limiter, error) { return NewTokenBucket(PerSecond(100), 10) },
		"LeakyBucket": func() (Limiter, error) { return NewLeakyBucket(PerSecond(100), 32) },
	} {
		t.Run(name, func(t *testing.T) {
			api := adpProvider(t, fakeapi.Config{Rate: 62, Burst: 1, Latency: 2 * time.Millisecond})
			l, err := newLimiter()
			require.NoError(t, err)
			in := adpNewInstance(t, l)
			fleet := []*adpInstance{in, in, in, in} // one Transport, 4·8 senders
			const d = 6 * time.Second
			r := adpDrive(t, api, fleet, d)
			key := adpHostKey(api)
			r.log(t, fleet[:1], key)
			for _, c := range in.rec.rateLog() {
				assert.NotEqual(t, "storm", c.why, "a quota refused at its burst of one is no storm: %v", in.rec.rateLog())
			}
			assert.LessOrEqual(t, adpSum(r.limited, 3, len(r.limited)), 6, "429s after the first 3 s")
			assert.Less(t, in.adj.EffectiveRate(key).PerSecond(), 62.0, "the key's rate, under the limit")
		})
	}
}

// TestStormIsTold: 30% of the requests within the limit are refused with a
// 429 and a Retry-After of 1 s, without counts. The probes after a hold
// (three, each refused with a chance of 30%) tell the storm within a few
// holds; from then on the 429s delay only their own requests, the key's
// rate is the configured one, and the provider accepts most of what the
// storm lets through.
func TestStormIsTold(t *testing.T) {
	api := adpProvider(t, fakeapi.Config{Rate: 100, Burst: 10, Latency: 2 * time.Millisecond, Seed: 7,
		Storm: fakeapi.Storm{Share: 0.3, RetryAfter: time.Second}})
	l, err := NewTokenBucket(PerSecond(100), 10)
	require.NoError(t, err)
	in := adpNewInstance(t, l)
	fleet := []*adpInstance{in, in, in, in}
	const d = 6 * time.Second
	r := adpDrive(t, api, fleet, d)
	key := adpHostKey(api)
	r.log(t, fleet[:1], key)
	storm := false
	for _, c := range in.rec.rateLog() {
		storm = storm || c.why == "storm"
	}
	assert.True(t, storm, "the storm is told: %v", in.rec.rateLog())
	assert.Equal(t, PerSecond(100), in.adj.EffectiveRate(key), "the storm's decreases undone")
	// 70 a second let through at 100/s; the 32 senders, each a second
	// asleep after a 429, send about that.
	assert.GreaterOrEqual(t, adpSum(r.accepted, 4, 6), 80, "accepted in the last 2 s")
}

// TestSharedHearsHolds: a hold told on the channel, "<id> <us left>
// e<its end on the server's clock> p<probes>", is recorded with its probes;
// the same hold heard again later (its end measured a message's delay
// apart, as a hold this instance set is echoed) is the same hold, and
// keeps the time it was first heard, so that the turns reserved since are
// not taken again; a hold with another end is a new one. Broken messages
// record nothing, and a probe count out of range is none.
func TestSharedHearsHolds(t *testing.T) {
	srv := redistest.Start(t)
	l := newSharedTB(t, srv.Client(t), "hear-holds", PerSecond(100), 1, WithCommandTimeout(roomyTimeout))
	s := l.shared
	mark := func(id string) (pauseMark, bool) {
		s.mu.Lock()
		defer s.mu.Unlock()
		p, ok := s.pauses[id]
		return p, ok
	}
	for _, p := range []string{"k", "k -5", "k 0", "k abc", "k e5", " 500000"} {
		s.hear(p)
	}
	_, ok := mark("k")
	assert.False(t, ok, "nothing recorded from broken messages")

	s.hear("k 500000 e1700000000000000 p3")
	first, ok := mark("k")
	require.True(t, ok)
	assert.Equal(t, 3, first.probes)
	assert.Equal(t, int64(1700000000000000), first.end)
	assert.InDelta(t, 500*time.Millisecond, time.Until(first.until), float64(50*time.Millisecond))

	time.Sleep(5 * time.Millisecond)
	s.hear("k 500000 e1700000000000000 p3") // the same hold, heard later
	echo, _ := mark("k")
	assert.Equal(t, first, echo, "the same hold: not heard anew")

	s.hear("k 500000 e1700000000005000 p1") // another hold, ending later
	later, _ := mark("k")
	assert.Equal(t, int64(1700000000005000), later.end)
	assert.Equal(t, 1, later.probes)
	assert.True(t, later.heard.After(first.heard), "a new hold is heard anew")

	s.hear("j 500000 e1700000000000000 p11")
	j, ok := mark("j")
	require.True(t, ok)
	assert.Equal(t, 0, j.probes, "a probe count out of range is none")
}

// TestSharedExtendedHoldKeepsItsProbes: a shared limiter reserves turns
// ahead, so the probe after a hold can be granted before the hold ends. A
// second throttle without counts that extends the hold (a refusal of the
// same burst, answered a little later) keeps the probe granted: the next
// turn after the hold's new end is no probe. (Counted afresh, the fleet
// sent a second probe 14 ms after the first; a provider with a burst of
// one refused it, and the storm was told by the limiter's own probes.)
func TestSharedExtendedHoldKeepsItsProbes(t *testing.T) {
	for name, newShared := range bothShared() {
		t.Run(name, func(t *testing.T) {
			l := newShared(t, redistest.Start(t).Client(t), "extend")
			const key = "api.example.com"
			s := sharedOf(l)
			id := keyspace.ID(key)
			// (A hold of 1 s, one probe: no sign, and not long, see
			// longHold. The calls below come long before its end, on a
			// busy machine too; nothing waits for it.)
			throttle := func(sent time.Time) Decision {
				return l.(Learner).Learn(context.Background(), key, Signal{
					Status: http.StatusTooManyRequests, Now: time.Now(), SentAt: sent,
					RetryAfter: time.Second, HasRetryAfter: true,
				})
			}
			reserve := func() reserved { return reserveTurns(t, s, id, 1)[0] }
			sent := time.Now().Add(-time.Millisecond)
			first := throttle(sent)
			require.False(t, first.Hold.IsZero(), "the throttle holds the key: %+v", first)
			probe := reserve()
			assert.True(t, probe.probe, "the first turn after the hold is its probe: %+v", probe)

			time.Sleep(5 * time.Millisecond)
			second := throttle(sent) // the same burst's, answered later
			require.True(t, second.Hold.After(first.Hold), "the second throttle extends the hold: %v, then %v", first.Hold, second.Hold)
			next := reserve()
			assert.False(t, next.probe, "the hold extended keeps its one probe, granted: %+v", next)
		})
	}
}

// TestSharedLongHoldHasItsProbes: a throttle without counts whose
// Retry-After (2 s) is longer than a bucket at the floor (10/s at 100/s
// configured) asks of a request sent early is followed by all its probes,
// with no sign before it (see longHold): the fleet's first ten turns after
// the hold are probes, a floor's unit (100 ms) apart, and the eleventh is
// not. One of 1 s has one probe.
func TestSharedLongHoldHasItsProbes(t *testing.T) {
	for name, newShared := range bothShared() {
		t.Run(name, func(t *testing.T) {
			for _, c := range []struct {
				retryAfter time.Duration
				probes     int
			}{{2 * time.Second, 10}, {time.Second, 1}} {
				l := newShared(t, redistest.Start(t).Client(t), "long")
				s := sharedOf(l)
				const key = "api.example.com"
				id := keyspace.ID(key)
				d := l.(Learner).Learn(context.Background(), key, Signal{
					Status: http.StatusTooManyRequests, Now: time.Now(), SentAt: time.Now().Add(-time.Millisecond),
					RetryAfter: c.retryAfter, HasRetryAfter: true,
				})
				require.False(t, d.Hold.IsZero(), "the throttle holds the key: %+v", d)
				var turns []time.Time
				for i := range c.probes + 1 {
					r := reserveTurns(t, s, id, 1)[0]
					assert.Equal(t, i < c.probes, r.probe, "turn %d after a hold of %v: a probe while there are %d", i+1, c.retryAfter, c.probes)
					turns = append(turns, r.at.Add(r.wait))
				}
				for i := 1; i < c.probes; i++ {
					// (Each turn dated from its reply's receipt: a reply read late
					// moves it on a busy machine.)
					assert.InDelta(t, 100*time.Millisecond, turns[i].Sub(turns[i-1]), float64(20*time.Millisecond), "probe %d a floor's unit after the one before", i+1)
				}
			}
		})
	}
}

// TestSharedUnsaidThrottleHasAProbe: a throttle that says nothing at all
// (no count, no Retry-After) holds the fleet a unit at the floor rate
// (100 ms at 100/s configured), and the first turn after it is a probe.
// When turns given before the hold fall after its end (a queue longer
// than the hold), the probe goes a gap after the last of them, and the
// next turn a unit after the probe, not with it (a bucket of ten does not
// spend what it refilled meanwhile beside the probe). (Without discovery: a
// decrease would spread the turns given at the new rate, from the hold's
// end, and move them out of the probe's way by itself.)
func TestSharedUnsaidThrottleHasAProbe(t *testing.T) {
	opts := []LimiterOption{WithCommandTimeout(roomyTimeout), WithoutDiscovery()}
	for name, newShared := range map[string]func(t *testing.T, rdb redis.UniversalClient) Limiter{
		"SharedTokenBucket": func(t *testing.T, rdb redis.UniversalClient) Limiter {
			return newSharedTB(t, rdb, "unsaid", PerSecond(100), 10, opts...)
		},
		"SharedLeakyBucket": func(t *testing.T, rdb redis.UniversalClient) Limiter {
			return newSharedLB(t, rdb, "unsaid", PerSecond(100), 64, opts...)
		},
	} {
		t.Run(name, func(t *testing.T) {
			for _, queued := range []int{0, 30} {
				l := newShared(t, redistest.Start(t).Client(t))
				s := sharedOf(l)
				const key = "api.example.com"
				id := keyspace.ID(key)
				reserve := func(n int) []reserved { return reserveTurns(t, s, id, n) }
				turn := func(r reserved) time.Time { return r.at.Add(r.wait) }
				var last time.Time
				if queued > 0 {
					given := reserve(queued)
					last = turn(given[queued-1])
				}
				start := time.Now()
				d := l.(Learner).Learn(context.Background(), key, Signal{
					Status: http.StatusTooManyRequests, Now: start, SentAt: start.Add(-time.Millisecond),
				})
				require.False(t, d.Hold.IsZero(), "the throttle holds the key: %+v", d)
				assert.InDelta(t, 100*time.Millisecond, d.Hold.Sub(start), float64(20*time.Millisecond), "held a unit at the floor rate")
				next := reserve(2)
				assert.True(t, next[0].probe, "%d queued: the first turn after the hold is a probe: %+v", queued, next[0])
				assert.False(t, next[1].probe, "%d queued: one probe, without a sign", queued)
				if queued > 0 {
					assert.GreaterOrEqual(t, turn(next[0]).Sub(last), 90*time.Millisecond, "the probe a gap after the turns given before the hold")
				}
				assert.GreaterOrEqual(t, turn(next[1]).Sub(turn(next[0])), 8*time.Millisecond, "%d queued: the next turn a unit after the probe", queued)
			}
		})
	}
}

// reserveTurns asks the script of s for n turns of one unit on key id, in
// one batch, as a waiter's leader does.
func reserveTurns(t *testing.T, s *shared, id string, n int) []reserved {
	t.Helper()
	batch := make([]*pending, n)
	for i := range batch {
		batch[i] = &pending{cost: 1}
	}
	res, _, err := s.runReserve(id, batch)
	require.NoError(t, err)
	require.Len(t, res, n)
	return res
}

// agedKey dates the first grant of key in Redis two seconds back on the
// server's clock, so that a throttle is not taken for a start-up collision
// (control.lua): for tests of what a throttle does to a key in use.
func agedKey(t *testing.T, s *shared, key string) {
	t.Helper()
	ctx := context.Background()
	now, err := s.rdb.Time(ctx).Result()
	require.NoError(t, err)
	state := s.redisKeys(keyspace.ID(key))[2]
	require.NoError(t, s.rdb.HSet(ctx, state, fieldHist, now.Add(-2*time.Second).UnixMicro()).Err())
}

// sharedOf returns the shared state of one of the package's shared
// limiters.
func sharedOf(l Limiter) *shared {
	switch l := l.(type) {
	case *SharedTokenBucket:
		return l.shared
	case *SharedLeakyBucket:
		return l.shared
	}
	panic("not a shared limiter")
}
