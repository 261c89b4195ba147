package egress

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/lua"
	"github.com/egress-go/egress/internal/redistest"
)

// Tests of SharedLimits (sharedlimits.go, internal/lua/limits.lua) against
// a real redis-server. Each limiter value stands for one process of the
// fleet and gets its own client.

func newSharedLimits(t *testing.T, rdb redis.UniversalClient, name string, limits []Limit, opts ...SharedOption) *SharedLimits {
	t.Helper()
	opts = append([]SharedOption{WithCommandTimeout(roomyTimeout)}, opts...)
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
		opts   []SharedOption
		want   string
	}{
		{"a", nil, nil, "NewSharedLimits: limits none"},
		{"a", []Limit{WindowOf(Tokens, 0, time.Second)}, nil, "NewSharedLimits: limit 0 (tokens): n 0"},
		{"a b", ok, nil, `NewSharedLimits: name "a b"`},
		{"a", ok, []SharedOption{WithFallbackRate(PerSecond(3))}, "NewSharedLimits: WithFallbackRate"},
		{"a", ok, []SharedOption{WithAdaptive(AdaptivePolicy{})}, "NewSharedLimits: WithAdaptive"},
		{"a", ok, []SharedOption{WithCommandTimeout(0)}, "WithCommandTimeout"},
	} {
		_, err := NewSharedLimits(rdb, tc.name, tc.limits, tc.opts...)
		require.ErrorIs(t, err, ErrInvalidConfig)
		assert.Contains(t, err.Error(), tc.want)
	}
	_, err := NewSharedLimits(nil, "a", ok)
	require.ErrorIs(t, err, ErrInvalidConfig)
}

// fakeNowKey is where the agreement test keeps the script's clock.
const fakeNowKey = "egress-test-now"

// onFakeClock makes l's script read its clock from fakeNowKey, and l's
// process clock fc: the same instants as a Limits on fc.
func onFakeClock(t *testing.T, l *SharedLimits, fc *clock.Fake) {
	t.Helper()
	const line = "local now = tonumber(t[1]) * 1000000 + tonumber(t[2])"
	require.Contains(t, lua.Limits, line)
	l.script = redis.NewScript(strings.Replace(lua.Limits, line, "local now = tonumber(redis.call('GET', '"+fakeNowKey+"'))", 1))
	l.fleet.clock = fc
}

// TestSharedLimitsAgreesWithLimits runs random schedules of reservations,
// settlements and caps through a Limits and, on the same fake instants,
// through the script of a SharedLimits, and requires the same decision and
// the same turn, to the microsecond, at every step: the Go and Lua
// arithmetic are the same. Rates and windows are drawn so that every
// interval is whole microseconds.
func TestSharedLimitsAgreesWithLimits(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	rates := []Rate{PerSecond(1), PerSecond(10), PerSecond(50), PerSecond(100), PerSecond(1000), PerMinute(20)}
	dims := []Dimension{Requests, Tokens, InputTokens}
	const schedules, steps = 500, 60
	for sch := range schedules {
		rng := rand.New(rand.NewPCG(42, uint64(sch)))
		var limits []Limit
		for range 1 + rng.IntN(3) {
			d := dims[rng.IntN(len(dims))]
			var lim Limit
			if rng.IntN(2) == 0 {
				lim = BucketOf(d, rates[rng.IntN(len(rates))], 1+rng.IntN(20))
			} else {
				lim = WindowOf(d, 1+rng.IntN(50), time.Duration(1+rng.IntN(2000))*time.Millisecond)
			}
			if rng.IntN(3) == 0 {
				lim = lim.Parent(HostOf)
			}
			limits = append(limits, lim)
		}
		local, fc := newLimitsOnFake(t, limits...)
		shared, err := NewSharedLimits(rdb, fmt.Sprintf("agree%d", sch), limits, WithCommandTimeout(roomyTimeout), WithTransitMargin(0))
		require.NoError(t, err)
		onFakeClock(t, shared, fc)
		type pair struct{ local, shared Grant }
		var grants []pair
		keys := []string{"h/a", "h/b", "g/a"}
		for step := range steps {
			fc.Advance(time.Duration(rng.IntN(300)) * time.Millisecond)
			now := fc.Now()
			require.NoError(t, rdb.Set(context.Background(), fakeNowKey, now.UnixMicro(), 0).Err())
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
				lg, _, lerr := local.reserve(key, cost, budget{maxWait: maxWait})
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
					grants = append(grants, pair{lg, Grant{Key: key, Cost: cost, turn: r.turn}})
				}
			case op < 9 && len(grants) > 0: // a settlement
				i := rng.IntN(len(grants))
				g := grants[i]
				grants = append(grants[:i], grants[i+1:]...)
				var actual Cost
				for _, d := range dims {
					actual = limCostWith(actual, d, rng.IntN(16))
				}
				local.Settle(g.local, actual)
				shared.Settle(g.shared, actual)
			default: // a provider's count of tokens
				q := Quota{Dimension: Tokens, Remaining: float64(1 + rng.IntN(30)), HasRemaining: true,
					Reset: time.Duration(rng.IntN(3000)) * time.Millisecond, HasReset: rng.IntN(2) == 0, Kind: ResetKind(rng.IntN(3))}
				sig := Signal{Now: now, Status: http.StatusOK, Quotas: []Quota{q}}
				key := keys[rng.IntN(len(keys))]
				local.Learn(context.Background(), key, sig)
				shared.Learn(context.Background(), key, sig)
			}
		}
		require.NoError(t, shared.Close())
	}
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
