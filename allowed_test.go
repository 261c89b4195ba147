package egress

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/control"
	"github.com/egress-go/egress/internal/keyed"
)

// Tests of the allowed path's shortcuts: a response that says nothing of
// the limit (control.State.Silent and quiet), a response no reader reads
// (signalConfig.reads), the Transport's quick way through its TokenBucket
// (one reading of the clock, the bucket handed from grant to learning),
// and the per-key counts. Each shortcut is checked against the long way.

// TestQuietIsLearn: on states that learn built from random responses, and
// grants in between, every silent signal leaves the state as learn leaves
// it, and learn decides nothing on it.
func TestQuietIsLearn(t *testing.T) {
	t.Parallel() // states and signals alone, no clock
	cfgs := map[string]control.Config{"default": control.DefaultConfig(50)}
	c := control.DefaultConfig(50)
	c.Discover = false
	cfgs["without discovery"] = c
	c = control.DefaultConfig(50)
	c.Advertise = false
	cfgs["without advertised limits"] = c
	c = control.DefaultConfig(50)
	c.Fleet, c.Burst = true, 10
	cfgs["a fleet's"] = c
	for name, cfg := range cfgs {
		t.Run(name, func(t *testing.T) {
			seen := map[control.Shape]int{}
			for seed := range uint64(propertyRuns(60)) {
				rng := rand.New(rand.NewPCG(seed, 7))
				var st control.State
				now := ctlEpoch
				for step := range 400 {
					now = now.Add(time.Duration(rng.Int64N(int64(150 * time.Millisecond))))
					if rng.IntN(3) == 0 {
						st.Spend(now, now, 1, st.Rate(&cfg, now)) // a grant, as the limiter makes them
						continue
					}
					s := randomSignal(rng, now)
					r := s.response()
					if !st.Silent(&r) {
						st.Learn(&cfg, &r)
						continue
					}
					seen[st.Shape]++
					quiet := st
					quiet.Quiet(r.SentAt)
					d := st.LearnAll(&cfg, &r) // learn's whole reading, which learn skips for a silent signal
					require.True(t, reflect.DeepEqual(st, quiet), "seed %d step %d: %+v: quiet left the state otherwise than learn", seed, step, s)
					assert.Equal(t, d.From, d.To, "seed %d step %d: learn changed the rate", seed, step)
					d.From, d.To = 0, 0
					require.Equal(t, control.Decision{}, d, "seed %d step %d: learn decided on a silent signal", seed, step)
				}
			}
			for _, sh := range []control.Shape{control.ShapeUnknown, control.ShapeWindow, control.ShapeBucket} {
				assert.Positive(t, seen[sh], "no silent signal met a key of shape %d", sh)
			}
		})
	}
}

// randomSignal returns a response read at now: silent ones, throttles with
// and without counts, counts of windows and buckets, billing errors and
// failed attempts.
func randomSignal(rng *rand.Rand, now time.Time) Signal {
	s := Signal{Now: now, SentAt: now.Add(-time.Duration(rng.Int64N(int64(200 * time.Millisecond)))), InFlight: rng.IntN(3)}
	statuses := []int{200, 200, 200, 201, 204, 404, 500, 503, 429, 403, 0}
	s.Status = statuses[rng.IntN(len(statuses))]
	if rng.IntN(4) == 0 {
		s.RetryAfter, s.HasRetryAfter = time.Duration(rng.IntN(3))*time.Second, true
	}
	s.Scope = Scope(rng.IntN(5) % 4) // ScopeUnknown twice as often
	s.Throttling = s.Status == 403 && rng.IntN(2) == 0
	if rng.IntN(2) == 0 {
		limit := float64(5 + rng.IntN(60))
		q := Quota{
			Dimension: Requests, Limit: limit, HasLimit: rng.IntN(5) > 0,
			Remaining: float64(rng.IntN(int(limit) + 1)), HasRemaining: true,
			Reset: time.Duration(rng.Int64N(int64(3 * time.Second))), HasReset: rng.IntN(5) > 0,
			Kind: ResetKind(rng.IntN(3)),
		}
		if rng.IntN(3) == 0 {
			q.Remaining = 0
		}
		if rng.IntN(4) == 0 {
			q.Window, q.HasWindow = time.Second, true
		}
		s.Quotas = []Quota{q}
	}
	return s
}

// TestUnreadSignalIsTimeless: a response that runs no reader (reads is
// false) is read the same at any time, so the quick way need not read the
// clock for it; and every header of the built-in dialects, and a 429, make
// it read.
func TestUnreadSignalIsTimeless(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	headers := [][]string{
		nil,
		{"Content-Type", "application/json"},
		{"Date", "Fri, 01 May 2026 10:00:30 GMT"},
		{"Expires", "Fri, 01 May 2026 10:01:00 GMT", "Age", "30", "Cache-Control", "max-age=60"},
		{"X-Request-Id", "req_123", "Server", "nginx"},
	}
	bodies := []string{
		"",
		`{"error":{"code":"insufficient_quota","type":"insufficient_quota"}}`,
		`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`,
		`{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"30s"}]}}`,
		`{"error":{"code":"lock_timeout"}}`,
	}
	var c *signalConfig
	unread := 0
	for _, status := range []int{200, 201, 204, 400, 401, 403, 404, 409, 500, 502, 503, 504, 529} {
		for _, h := range headers {
			for _, body := range bodies {
				resp := sigResponse(status, h, body)
				if reads, _ := c.reads(resp); reads {
					continue
				}
				unread++
				a := c.readSignal(resp, "api.example.com", t0, t0.Add(time.Second), time.Hour)
				b := c.readSignal(sigResponse(status, h, body), "api.example.com", t0, t0.Add(time.Hour), time.Hour)
				b.Now = a.Now
				assert.Equal(t, a, b, "%d %v %s: read otherwise at another time", status, h, body)
				var u Signal
				c.unread(&u, sigResponse(status, h, body), "api.example.com", t0, time.Hour)
				u.Now = a.Now
				assert.Equal(t, a, u, "%d %v %s: unread otherwise", status, h, body)
			}
		}
	}
	assert.Positive(t, unread)

	reads, builtin := c.reads(sigResponse(429, nil, ""))
	assert.True(t, reads && builtin, "a 429")
	for _, name := range allSignalHeaders() {
		reads, builtin := c.reads(sigResponse(200, []string{name, "1"}, ""))
		assert.True(t, reads && builtin, name)
	}
	own := &signalConfig{readers: []SignalReader{retryReader{}}}
	reads, builtin = own.reads(sigResponse(200, nil, ""))
	assert.True(t, reads, "a Transport's own readers read every response")
	assert.False(t, builtin, "the built-in ones only what may be theirs")
}

// countingClock is a fake clock that counts its readings.
type countingClock struct {
	*clock.Fake
	reads atomic.Int64
}

func (c *countingClock) Now() time.Time {
	c.reads.Add(1)
	return c.Fake.Now()
}

// TestAllowedPathReadsTheClockOnce: a request granted at once by the
// Transport's TokenBucket, on the Transport's clock, reads the clock once,
// with or without retries, and is counted as sent then; a response with
// rate-limit headers is read at a time of its own; a limiter on a clock of
// its own goes the long way.
func TestAllowedPathReadsTheClockOnce(t *testing.T) {
	var status atomic.Int64
	status.Store(200)
	var header atomic.Value
	header.Store(http.Header{})
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: int(status.Load()), Header: header.Load().(http.Header).Clone(), Body: http.NoBody, Request: req}, nil
	})
	for _, tc := range []struct {
		name string
		opts []Option
		long int64 // the readings of the long way: the send, the response, and the start of retries
	}{
		{"without retries", nil, 2},
		{"with retries", []Option{WithRetry(RetryPolicy{MaxAttempts: 1})}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb, fc := newTokenBucketOnFake(t, PerSecond(100), 10)
			cc := &countingClock{Fake: fc}
			tb.clock = cc
			tr := mustNewTransport(t, base, append([]Option{WithLimiter(tb)}, tc.opts...)...)
			tr.clock = cc
			req := newPlainGet(t, context.Background(), "https://api.example.com/v1")

			status.Store(200)
			header.Store(http.Header{})
			mustSend200(t, tr, req) // the key's first: its bucket is made, under the write lock, which reads the clock again
			cc.reads.Store(0)
			mustSend200(t, tr, req)
			assert.Equal(t, int64(1), cc.reads.Swap(0), "a request granted at once, answered without rate-limit headers")
			bk := tb.buckets.M["api.example.com"]
			require.NotNil(t, bk)
			acc, ref := bk.ctl.Meter.LastSecond(fc.Now())
			assert.Equal(t, [2]int32{2, 0}, [2]int32{acc, ref}, "the acceptances are counted")
			assert.Equal(t, fc.Now().UnixNano(), bk.ctl.Sent.At[0], "granted at the reading")

			header.Store(http.Header{"X-Ratelimit-Remaining": {"5"}, "X-Ratelimit-Limit": {"10"}})
			mustSend200(t, tr, req)
			assert.Equal(t, int64(2), cc.reads.Swap(0), "a response with rate-limit headers is read at its own time")

			header.Store(http.Header{})
			status.Store(429)
			_, err := tr.RoundTrip(req)
			require.NoError(t, err)
			cc.reads.Store(0)
			assert.False(t, tb.buckets.M["api.example.com"].ctl.Hold.IsZero(), "the 429 holds the key: learn read the time")

			tb.clock = fc // a clock of its own: the long way
			fc.Advance(time.Minute)
			status.Store(200)
			mustSend200(t, tr, req)
			assert.Equal(t, tc.long, cc.reads.Load(), "the Transport's clock, read as before")
		})
	}
}

// TestTokenBucketLearnsInTheBucketOfTheKey: learnAt learns in the bucket
// that granted the request while it is the key's, and in the key's bucket
// of the moment once a sweep has dropped it, as Learn does.
func TestTokenBucketLearnsInTheBucketOfTheKey(t *testing.T) {
	tb, fc := newTokenBucketOnFake(t, PerSecond(10), 1)
	ctx := context.Background()
	_, g, err := tb.waitFrom(ctx, "k", 1, 0, time.Time{})
	require.NoError(t, err)
	require.NotNil(t, g.bk)
	assert.Equal(t, fc.Now(), g.at, "granted at once, at the clock's time")

	ok := Signal{Now: fc.Now(), SentAt: fc.Now(), Status: 200}
	tb.learnAt(g.bk, "k", &ok)
	assert.Same(t, g.bk, tb.buckets.M["k"])
	acc, _ := g.bk.ctl.Meter.LastSecond(fc.Now())
	assert.Equal(t, int32(1), acc, "learnt in the granting bucket, the key's")

	fc.Advance(2 * keyed.SweepEvery) // full again and at rest: the next sweep drops it
	_, err = tb.Wait(ctx, "other", 1, 0)
	require.NoError(t, err)
	_, kept := tb.buckets.M["k"]
	require.False(t, kept, "swept")
	assert.True(t, g.bk.dropped)

	throttled := Signal{Now: fc.Now(), SentAt: fc.Now(), Status: 429, RetryAfter: time.Second, HasRetryAfter: true}
	d := tb.learnAt(g.bk, "k", &throttled)
	assert.Equal(t, fc.Now().Add(time.Second), d.Hold)
	now := tb.buckets.M["k"]
	require.NotNil(t, now, "learnt through the map: a bucket of its own again")
	assert.NotSame(t, g.bk, now)
	assert.Equal(t, d.Hold, now.ctl.Hold)
	_, err = tb.Wait(ctx, "k", 1, time.Millisecond)
	assert.ErrorIs(t, err, ErrRateLimited, "the key is held")
}

// TestTokenBucketStaleReadingGoesAtOnce: a reading of the clock older than
// one a grant of the bucket was given is taken as that one: tokens there
// then go at once, with no reservation, no turn and no allocation.
func TestTokenBucketStaleReadingGoesAtOnce(t *testing.T) {
	tb, fc := newTokenBucketOnFake(t, PerSecond(100), 10)
	t1 := fc.Now()
	g, err := tb.reserveAt("k", 1, budget{}, t1)
	require.NoError(t, err)
	require.Zero(t, g.delay)
	g, err = tb.reserveAt("k", 1, budget{}, t1.Add(-time.Millisecond))
	require.NoError(t, err)
	assert.Zero(t, g.delay, "read before the last grant's reading: as of that")
	assert.Nil(t, g.r)
	assert.Equal(t, t1, tb.buckets.M["k"].seen)

	// At 10¹² a second a burst of 2³⁰ keeps its margin only full: a grant
	// at the reading of the one before finds it a token short, which
	// refills in a picosecond.
	fast, fc2 := newTokenBucketOnFake(t, PerSecond(1e12), 1<<30)
	t2 := fc2.Now()
	_, err = fast.reserveAt("k", 1, budget{}, t2)
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(100, func() {
		g, err = fast.reserveAt("k", 1, budget{}, t2)
	})
	require.NoError(t, err)
	assert.Zero(t, g.delay)
	assert.Nil(t, g.r)
	assert.Zero(t, allocs)
}

// TestKeyCounts: counts go up and down without losing one, across
// goroutines and the sweeps that new keys set off; idle keys are dropped
// lazily, live ones never.
func TestKeyCounts(t *testing.T) {
	s := newKeyCounts()
	a := s.inc("a")
	assert.Same(t, a, s.inc("a"))
	assert.Equal(t, 1, a.dec())
	assert.Equal(t, 0, a.dec())
	assert.Equal(t, 0, s.count("a"))

	assert.Equal(t, 0, s.swap("near", 1))
	assert.Equal(t, 1, s.swap("near", 0))
	assert.Equal(t, 0, s.swap("near", 0))
	assert.Equal(t, 0, s.swap("never", 0))

	live := make([]*keyCount, 100)
	for i := range live {
		live[i] = s.inc(fmt.Sprint("live", i))
	}
	for i := range 20000 {
		s.inc(fmt.Sprint("idle", i)).dec()
	}
	assert.LessOrEqual(t, s.n.Load(), int64(max(2*len(live), keySweepMin)), "idle keys are dropped")
	for i, c := range live {
		assert.Equal(t, 1, s.count(fmt.Sprint("live", i)), "a live key is kept")
		assert.Equal(t, 0, c.dec())
	}

	// The counter raised last, swept at 0 while it was the last, is not
	// raised again: the key gets a new one, in the map.
	h := s.inc("hot")
	assert.Same(t, h, s.hot.Load())
	h.dec()
	for i := range 4 * keySweepMin {
		s.inc(fmt.Sprint("sweep", i)).dec()
	}
	require.Negative(t, h.n.Load(), "the sweep took the counter raised last")
	s.hot.Store(h)
	h2 := s.inc("hot")
	assert.NotSame(t, h, h2)
	assert.Equal(t, 1, s.count("hot"))
	assert.Equal(t, 0, h2.dec())

	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				key := fmt.Sprint("k", (g+i)%5)
				if i%7 == 0 {
					key = fmt.Sprint("g", g, "i", i) // new keys meanwhile: sweeps
				}
				c := s.inc(key)
				if n := s.count(key); n < 1 {
					t.Errorf("%s: count %d while held", key, n)
				}
				if n := c.dec(); n < 0 {
					t.Errorf("%s: count %d", key, n)
				}
			}
		}()
	}
	wg.Wait()
	for i := range 5 {
		assert.Equal(t, 0, s.count(fmt.Sprint("k", i)))
	}
}

// TestRetryBudgetCountsEveryDeposit: first attempts counted at once from
// many goroutines are all counted, in their second, and a slot moves on to
// a later second whole.
func TestRetryBudgetCountsEveryDeposit(t *testing.T) {
	for _, t0 := range []time.Time{time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC), time.Date(1969, 12, 31, 23, 59, 55, 0, time.UTC)} {
		var b retryBudget
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 1000 {
					b.deposit(t0.Add(time.Duration(i%2) * time.Second))
				}
			}()
		}
		wg.Wait()
		sec := t0.Unix() + 1
		assert.Equal(t, 8000, b.firstsOf(sec, sec-9), "%v", t0)
		assert.Equal(t, 4000, b.firstsOf(sec, sec), "%v: the last second's", t0)
		b.deposit(t0.Add(10 * time.Second)) // t0's slot, ten seconds on
		sec = t0.Unix() + 10
		assert.Equal(t, 4001, b.firstsOf(sec, sec-9), "%v", t0)
	}
}
