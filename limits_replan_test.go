package egress

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLimitsReplanProperties: random schedules of waiters, refunds and
// cancellations on windows, on a fake clock, driven synchronously (a
// waiter is registered as WaitCost registers it, and leaves when the clock
// reaches its turn). However replan moves the waiters, in the end every
// window holds at most n of the actual costs at the final turns, and no
// turn moved later than the one first given.
func TestLimitsReplanProperties(t *testing.T) {
	t.Parallel() // on a fake clock, CPU alone
	const steps = 80
	schedules := propertyRuns(2000)
	keys := []string{"h/a", "h/b", "g/a"}
	moved := 0 // turns that replan moved sooner: the schedules exercise it
	for sch := range schedules {
		rng := rand.New(rand.NewPCG(11, uint64(sch)))
		var limits []Limit
		for range 1 + rng.IntN(2) {
			d := []Dimension{Requests, Tokens}[rng.IntN(2)]
			lim := WindowOf(d, 5+rng.IntN(60), time.Duration(100+rng.IntN(900))*time.Millisecond)
			if rng.IntN(3) == 0 {
				lim = lim.Parent(HostOf)
			}
			limits = append(limits, lim)
		}
		l, fc := newLimitsOnFake(t, limits...)
		type grant struct {
			key           string
			est, actual   Cost
			first, at     time.Time
			w             *limitsWaiter
			settled, gone bool
		}
		var grants []*grant
		where := func(step int) string { return fmt.Sprintf("schedule %d step %d (limits %v)", sch, step, limits) }
		for step := range steps {
			fc.Advance(time.Duration(rng.IntN(80)) * time.Millisecond)
			now := fc.Now()
			l.mu.Lock()
			for _, g := range grants {
				if g.w != nil {
					g.at = g.w.at
					if !g.at.After(now) {
						l.unwait(g.w) // its waiter wakes and goes
						g.w = nil
					}
				}
			}
			l.mu.Unlock()
			switch op := rng.IntN(10); {
			case op < 6:
				var cost Cost
				for _, lim := range limits {
					c := 1 + rng.IntN(lim.n)
					if prev := cost.Of(lim.dim); prev > 0 {
						c = min(c, prev) // two limits of one dimension: within both
					}
					cost = limCostWith(cost, lim.dim, c)
				}
				key := keys[rng.IntN(len(keys))]
				l.mu.Lock()
				g, now, err := l.reserveLocked(key, cost, budget{})
				require.NoError(t, err, where(step))
				gr := &grant{key: key, est: cost, actual: cost, first: g.At, at: g.At}
				if g.At.After(now) {
					l.seq++
					gr.w = &limitsWaiter{key: key, cost: cost, at: g.At, seq: l.seq, moved: make(chan struct{}, 1)}
					l.waiters = append(l.waiters, gr.w)
				}
				l.mu.Unlock()
				grants = append(grants, gr)
			case op < 9: // a response: refunds only, so that the bound is exact
				var gone []*grant
				for _, g := range grants {
					if g.w == nil && !g.settled && !g.gone {
						gone = append(gone, g)
					}
				}
				if len(gone) == 0 {
					continue
				}
				g := gone[rng.IntN(len(gone))]
				var actual Cost
				for _, lim := range limits {
					actual = limCostWith(actual, lim.dim, rng.IntN(g.est.Of(lim.dim)+1))
				}
				l.Settle(Grant{Key: g.key, Cost: g.est, At: g.at}, actual)
				g.actual, g.settled = actual, true
			default: // a waiter's context ends, as WaitCost's does
				var waiting []*grant
				for _, g := range grants {
					if g.w != nil {
						waiting = append(waiting, g)
					}
				}
				if len(waiting) == 0 {
					continue
				}
				g := waiting[rng.IntN(len(waiting))]
				l.mu.Lock()
				l.unwait(g.w)
				g.at = g.w.at
				l.cancelLocked(Grant{Key: g.key, Cost: g.est, At: g.at}, fc.Now())
				l.mu.Unlock()
				g.w, g.gone, g.actual = nil, true, Cost{}
			}
		}
		l.mu.Lock()
		for _, g := range grants {
			if g.w != nil {
				g.at = g.w.at
			}
			require.False(t, g.at.After(g.first), "%s: a turn moved later: %v → %v", where(steps), g.first, g.at)
			if g.at.Before(g.first) {
				moved++
			}
		}
		l.mu.Unlock()
		for _, lim := range limits {
			for _, a := range grants {
				sum := 0
				for _, b := range grants {
					if lim.key(b.key) == lim.key(a.key) && !b.at.After(a.at) && b.at.After(a.at.Add(-lim.w)) {
						sum += b.actual.Of(lim.dim)
					}
				}
				require.LessOrEqual(t, sum, lim.n, "%s: %v in the window ending at %v of %s", where(steps), lim, a.at, lim.key(a.key))
			}
		}
	}
	t.Logf("%d turns moved sooner", moved)
	require.Greater(t, moved, schedules, "replan moved turns in most schedules")
}
