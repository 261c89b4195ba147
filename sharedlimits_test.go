package egress

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/argv"
	"github.com/egress-go/egress/internal/redistest"
)

// Tests of SharedLimits (sharedlimits.go, internal/lua/limits.lua) against
// a real redis-server. Each limiter value stands for one process of the
// fleet and gets its own client.

func newSharedLimits(t *testing.T, rdb redis.UniversalClient, name string, limits []Limit, opts ...LimiterOption) *SharedLimits {
	t.Helper()
	opts = append([]LimiterOption{WithCommandTimeout(roomyTimeout)}, opts...)
	l, err := NewSharedLimits(rdb, name, limits, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func TestNewSharedLimitsValidates(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ok := []Limit{BucketOf(Requests, PerSecond(1), 1)}
	for _, tc := range []struct {
		name   string
		limits []Limit
		opts   []LimiterOption
		want   string
	}{
		{"a", nil, nil, "NewSharedLimits: limits none"},
		{"a", []Limit{WindowOf(Tokens, 0, time.Second)}, nil, "NewSharedLimits: limit 0 (tokens): n 0"},
		{"a b", ok, nil, `NewSharedLimits: name "a b"`},
		{"a", ok, []LimiterOption{WithFallbackRate(PerSecond(3))}, "NewSharedLimits: WithFallbackRate"},
		{"a", ok, []LimiterOption{WithAdaptive(AdaptivePolicy{})}, "NewSharedLimits: WithAdaptive"},
		{"a", ok, []LimiterOption{WithCommandTimeout(0)}, "WithCommandTimeout"},
	} {
		_, err := NewSharedLimits(rdb, tc.name, tc.limits, tc.opts...)
		require.ErrorIs(t, err, ErrInvalidConfig)
		assert.Contains(t, err.Error(), tc.want)
	}
	_, err := NewSharedLimits(nil, "a", ok)
	require.ErrorIs(t, err, ErrInvalidConfig)
}

// TestSharedLimitsAgreesWithLimits runs random schedules of reservations,
// settlements and caps through a Limits and, on the same fake instants,
// through the script of a SharedLimits, and requires the same decision and
// the same turn, to the microsecond, at every step: the Go and Lua
// arithmetic are the same. Rates and windows are drawn so that every
// interval is whole microseconds.
func TestSharedLimitsAgreesWithLimits(t *testing.T) {
	t.Parallel() // on a fake clock and its own redis-server: it may run beside the property runs
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	rates := []Rate{PerSecond(1), PerSecond(10), PerSecond(50), PerSecond(100), PerSecond(1000), PerMinute(20)}
	dims := []Dimension{Requests, Tokens, InputTokens}
	const schedules, steps = 500, 60
	moved := 0 // turns given again sooner, alike: the schedules exercise it
	for sch := range schedules {
		rng := rand.New(rand.NewPCG(42, uint64(sch)))
		var limits []Limit
		windowsOnly := sch%2 == 0 // half the schedules: turns are given again on a refund
		for range 1 + rng.IntN(3) {
			d := dims[rng.IntN(len(dims))]
			var lim Limit
			if !windowsOnly && rng.IntN(2) == 0 {
				lim = BucketOf(d, rates[rng.IntN(len(rates))], 1+rng.IntN(20))
			} else {
				lim = WindowOf(d, 1+rng.IntN(50), time.Duration(1+rng.IntN(2000))*time.Millisecond)
			}
			if !windowsOnly && rng.IntN(3) == 0 {
				lim = lim.Parent(HostOf)
			}
			limits = append(limits, lim)
		}
		local, fc := newLimitsOnFake(t, limits...)
		// A quarter of the schedules with the transit margin: the buckets'
		// reserve and the windows' longer span, alike.
		margin := time.Duration(0)
		if sch%4 == 1 {
			margin = 5 * time.Millisecond
		}
		local.margin = margin // before any key's state is made
		shared, err := NewSharedLimits(rdb, fmt.Sprintf("agree%d", sch), limits, WithCommandTimeout(roomyTimeout), WithTransitMargin(margin),
			onClock(fc)) // its process and its script (caller.Now) on the same instants as local's
		require.NoError(t, err)
		// A grant whose turn is to come has a waiter, as WaitCost registers
		// it, when the script gives turns again (every limit a window, none
		// a parent's): the Limits then gives the same turns again.
		type pair struct {
			local, shared Grant
			w             *limitsWaiter
		}
		var grants []*pair
		keys := []string{"h/a", "h/b", "g/a"}
		for step := range steps {
			fc.Advance(time.Duration(rng.IntN(300)) * time.Millisecond)
			now := fc.Now()
			local.mu.Lock()
			for _, g := range grants {
				if g.w != nil {
					if g.w.at.Before(g.local.At) {
						moved++
					}
					g.local.At, g.shared.turn = g.w.at, g.w.at.UnixMicro()
					if !g.w.at.After(now) {
						local.unwait(g.w) // its waiter wakes and goes
						g.w = nil
					}
				}
			}
			local.mu.Unlock()
			where := fmt.Sprintf("schedule %d step %d (limits %v)", sch, step, limits)
			switch op := rng.IntN(10); {
			case op < 6: // a reservation
				key := keys[rng.IntN(len(keys))]
				var cost Cost
				for _, d := range dims {
					cost = limCostWith(cost, d, rng.IntN(12))
				}
				maxWait := time.Duration(rng.IntN(3000)) * time.Millisecond
				if rng.IntN(4) == 0 {
					maxWait = 0 // none
				}
				local.mu.Lock()
				lg, _, lerr := local.reserveLocked(key, cost, budget{maxWait: maxWait})
				var w *limitsWaiter
				if lerr == nil && shared.replan && lg.At.After(now) {
					local.seq++
					w = &limitsWaiter{key: key, cost: cost, at: lg.At, seq: local.seq, moved: make(chan struct{}, 1)}
					local.waiters = append(local.waiters, w)
				}
				local.mu.Unlock()
				if tooHigh(limits, cost) {
					continue // refused before the script, alike
				}
				p := &limitsPending{cost: cost, res: make(chan limitsReply, 1)}
				if maxWait > 0 {
					p.limit = now.Add(maxWait)
				}
				replies, err := shared.run(shared.redisKeys(key), []*limitsPending{p})
				require.NoError(t, err, where)
				r := replies[0]
				require.Equal(t, lerr != nil, r.refused, "%s: refused (local err %v, shared wait %v)", where, lerr, r.wait)
				if lerr == nil {
					require.Equal(t, lg.At.Sub(now), r.wait, "%s: wait", where)
					require.Equal(t, lg.At.UnixMicro(), r.turn, "%s: turn", where)
					grants = append(grants, &pair{lg, Grant{Key: key, Cost: cost, turn: r.turn}, w})
				}
			case op < 9 && len(grants) > 0: // a settlement
				i := rng.IntN(len(grants))
				g := grants[i]
				grants = append(grants[:i], grants[i+1:]...)
				var actual Cost
				for _, d := range dims {
					actual = limCostWith(actual, d, rng.IntN(16))
				}
				if g.w != nil { // a waiter leaves before its turn
					local.mu.Lock()
					local.unwait(g.w)
					local.cancelLocked(g.local, now)
					local.mu.Unlock()
					shared.Settle(g.shared, Cost{})
					continue
				}
				local.Settle(g.local, actual)
				shared.Settle(g.shared, actual)
			default: // a provider's count of tokens
				q := Quota{Dimension: Tokens, Remaining: float64(1 + rng.IntN(30)), HasRemaining: true,
					Reset: time.Duration(rng.IntN(3000)) * time.Millisecond, HasReset: rng.IntN(2) == 0, Kind: ResetKind(rng.IntN(3))}
				if rng.IntN(5) == 0 {
					q.Reset = 0 // a reset of 0 is one, not none
				}
				sig := Signal{Now: now, Status: http.StatusOK, Quotas: []Quota{q}}
				key := keys[rng.IntN(len(keys))]
				local.Learn(context.Background(), key, sig)
				shared.Learn(context.Background(), key, sig)
			}
		}
		require.NoError(t, shared.Close())
	}
	t.Logf("%d turns given again sooner", moved)
	require.Greater(t, moved, 30)
}

// tooHigh reports whether cost is above a limit's capacity.
func tooHigh(limits []Limit, cost Cost) bool {
	for _, l := range limits {
		if cost.Of(l.dim) > l.n {
			return true
		}
	}
	return false
}

// TestSharedLimitsAllOrNothing: a request refused by the window takes
// nothing from the bucket, and the instances share both.
func TestSharedLimitsAllOrNothing(t *testing.T) {
	srv := redistest.Start(t)
	limits := []Limit{BucketOf(Requests, PerMinute(1), 3), WindowOf(Tokens, 100, time.Minute)}
	a := newSharedLimits(t, srv.Client(t), "aon", limits)
	b := newSharedLimits(t, srv.Client(t), "aon", limits)
	ctx := context.Background()
	_, err := a.WaitCost(ctx, "k", Cost{Requests: 1, Tokens: 80}, 0)
	require.NoError(t, err)
	_, err = b.WaitCost(ctx, "k", Cost{Requests: 1, Tokens: 30}, 50*time.Millisecond)
	var le *LimitError
	require.ErrorAs(t, err, &le, "the window has 20 tokens left, fleet-wide")
	assert.Equal(t, 30, le.Cost, "the cost in the dimension that refused")
	assert.Greater(t, le.Wait, 50*time.Second)
	for _, l := range []*SharedLimits{b, a} {
		_, err = l.WaitCost(ctx, "k", Cost{Requests: 1}, 50*time.Millisecond)
		require.NoError(t, err, "the refused request took no request from the bucket")
	}
	_, err = b.WaitCost(ctx, "k", Cost{Requests: 1}, 50*time.Millisecond)
	require.ErrorIs(t, err, ErrRateLimited, "the bucket's 3 are spent")
	assert.Equal(t, int64(3), a.Stats().Admitted+b.Stats().Admitted)
}

// TestSharedLimitsWindowExactForTheFleet: two instances, 8 waiters each,
// against 20 requests per 300 ms. The turns the script gave (on its clock)
// hold at most 20 in any window of 300 ms, and the fleet uses it in full.
func TestSharedLimitsWindowExactForTheFleet(t *testing.T) {
	srv := redistest.Start(t)
	const n, w = 20, 300 * time.Millisecond
	limits := []Limit{WindowOf(Requests, n, w)}
	fleet := []*SharedLimits{newSharedLimits(t, srv.Client(t), "win", limits), newSharedLimits(t, srv.Client(t), "win", limits)}
	var mu sync.Mutex
	var turns []int64
	end := time.Now().Add(1200 * time.Millisecond)
	var wg sync.WaitGroup
	for _, l := range fleet {
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(end) {
					g, err := l.WaitCost(context.Background(), "k", Cost{Requests: 1}, 0)
					if !assert.NoError(t, err) {
						return
					}
					mu.Lock()
					turns = append(turns, g.turn)
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	slices.Sort(turns)
	span := argv.Micros(w + jitterTolerance)
	for i := range turns {
		j, _ := slices.BinarySearch(turns, turns[i]+span)
		require.LessOrEqual(t, j-i, n, "grants in the window from turn %d", i)
	}
	elapsed := time.Duration(turns[len(turns)-1]-turns[0]) * time.Microsecond
	windows := int(elapsed / (w + jitterTolerance)) // whole windows after the first turn's
	assert.GreaterOrEqual(t, len(turns), n*windows, "each window of the run used in full over %v", elapsed)
	a, b := fleet[0].Stats(), fleet[1].Stats()
	assert.Less(t, a.RoundTrips+b.RoundTrips, a.Admitted+b.Admitted, "waiters of a key share calls")
}

// TestSharedLimitsParentOnCluster: per-route buckets under a host-wide
// window, on a three-master Redis Cluster, from two instances: the routes
// of a host share the host's slot, so that one script call decides both;
// different hosts spread over the Cluster.
func TestSharedLimitsParentOnCluster(t *testing.T) {
	c := redistest.StartCluster(t)
	limits := []Limit{BucketOf(Requests, PerMinute(1), 5), WindowOf(Requests, 8, time.Minute).Parent(HostOf)}
	a := newSharedLimits(t, c.Client(t), "par", limits)
	b := newSharedLimits(t, c.Client(t), "par", limits)
	ctx := context.Background()
	admitted := func(l *SharedLimits, key string, tries int) int {
		n := 0
		for range tries {
			if _, err := l.WaitCost(ctx, key, Cost{Requests: 1}, 20*time.Millisecond); err == nil {
				n++
			} else {
				require.ErrorIs(t, err, ErrRateLimited)
			}
		}
		return n
	}
	assert.Equal(t, 5, admitted(a, "api.example.com/v1/a", 7), "the route's burst")
	assert.Equal(t, 3, admitted(b, "api.example.com/v1/b", 7), "the host's window has 3 left")
	assert.Equal(t, 0, admitted(a, "api.example.com/v1/c", 2), "nor for any other route of the host")
	for i := range 12 {
		host := fmt.Sprintf("h%d.example.com", i)
		assert.Equal(t, 1, admitted([]*SharedLimits{a, b}[i%2], host+"/x", 1), host)
	}
	assert.False(t, a.Stats().Fallback || b.Stats().Fallback, "no CROSSSLOT, no fallback")

	perNode := map[string]int{}
	var mu sync.Mutex
	require.NoError(t, c.Client(t).ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		keys, err := n.Keys(ctx, "egress:{par:*").Result()
		mu.Lock()
		perNode[n.Options().Addr] = len(keys)
		mu.Unlock()
		return err
	}))
	spread := 0
	for _, k := range perNode {
		if k > 0 {
			spread++
		}
	}
	assert.GreaterOrEqual(t, spread, 2, "hosts spread over the Cluster: %v", perNode)
}

// TestSharedLimitsSettleFleetWide: a grant settled on one instance frees
// (or takes) room on the other at once.
func TestSharedLimitsSettleFleetWide(t *testing.T) {
	srv := redistest.Start(t)
	limits := []Limit{WindowOf(Tokens, 100, time.Minute), BucketOf(InputTokens, PerMinute(60), 100)}
	a := newSharedLimits(t, srv.Client(t), "settle", limits)
	b := newSharedLimits(t, srv.Client(t), "settle", limits)
	ctx := context.Background()
	g, err := a.WaitCost(ctx, "k", Cost{Tokens: 90, InputTokens: 90}, 0)
	require.NoError(t, err)
	_, err = b.WaitCost(ctx, "k", Cost{Tokens: 50}, 20*time.Millisecond)
	require.ErrorIs(t, err, ErrRateLimited)
	_, err = b.WaitCost(ctx, "k", Cost{InputTokens: 50}, 20*time.Millisecond)
	require.ErrorIs(t, err, ErrRateLimited)
	a.Settle(g, Cost{Tokens: 20, InputTokens: 20})
	_, err = b.WaitCost(ctx, "k", Cost{Tokens: 50, InputTokens: 50}, 20*time.Millisecond)
	require.NoError(t, err, "the refund of 70 is the fleet's")

	// A charge beyond the estimate takes room from the fleet, at most n.
	g, err = b.WaitCost(ctx, "k", Cost{Tokens: 1}, 20*time.Millisecond)
	require.NoError(t, err)
	b.Settle(g, Cost{Tokens: 1000})
	_, err = a.WaitCost(ctx, "k", Cost{Tokens: 1}, 20*time.Millisecond)
	var le *LimitError
	require.ErrorAs(t, err, &le)
	assert.Greater(t, le.Wait, 50*time.Second, "the charge counts as the whole window, from its turn")
}

// TestSharedLimitsCancelGivesBack: a waiter whose context ends gives its
// grant back, fleet-wide.
func TestSharedLimitsCancelGivesBack(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	l := newSharedLimits(t, rdb, "cancel", []Limit{WindowOf(Requests, 2, time.Minute)})
	ctx := context.Background()
	for range 2 {
		_, err := l.WaitCost(ctx, "k", Cost{Requests: 1}, 0)
		require.NoError(t, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err := l.WaitCost(cctx, "k", Cost{Requests: 1}, 0)
	require.ErrorIs(t, err, context.Canceled)
	l.work.Wait() // the give-back, and the lead
	grants := l.redisKeys("k")[2]
	z, err := rdb.ZRangeWithScores(ctx, grants, 0, -1).Result()
	require.NoError(t, err)
	costs := 0
	for _, m := range z {
		costs += int(costOfMember(t, m.Member))
	}
	assert.Equal(t, 2, costs, "the cancelled grant takes nothing: %v", z)
}

func costOfMember(t *testing.T, m any) int64 {
	s, ok := m.(string)
	require.True(t, ok)
	_, c, ok := strings.Cut(s, ":")
	require.True(t, ok)
	var n int64
	_, err := fmt.Sscan(c, &n)
	require.NoError(t, err)
	return n
}

// TestSharedLimitsLearnHoldsAndCapsTheFleet: a 429's Retry-After heard by
// one instance holds the key for the other, and a waiter already given a
// turn inside the hold takes a new one after it; a provider's remaining
// tokens cap the fleet's window.
func TestSharedLimitsLearnHoldsAndCapsTheFleet(t *testing.T) {
	srv := redistest.Start(t)
	limits := []Limit{BucketOf(Requests, PerSecond(5), 1), WindowOf(Tokens, 1000, time.Minute)}
	a := newSharedLimits(t, srv.Client(t), "learn", limits)
	b := newSharedLimits(t, srv.Client(t), "learn", limits)
	ctx := context.Background()
	_, err := b.WaitCost(ctx, "k", Cost{Requests: 1}, 0)
	require.NoError(t, err)
	// b's next turn is 200 ms away; a hears a 429 with Retry-After 1 s meanwhile.
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := b.WaitCost(ctx, "k", Cost{Requests: 1}, 0)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	now := time.Now()
	d := a.Learn(ctx, "k", Signal{Now: now, SentAt: now, Status: http.StatusTooManyRequests, RetryAfter: time.Second, HasRetryAfter: true})
	require.False(t, d.Hold.IsZero())
	require.NoError(t, recvWithin(t, done))
	assert.GreaterOrEqual(t, time.Since(start), time.Second, "the waiter given a turn inside the hold goes after it")
	_, err = a.WaitCost(ctx, "other", Cost{Requests: 1}, 20*time.Millisecond)
	require.NoError(t, err, "other keys are not held")

	now = time.Now()
	b.Learn(ctx, "k", Signal{Now: now, SentAt: now, Status: http.StatusOK, Quotas: []Quota{
		{Dimension: Tokens, Remaining: 100, HasRemaining: true, Reset: 30 * time.Second, HasReset: true},
	}})
	_, err = a.WaitCost(ctx, "k", Cost{Tokens: 100}, 20*time.Millisecond)
	require.NoError(t, err, "the 100 tokens the provider said remain")
	_, err = a.WaitCost(ctx, "k", Cost{Tokens: 1}, 20*time.Millisecond)
	var le *LimitError
	require.ErrorAs(t, err, &le, "then none until the provider's reset")
	assert.InDelta(t, 30*time.Second, le.Wait, float64(time.Second))
}

// TestSharedLimitsFallback: with Redis down, each instance runs a local
// Limits at its share of each limit, and returns to Redis when it is back.
func TestSharedLimitsFallback(t *testing.T) {
	srv := redistest.Start(t)
	var events []bool
	var mu sync.Mutex
	obs := WithFallbackObserver(func(_ string, active bool, _ error) {
		mu.Lock()
		events = append(events, active)
		mu.Unlock()
	})
	limits := []Limit{WindowOf(Requests, 10, time.Minute), BucketOf(Tokens, PerMinute(600), 600), WindowOf(InputTokens, 1000, time.Minute)}
	l, err := NewSharedLimits(srv.Client(t), "fb", limits, WithCommandTimeout(100*time.Millisecond), obs)
	require.NoError(t, err)
	defer func() { _ = l.Close() }()
	newSharedLimits(t, srv.Client(t), "fb", limits) // a second instance: each has half
	ctx := context.Background()
	spinUntil(t, "both instances counted", func() bool { return l.Stats().LiveInstances == 2 })
	_, err = l.WaitCost(ctx, "big", Cost{InputTokens: 800}, 0)
	require.NoError(t, err)
	srv.Stop()
	admitted := 0
	var g Grant
	for range 8 {
		gg, err := l.WaitCost(ctx, "k", Cost{Requests: 1, Tokens: 10}, 10*time.Millisecond)
		if err == nil {
			admitted++
			g = gg
		}
	}
	assert.True(t, l.Stats().Fallback)
	assert.Equal(t, 5, admitted, "half of the window: two instances were live")
	_, err = l.WaitCost(ctx, "big", Cost{InputTokens: 800}, 10*time.Millisecond)
	require.NoError(t, err, "a cost as large as one granted before still goes, above the share of 500")
	l.Settle(g, Cost{Requests: 1, Tokens: 5}) // settles in the fallback, never blocks
	srv.Restart(t)
	spinUntil(t, "back to Redis", func() bool { return !l.Stats().Fallback })
	_, err = l.WaitCost(ctx, "k", Cost{Requests: 1}, 10*time.Millisecond)
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []bool{true, false}, events)
}

// TestTransportSettlesUsageFleetWide: a Transport on one instance settles
// a streamed response's usage in Redis: the other instance sees the
// tokens the response used, not the estimate.
func TestTransportSettlesUsageFleetWide(t *testing.T) {
	srv := redistest.Start(t)
	limits := []Limit{WindowOf(Requests, 100, time.Hour), WindowOf(Tokens, 1000, time.Hour)}
	a := newSharedLimits(t, srv.Client(t), "usage", limits)
	b := newSharedLimits(t, srv.Client(t), "usage", limits)
	api := llmServer(t, openAIStream, func() int { return http.StatusOK })
	tr, err := New(nil, WithLimiter(a), WithCosts(func(*http.Request) Cost { return Cost{Requests: 1, Tokens: 990} }))
	require.NoError(t, err)
	resp, err := (&http.Client{Transport: tr}).Post(api.URL, "application/json", strings.NewReader(`{"max_tokens":990}`))
	require.NoError(t, err)
	key := strings.TrimPrefix(api.URL, "http://")
	_, err = b.WaitCost(context.Background(), key, Cost{Tokens: 100}, 20*time.Millisecond)
	require.ErrorIs(t, err, ErrRateLimited, "the estimate holds until the body's end")
	b2, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, openAIStream, string(b2))
	_, err = b.WaitCost(context.Background(), key, Cost{Tokens: 1000 - 19}, 20*time.Millisecond)
	require.NoError(t, err, "settled fleet-wide at the usage's total_tokens (19)")
}

// TestSharedLimitsMaxWaitWhileTheLeadHoldsBack: while this process holds a
// turn far ahead, its lead keeps new waiters back for a while; a waiter
// whose max wait is shorter is refused at once all the same.
func TestSharedLimitsMaxWaitWhileTheLeadHoldsBack(t *testing.T) {
	srv := redistest.Start(t)
	l := newSharedLimits(t, srv.Client(t), "holdback", []Limit{WindowOf(Requests, 2, 10*time.Second)})
	ctx := context.Background()
	for range 2 {
		_, err := l.WaitCost(ctx, "k", Cost{Requests: 1}, 0)
		require.NoError(t, err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _, _ = l.WaitCost(wctx, "k", Cost{Requests: 1}, 0) }() // a turn 10 s away
	spinUntil(t, "a turn held far ahead", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		ln, ok := l.lanes.M["k"]
		return ok && ln.held.After(time.Now().Add(5*time.Second))
	})
	start := time.Now()
	_, err := l.WaitCost(ctx, "k", Cost{Requests: 1}, 50*time.Millisecond)
	require.ErrorIs(t, err, ErrRateLimited)
	assert.Less(t, time.Since(start), 500*time.Millisecond, "refused soon, not after the lead's hold-back")
}

// TestSharedLimitsClose: Close returns the waiters still queued with an
// error, waits for the calls and give-backs under way, and a closed
// limiter refuses without falling back.
func TestSharedLimitsClose(t *testing.T) {
	srv := redistest.Start(t)
	fallbacks := 0
	l, err := NewSharedLimits(srv.Client(t), "close", []Limit{WindowOf(Requests, 1, time.Minute)},
		WithCommandTimeout(roomyTimeout), WithFallbackObserver(func(string, bool, error) { fallbacks++ }))
	require.NoError(t, err)
	ctx := context.Background()
	_, err = l.WaitCost(ctx, "k", Cost{Requests: 1}, 0)
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := l.WaitCost(wctx, "k", Cost{Requests: 1}, 0) // a turn a minute away
		done <- err
	}()
	spinUntil(t, "a turn held", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		ln, ok := l.lanes.M["k"]
		return ok && ln.held.After(time.Now())
	})
	// A third waiter queues behind the lead's hold-back.
	third := make(chan error, 1)
	go func() {
		_, err := l.WaitCost(ctx, "k", Cost{Requests: 1}, 0)
		third <- err
	}()
	spinUntil(t, "the third queued", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.lanes.M["k"].queue) == 1
	})
	require.NoError(t, l.Close())
	require.ErrorIs(t, recvWithin(t, third), ErrSharedUnavailable)
	_, err = l.WaitCost(ctx, "k", Cost{Requests: 1}, 0)
	require.ErrorIs(t, err, ErrSharedUnavailable)
	assert.Zero(t, fallbacks, "a closed limiter does not fall back")
	select {
	case err := <-done:
		t.Fatalf("the waiter with a turn returned %v", err)
	default: // it sleeps until its turn: a minute, under its own context
	}
	cancel()
	require.ErrorIs(t, recvWithin(t, done), context.Canceled, "and leaves when its context ends; its grant is not given back")
}

// TestSharedLimitsRefundMovesTheFleetsWaiters: a request of one instance
// waits behind another's estimate; when that settles lower, the waiter's
// turn is given again, sooner, and it is told on the channel.
func TestSharedLimitsRefundMovesTheFleetsWaiters(t *testing.T) {
	srv := redistest.Start(t)
	limits := []Limit{WindowOf(Tokens, 100, 10*time.Second)}
	a := newSharedLimits(t, srv.Client(t), "moves", limits)
	b := newSharedLimits(t, srv.Client(t), "moves", limits)
	require.True(t, a.replan)
	ctx := context.Background()
	g, err := a.WaitCost(ctx, "k", Cost{Tokens: 90}, 0)
	require.NoError(t, err)
	start := time.Now()
	done := waitCostAsync(ctx, b, "k", Cost{Tokens: 50})
	spinUntil(t, "b waits", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.waiting) == 1
	})
	time.Sleep(50 * time.Millisecond)
	a.Settle(g, Cost{Tokens: 20})
	r := recvWithin(t, done)
	require.NoError(t, r.err)
	assert.Less(t, time.Since(start), 2*time.Second, "b goes once a's refund makes room, not after 10 s")
	// Its grant is where the script moved it: it settles there.
	b.Settle(r.g, Cost{Tokens: 10})
	_, err = a.WaitCost(ctx, "k", Cost{Tokens: 70}, 20*time.Millisecond)
	require.NoError(t, err, "20 + 10 taken, 70 left")
}

// TestSharedLimitsPlansWithRefunds: a request whose turn on the estimates
// lies beyond its maximum wait waits when the refunds the instance has
// learnt to expect bring it within (sharedlimits_expect.go), goes when
// they come, and when they do not, gives its turn back at its maximum wait
// with a *LimitError, leaving the window as it was.
func TestSharedLimitsPlansWithRefunds(t *testing.T) {
	srv := redistest.Start(t)
	limits := []Limit{WindowOf(Tokens, 1000, 10*time.Second)}
	a := newSharedLimits(t, srv.Client(t), "plans", limits)
	b := newSharedLimits(t, srv.Client(t), "plans", limits)
	ctx := context.Background()
	// a learns that its grants settle at a tenth, 100 ms after their turn.
	for range 3 {
		g, err := a.WaitCost(ctx, "k", Cost{Tokens: 100}, 0)
		require.NoError(t, err)
		time.Sleep(100 * time.Millisecond)
		a.Settle(g, Cost{Tokens: 10})
	}
	st := a.settled.of(0)
	require.True(t, st.Expects())
	ask := func(maxWait time.Duration) (Grant, error, time.Duration) {
		start := time.Now()
		g, err := a.WaitCost(ctx, "k", Cost{Tokens: 500}, maxWait)
		return g, err, time.Since(start)
	}

	// The window holds 30 settled; b takes 900, in flight. On the
	// estimates, 500 more waits until b's 900 leave the window (10 s); a
	// expects b's grant to settle 100 ms after its turn, so it waits, and
	// goes when b's refund comes, 300 ms in.
	inFlight, err := b.WaitCost(ctx, "k", Cost{Tokens: 900}, 0)
	require.NoError(t, err)
	go func() {
		time.Sleep(300 * time.Millisecond)
		b.Settle(inFlight, Cost{Tokens: 50})
	}()
	g, err, took := ask(2 * time.Second)
	require.NoError(t, err)
	assert.Greater(t, took, 250*time.Millisecond)
	assert.Less(t, took, time.Second, "moved in by the refund")
	a.Settle(g, Cost{Tokens: 500})

	// 580 in the window; b takes 400 more, which never settles: a waits
	// for the refund, and gives up at its maximum wait.
	_, err = b.WaitCost(ctx, "k", Cost{Tokens: 400}, 0)
	require.NoError(t, err)
	g, err, took = ask(time.Second)
	var le *LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, ReasonMaxWait, le.Reason)
	assert.Greater(t, le.Wait, 8*time.Second, "the wait it still needs: until b's first grant leaves the window")
	assert.Greater(t, took, 950*time.Millisecond, "it waited for the refund")
	assert.Zero(t, g)
	// Its turn was given back: the 20 left are grantable at once.
	spinUntil(t, "the turn given back", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		g, err := a.WaitCost(cctx, "k", Cost{Tokens: 20}, 0)
		if err == nil {
			a.Settle(g, Cost{})
		}
		return err == nil
	})
	// Asked again, with the grant overdue, it is refused at once.
	_, err, took = ask(time.Second)
	require.ErrorAs(t, err, &le)
	assert.Less(t, took, 500*time.Millisecond, "nothing expected of an overdue grant: refused, not waited for")
}

// SharedLimits is a CostLimiter, a Learner, and has the shared limiters'
// Stats and Close.
var (
	_ CostLimiter = (*SharedLimits)(nil)
	_ Learner     = (*SharedLimits)(nil)
	_ interface {
		Stats() SharedStats
		Close() error
	} = (*SharedLimits)(nil)
)
