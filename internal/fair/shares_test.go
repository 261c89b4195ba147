package fair

import (
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tenantSim is fleetSim with tenants: requesters of one level, each of a
// tenant, asking through Ask and granted through Grant as a shared
// limiter's script does. A requester with a spacing offers one request a
// spacing (a light tenant); one without asks again as soon as its turn
// comes (a backlogged one).
type tenantSim struct {
	o        Order
	sh       Shares
	interval float64
	horizon  float64
	share    float64
	tat      float64
	granted  map[string]int
	asks     int
}

type tenantReq struct {
	tenant  string
	weight  float64
	spacing float64
	next    float64
}

func (s *tenantSim) run(rs []*tenantReq, end float64) {
	for {
		r := rs[0]
		for _, x := range rs[1:] {
			if x.next < r.next {
				r = x
			}
		}
		now := r.next
		if now >= end {
			return
		}
		s.asks++
		at := max(now, s.tat)
		trial := s.o
		v, back := Ask(&trial, s.sh, 1, r.tenant, s.interval, at, now, s.horizon, s.share)
		if v == Later {
			s.o = trial
			r.next = back
			continue
		}
		s.o = trial
		s.sh.Grant(1, r.tenant, r.weight, s.interval)
		s.sh.Prune(now)
		s.tat = at + s.interval
		s.granted[r.tenant]++
		r.next = at
		if r.spacing > 0 {
			r.next = max(at, now+r.spacing)
		}
	}
}

func tenantReqs(tenant string, n int, spacing, weight float64) []*tenantReq {
	var out []*tenantReq
	for i := range n {
		out = append(out, &tenantReq{tenant: tenant, weight: weight, spacing: spacing, next: float64(i) * 1000})
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
		reqs    [][]*tenantReq
		fair    map[string]float64 // turns per second
		epsilon float64
	}{
		{"0.2×, 1×, 5×", [][]*tenantReq{
			tenantReqs("A", 1, 150_000, 1),  // 6.7/s
			tenantReqs("B", 4, 120_000, 1),  // 33.3/s
			tenantReqs("C", 12, 72_000, 1)}, // 166.7/s
			map[string]float64{"A": 6.7, "B": 33.3, "C": 60}, 0.1},
		{"two backlogged", [][]*tenantReq{
			tenantReqs("B", 2, 0, 1),
			tenantReqs("C", 14, 0, 1)},
			map[string]float64{"B": 50, "C": 50}, 0.1},
		{"weights 1 and 3", [][]*tenantReq{
			tenantReqs("B", 3, 0, 1),
			tenantReqs("C", 3, 0, 3)},
			map[string]float64{"B": 25, "C": 75}, 0.1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &tenantSim{sh: Shares{}, interval: 10_000, horizon: 20_000, share: 0.1, granted: map[string]int{}}
			var rs []*tenantReq
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
