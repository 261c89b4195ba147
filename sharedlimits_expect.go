package egress

import (
	"context"
	"sync"
	"time"

	"github.com/egress-go/egress/internal/caller"
	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/window"
)

// How a SharedLimits plans a request whose turn lies beyond its budget.
//
// As in Limits (see limits_settle.go), a grant counts in its windows at its
// estimate until it is settled, and an LLM call's estimate is routinely 10
// to 30 times what it uses. When the script refuses a request for its
// budget and this process has learnt that the binding window's grants
// settle below their estimates (the ratio of actual to estimate and the
// time from turn to settlement, from the settlements it made), it reads
// that window's grants from Redis (one more call) and plans on them with
// Limits' arithmetic (internal/window's Plan): a grant whose turn has
// passed settles as the grants have been settling, unless it is overdue
// (then it has settled, or never will: it counts as it stands); the grants
// whose turns are still to come — the fleet's waiters — are given their
// turns again in order, as a settlement's replan would, each settling in
// its turn. When the turn found there fits the budget, the request takes
// its real turn, beyond the budget, and waits: a settlement anywhere in the
// fleet gives the turns still to come again, sooner (replan in limits.lua),
// and the request gives its turn back at the budget's end (giveUpMargin
// before the deadline) with a *LimitError if the refunds did not bring it
// in. Otherwise it is refused at once, stating the wait under that
// expectation. Every turn taken is the real one: the expectation decides
// only whether to wait or refuse, so the windows' bound holds as before.
//
// It applies when every limit is a window and none is a parent's (the
// script replans only then), and plans on the binding window alone.

// maxPlanGrants is the most grants of a window read for a plan: a window
// holding more (many small grants) is planned on its estimates.
const maxPlanGrants = 2048

// settling is how a SharedLimits' grants have settled, per limit, as this
// process settled them. Safe for concurrent use.
type settling struct {
	mu    sync.Mutex
	stats []window.Settling // guarded by mu; per limit
}

// learn learns how g settled at actual in each window limit at now: a
// response's usage (above 0 in the limit's dimension) only.
func (s *settling) learn(limits []Limit, g Grant, actual Cost, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range limits {
		est, a := g.Cost.Of(limits[i].dim), actual.Of(limits[i].dim)
		if limits[i].window && est > 0 && a > 0 && !g.At.After(now) {
			s.stats[i].Learn(float64(a)/float64(est), now.Sub(g.At))
		}
	}
}

func (s *settling) of(i int) window.Settling {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats[i]
}

// expectation returns the wait a request of cost on key, refused for its
// budget b at now after the script's reply rep, can expect once the
// binding window's grants settle as they have been settling (the wait on
// the estimates when nothing is expected); late reports whether it fits
// b, so that the request takes its real turn beyond b and waits.
func (l *SharedLimits) expectation(ctx context.Context, key string, cost Cost, rep limitsReply, b budget, now time.Time) (wait time.Duration, late bool) {
	i := rep.binding - 1
	if !l.replan || i < 0 || i >= len(l.limits) {
		return rep.wait, false
	}
	st := l.settled.of(i)
	if !st.Expects() {
		return rep.wait, false
	}
	ps, at, err := l.readWindow(ctx, key, i, st)
	if err != nil || ps == nil {
		return rep.wait, false
	}
	e := max(ps.Earliest(cost.Of(l.limits[i].dim), at).Sub(at), 0)
	if e >= rep.wait {
		return rep.wait, false
	}
	end := b.end(now, true)
	return e, end.IsZero() || !now.Add(e).After(end)
}

// readWindow reads limit i's window for key from Redis as a plan whose
// grants settle as st says, at the time of the reply (this process's
// clock): the grants whose turns are still to come given their turns
// again, in order. A nil plan when the window holds more than
// maxPlanGrants.
func (l *SharedLimits) readWindow(ctx context.Context, key string, i int, st window.Settling) (*window.Plan, time.Time, error) {
	s := l.fleet
	args := limitsWindowArgs(l.groups, i+1, maxPlanGrants)
	var vals []int64
	err := s.calls.Do(ctx, func(ctx context.Context) error {
		v, err := caller.Run(ctx, s.rdb, s.clock, l.script, l.redisKeys(key), args...).Int64Slice()
		vals = v
		return err
	})
	now := s.clock.Now()
	if err != nil {
		return nil, now, err
	}
	rep, err := parseWindowed(vals)
	if err != nil {
		return nil, now, err
	}
	if len(rep.grants) == 0 {
		return nil, now, nil // none, or more than the most: planned on the estimates
	}
	lim := &l.limits[i]
	ps := &window.Plan{N: lim.n, Win: lim.w + l.margin, Stats: st}
	var waiters []window.Entry
	for _, g := range rep.grants {
		at := now.Add(time.Duration(g.turn-rep.now) * time.Microsecond)
		if at.After(now) {
			waiters = append(waiters, window.Entry{At: at, Est: g.cost})
			continue
		}
		e := window.Entry{At: at, Est: g.cost, Exp: g.cost}
		if exp, settle := st.Expect(at, g.cost, now); !settle.IsZero() {
			e.Exp, e.Settle, e.Open = exp, settle, true
		}
		ps.Entries = append(ps.Entries, e)
	}
	for _, w := range waiters {
		ps.Place(w.Est, clock.Earlier(ps.Earliest(w.Est, now), w.At)) // as replan would: never later
	}
	return ps, now, nil
}
