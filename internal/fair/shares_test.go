package fair

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tenantReqs returns n requesters of tenant at level 1, of weight, each
// offering a request a spacing (0: backlogged), starting a millisecond
// apart.
func tenantReqs(tenant string, n int, spacing, weight float64) []*requester {
	var out []*requester
	for i := range n {
		at := float64(i) * 1000
		out = append(out, &requester{lv: 1, tenant: tenant, weight: weight, spacing: spacing, next: at, first: at})
	}
	return out
}

// TestSharesMaxMinAcrossInstances: three tenants offering 0.2×, 1× and 5×
// a fair share of the limit, from many requesters (instances): the light
// one is served in full, the heavy ones split the rest; with weights, in
// proportion.
func TestSharesMaxMinAcrossInstances(t *testing.T) {
	const end = 100e6 // 100 s of a 100/s limit
	for _, tc := range []struct {
		name    string
		reqs    [][]*requester
		fair    map[string]float64 // turns per second
		epsilon float64
	}{
		{"0.2×, 1×, 5×", [][]*requester{
			tenantReqs("A", 1, 150_000, 1),  // 6.7/s
			tenantReqs("B", 4, 120_000, 1),  // 33.3/s
			tenantReqs("C", 12, 72_000, 1)}, // 166.7/s
			map[string]float64{"A": 6.7, "B": 33.3, "C": 60}, 0.1},
		{"two backlogged", [][]*requester{
			tenantReqs("B", 2, 0, 1),
			tenantReqs("C", 14, 0, 1)},
			map[string]float64{"B": 50, "C": 50}, 0.1},
		{"weights 1 and 3", [][]*requester{
			tenantReqs("B", 3, 0, 1),
			tenantReqs("C", 3, 0, 3)},
			map[string]float64{"B": 25, "C": 75}, 0.1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newFleetSim(0.1)
			var rs []*requester
			for _, r := range tc.reqs {
				rs = append(rs, r...)
			}
			s.run(rs, end)
			total := 0
			for tenant, want := range tc.fair {
				got := float64(s.granted[tenant]) / (end / 1e6)
				total += s.granted[tenant]
				assert.InEpsilon(t, want, got, tc.epsilon, "tenant %s", tenant)
			}
			assert.InDelta(t, 10_000, total, float64(len(rs)), "every turn used")
			t.Logf("granted %v in %d asks", s.granted, s.asks)
		})
	}
}

// TestSharesMemory: tenants that come once and leave are dropped once the
// level's virtual time passes them; waiting ones are kept.
func TestSharesMemory(t *testing.T) {
	s := Shares{}
	now := 0.0
	for i := range 1000 {
		tenant := string(rune('a'+i%26)) + string(rune('a'+i/26))
		s.Arrive(1, tenant, now)
		s.Grant(1, tenant, 1, 10)
		s.Arrive(1, "heavy", now)
		s.Grant(1, "heavy", 1, 10)
		s.Prune(now)
		now++
	}
	assert.Less(t, len(s), 8, "fields kept: %v", slices.Collect(maps.Keys(s)))
	s.Arrive(1, "w", now)
	s.Wait(1, "w", now+100)
	s.Prune(now)
	require.Contains(t, s, waitField(1, "w"))
	require.Contains(t, s, tagField(1, "w"))
}

func TestSharesSteps(t *testing.T) {
	s := Shares{}
	const q = 20.0
	s.Arrive(1, "A", 0)
	s.Grant(1, "A", 1, 10) // A: 10, v 0
	s.Arrive(1, "A", 1)
	s.Grant(1, "A", 1, 10) // A: 20, v 10
	s.Arrive(1, "B", 2)    // B starts at v: 10
	require.Equal(t, 10.0, s[tagField(1, "B")])
	s.Wait(1, "B", 100) // B waits, 10 behind A: not more than q
	require.False(t, s.Behind(1, "A", 3, q))
	s.Arrive(1, "A", 3)
	s.Grant(1, "A", 1, 20) // A: 40, v 20
	require.True(t, s.Behind(1, "A", 4, q), "B waits 30 behind")
	require.False(t, s.Behind(1, "B", 4, q))
	require.False(t, s.Behind(1, "A", 100, q), "B's wait over")
	require.False(t, s.Behind(2, "A", 4, q), "another level")
	// B's tag stayed while it waited; granted, it waits until its mark
	// ends (its other requests come back within it).
	s.Arrive(1, "B", 5)
	require.Equal(t, 10.0, s[tagField(1, "B")])
	s.Grant(1, "B", 2, 10) // weight 2: 10 + 5
	require.Equal(t, 15.0, s[tagField(1, "B")])
	require.Equal(t, 100.0, s[waitField(1, "B")])
	s.Arrive(1, "B", 100)
	require.NotContains(t, s, waitField(1, "B"), "its mark over")
}

// TestFleetRandomSchedules: on random fleets (requesters of random levels,
// tenants and weights, backlogged or offering a pace), asking through Ask
// as the shared limiters' scripts do: every turn is used while a
// requester is backlogged; each level below the highest with a backlogged
// requester keeps its share of the turns; within a level, the backlogged
// tenants share what the paced ones leave in proportion to their weights;
// and once every requester has stopped and the marks have ended, the
// state keeps no tenant that is not ahead.
func TestFleetRandomSchedules(t *testing.T) {
	const end = 30e6 // 30 s of a 100/s limit
	for seed := range uint64(16) {
		rng := rand.New(rand.NewPCG(seed, 9))
		s := newFleetSim([]float64{0.05, 0.1, 0.2}[rng.IntN(3)])
		var rs []*requester
		backlogged := map[string]float64{} // tenant ("<level>/<name>") to weight
		levels := map[int]bool{}
		for lv := range 3 {
			for tn := range rng.IntN(3) {
				name := fmt.Sprintf("%d/t%d", lv, tn)
				w := []float64{1, 1, 2, 3}[rng.IntN(4)]
				n := 1 + rng.IntN(5) // instances
				spacing := 0.0
				if rng.IntN(3) == 0 {
					spacing = float64(n) * 1e6 / (1 + rng.Float64()*8) // 1 to 9 requests a second in all
				} else {
					backlogged[name], levels[lv] = w, true
				}
				for i := range n {
					at := float64(rng.IntN(50_000) + i)
					rs = append(rs, &requester{lv: lv, tenant: name, weight: w, spacing: spacing, next: at, first: at})
				}
			}
		}
		if len(backlogged) == 0 {
			continue
		}
		s.run(rs, end)
		total := s.levels[0] + s.levels[1] + s.levels[2]
		require.InDelta(t, end/s.interval, float64(total), float64(len(rs)), "seed %d: every turn used", seed)
		top := 0
		for lv := range levels {
			top = max(top, lv)
		}
		for lv := range levels {
			if lv < top {
				assert.GreaterOrEqual(t, float64(s.levels[lv]), 0.9*s.share*float64(total), "seed %d: level %d's share %v", seed, lv, s.share)
			}
		}
		// Within a level, the backlogged tenants' turns over their
		// weights, within 15% of each other.
		for lv := range 3 {
			lo, hi := math.Inf(1), 0.0
			for name, w := range backlogged {
				if int(name[0]-'0') == lv {
					x := float64(s.granted[name]) / w
					lo, hi = min(lo, x), max(hi, x)
				}
			}
			if hi > 0 {
				assert.GreaterOrEqual(t, lo, 0.85*hi, "seed %d: level %d's backlogged tenants by weight: %v (weights %v, share %v)", seed, lv, s.granted, backlogged, s.share)
			}
		}
		// Everyone gone: past the marks, only tenants ahead are kept.
		s.sh.Prune(end + 10*s.horizon)
		for f := range s.sh {
			if f[0] == 'u' {
				t.Errorf("seed %d: a mark left: %s", seed, f)
			}
		}
	}
}
