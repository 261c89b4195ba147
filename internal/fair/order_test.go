package fair

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOrderSteps(t *testing.T) {
	const h, share = 20_000.0, 0.1 // a horizon of 20 ms
	var o Order
	for i, s := range []struct {
		lv             int
		work, at, now  float64
		want           Verdict
		back           float64
		credit0, until float64 // level 0's, after
	}{
		// Within the horizon, any level goes, and nobody earns.
		{lv: 0, work: 10_000, at: 1_015_000, now: 1_000_000, want: Go},
		// Beyond it, a low request is held back until its turn would be
		// within it, and its level is marked until a horizon after the turn.
		{lv: 0, work: 10_000, at: 1_050_000, now: 1_000_000, want: Later, back: 1_030_000, until: 1_070_000},
		// The highest level goes however far; the marked level earns.
		{lv: 2, work: 10_000, at: 1_060_000, now: 1_001_000, want: Go, credit0: 1_000, until: 1_070_000},
		// A normal request beyond the horizon is held too; low earns
		// nothing from a turn not given.
		{lv: 1, work: 10_000, at: 1_070_000, now: 1_002_000, want: Later, back: 1_050_000, credit0: 1_000, until: 1_070_000},
		// Nine more high turns: the low level's credit covers its work.
		{lv: 2, work: 90_000, at: 1_070_000, now: 1_003_000, want: Go, credit0: 10_000, until: 1_070_000},
		// It takes its turn however far, spends the work, earns its
		// share, and stays marked until a horizon after that turn.
		{lv: 0, work: 10_000, at: 1_160_000, now: 1_004_000, want: ByCredit, credit0: 1_000, until: 1_180_000},
		// Within the horizon it goes without spending or earning.
		{lv: 0, work: 10_000, at: 1_020_000, now: 1_005_000, want: Go, credit0: 1_000, until: 1_180_000},
		// Past its mark, the level's credit is gone.
		{lv: 2, work: 10_000, at: 1_190_000, now: 1_180_000, want: Go},
	} {
		v, back := o.Decide(s.lv, s.work, s.at, s.now, h, share)
		require.Equal(t, s.want, v, "step %d", i)
		require.Equal(t, s.back, back, "step %d: come back", i)
		require.Equal(t, s.credit0, o.Credit[0], "step %d: level 0's credit", i)
		require.Equal(t, s.until, o.Until[0], "step %d: level 0's mark", i)
	}
}

func TestOrderOff(t *testing.T) {
	var o Order
	for _, lv := range []int{-1, 0, 1, 2, 7} {
		v, back := o.Decide(lv, 10, 1e9, 0, 1, 0)
		assert.Equal(t, Go, v)
		assert.Zero(t, back)
	}
	assert.Equal(t, Order{}, o)
	// A level outside the held ones is not held.
	for _, lv := range []int{-1, 2, 7} {
		v, _ := o.Decide(lv, 10, 1e9, 0, 1, 0.1)
		assert.Equal(t, Go, v, "level %d", lv)
	}
}

// fleetSim is a key's bucket shared by requesters that each send one
// request at a time, on a timeline in microseconds: a GCRA of one turn a
// interval (no burst), each request asking for its turn through Ask and
// granted through Grant, as a shared limiter's script does. A requester
// held back comes back when told; one granted sends at its turn and asks
// again for its next request then (one with a spacing, a light tenant,
// no sooner than a spacing after it asked).
type fleetSim struct {
	o        Order
	sh       Shares
	interval float64
	horizon  float64
	share    float64
	tat      float64
	granted  map[string]int // turns by tenant
	levels   [3]int         // turns by level
	waits    [3]float64     // the longest wait from a request's first ask to its turn, by level
	asks     int
}

func newFleetSim(share float64) *fleetSim {
	return &fleetSim{sh: Shares{}, interval: 10_000, horizon: 20_000, share: share, granted: map[string]int{}}
}

type requester struct {
	lv      int
	tenant  string
	weight  float64
	spacing float64
	next    float64 // when it asks next
	first   float64 // when its current request first asked
}

// run runs the requesters until end.
func (s *fleetSim) run(rs []*requester, end float64) {
	for {
		r := earliest(rs)
		now := r.next
		if now >= end {
			return
		}
		s.asks++
		at := max(now, s.tat)
		v, back := Ask(&s.o, s.sh, r.lv, r.tenant, s.interval, at, now, s.horizon, s.share)
		if v == Later {
			r.next = back
			continue
		}
		s.sh.Grant(r.lv, r.tenant, r.weight, s.interval)
		s.sh.Prune(now)
		s.tat = at + s.interval
		s.granted[r.tenant]++
		s.levels[r.lv]++
		s.waits[r.lv] = max(s.waits[r.lv], at-r.first)
		r.next = at
		if r.spacing > 0 {
			r.next = max(at, now+r.spacing)
		}
		r.first = r.next
	}
}

// earliest returns the requester of rs whose next ask comes first (ties:
// the first in rs).
func earliest(rs []*requester) *requester {
	r := rs[0]
	for _, x := range rs[1:] {
		if x.next < r.next {
			r = x
		}
	}
	return r
}

// requesters returns n backlogged requesters of level lv, of one tenant,
// asking first at at.
func requesters(lv, n int, at float64) []*requester {
	var out []*requester
	for range n {
		out = append(out, &requester{lv: lv, weight: 1, next: at, first: at})
	}
	return out
}

// TestOrderShareUnderFlood: under a flood of high requests from many
// instances, each lower level keeps its share of the turns; and with no
// flood, the lower ones use every turn (the horizon leaves none unused).
func TestOrderShareUnderFlood(t *testing.T) {
	for _, share := range []float64{0.05, 0.1, 0.25} {
		s := newFleetSim(share)
		rs := append(requesters(2, 8, 0), requesters(1, 4, 0)...)
		rs = append(rs, requesters(0, 4, 0)...)
		s.run(rs, 100e6) // 100 s: 10,000 turns
		total := float64(s.levels[0] + s.levels[1] + s.levels[2])
		assert.InDelta(t, 10_000, total, float64(len(rs)), "every turn used")
		for lv := range Held {
			got := float64(s.levels[lv]) / total
			assert.InEpsilon(t, share, got, 0.1, "share %v: level %d's share", share, lv)
		}
	}
}

// TestOrderHighWaitsBehindTheHorizon: a high request among lower ones
// flooding from many instances waits behind at most the horizon's worth
// of their turns and the one being sent; without the order it would wait
// behind every instance's.
func TestOrderHighWaitsBehindTheHorizon(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, share := range []float64{0, 0.1} {
		s := newFleetSim(share)
		rs := append(requesters(0, 16, 0), requesters(1, 16, 0)...)
		s.run(rs, 1e6)
		worst := 0.0
		for range 200 {
			now := s.tat - s.interval + rng.Float64()*s.interval // a turn being sent
			high := &requester{lv: 2, weight: 1, next: now, first: now}
			s.run(append(rs, high), now+1) // only its first ask
			worst = max(worst, s.waits[2])
			s.waits[2] = 0
			s.run(rs, now+200_000)
		}
		if share == 0 {
			assert.Greater(t, worst, 100_000.0, "without the order: behind 32 instances' turns")
			continue
		}
		assert.LessOrEqual(t, worst, s.horizon+2*s.interval, "a high request's wait")
	}
}

// TestOrderCreditNotBanked: a level that stops waiting loses its credit a
// horizon after its last held turn; it does not come back with turns
// earned while it was away.
func TestOrderCreditNotBanked(t *testing.T) {
	var o Order
	v, _ := o.Decide(0, 10, 1000, 0, 100, 0.5)
	require.Equal(t, Later, v)
	o.Decide(2, 10, 1000, 1, 100, 0.5)
	require.Equal(t, 5.0, o.Credit[0])
	o.Decide(2, 10, 1000, 1099, 100, 0.5)
	require.Equal(t, 10.0, o.Credit[0], "still waiting: it earns")
	o.Decide(2, 10, 1000, 1100, 100, 0.5)
	require.Equal(t, Order{}, o, "its mark over: credit gone, and nothing earned")
	v, _ = o.Decide(0, 10, 2000, 1101, 100, 0.5)
	require.Equal(t, Later, v, "back without credit")
}
