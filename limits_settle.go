package egress

import (
	"cmp"
	"errors"
	"slices"
	"time"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/window"
)

// How a Limits plans a request whose turn lies beyond its budget.
//
// A grant in flight counts in its windows at its estimate until its
// response settles it, and a request behind it is given its turn as if
// the estimate were the cost. An LLM call's estimate (max_tokens) is
// routinely 10 to 30 times its actual tokens, refunded a moment later:
// the turn planned on the estimates may lie beyond the request's deadline
// while the refunds about to come would bring it well within. So each
// window's state learns how its grants settle (the ratio of the actual
// cost to the estimate, and the time from a grant's turn to its
// settlement, as moving averages), and once a settlement has differed
// from its estimate it keeps the grants in flight (window.Open). A request
// whose turn does not fit its budget is then planned again on a copy of
// the windows in which each grant in flight, and each waiter once it
// goes, settles as the key's grants have been settling (plan): when the
// turn found there fits the budget, the request takes its real turn,
// beyond the budget, and waits; a refund re-plans the waiters (replan)
// and brings it sooner. If the refunds do not come in time, it gives its
// turn back at the budget's end (giveUpMargin before the deadline) with a
// *LimitError. The expectation decides only whether to wait or refuse:
// every turn taken is the real one, so a window's bound holds as before.
// A refusal states the wait under the expectation.
//
// It applies when the request and every waiter count in windows only, as
// replan does; with a bucket, the plan on the estimates stands.

// giveUpMargin is how long before its context's deadline a request that
// waits on the expectation gives its turn back and is refused, so that it
// returns a *LimitError rather than the context's error.
const giveUpMargin = 5 * time.Millisecond

// openLocked counts g, whose turn has come, among the grants in flight of
// the windows that keep them. The caller holds mu.
func (l *Limits) openLocked(g Grant) {
	for i := range l.limits {
		lim := &l.limits[i]
		if c := g.Cost.Of(lim.dim); c > 0 && lim.window {
			if st, ok := l.states[i].M[lim.key(g.Key)]; ok && st.settled.Track {
				st.open = append(st.open, window.OpenGrant{At: g.At, Cost: int32(c)})
			}
		}
	}
}

// learnLocked learns from the settlement of g at actual: each window it
// counted in forgets it among the grants in flight, and, when it is a
// response's usage (a cost above 0: a throttle or a cancellation settles
// at 0, and tells nothing of usage), learns its ratio and its time to
// settle. The caller holds mu.
func (l *Limits) learnLocked(g Grant, actual Cost, now time.Time) {
	for i := range l.limits {
		lim := &l.limits[i]
		est := g.Cost.Of(lim.dim)
		if est == 0 || !lim.window {
			continue
		}
		st, ok := l.states[i].M[lim.key(g.Key)]
		if !ok {
			continue
		}
		st.open.Close(g.At, est)
		if a := actual.Of(lim.dim); a > 0 && !g.At.After(now) {
			st.settled.Learn(float64(a)/float64(est), now.Sub(g.At))
			st.settled.Track = st.settled.Track || a != est
		}
	}
}

// end returns when a request that waits beyond b gives its turn back: at
// maxWait after now, or giveUpMargin before the deadline, whichever is
// first; the zero time when b has no bound.
func (b budget) end(now time.Time, late bool) time.Time {
	var end time.Time
	if !late {
		return end
	}
	if b.maxWait > 0 {
		end = now.Add(b.maxWait)
	}
	if !b.deadline.IsZero() && (end.IsZero() || b.deadline.Add(-giveUpMargin).Before(end)) {
		end = b.deadline.Add(-giveUpMargin)
	}
	return end
}

// reason returns the bound of b that ends first after now.
func (b budget) reason(now time.Time) Reason {
	if b.maxWait > 0 && (b.deadline.IsZero() || now.Add(b.maxWait).Before(b.deadline)) {
		return ReasonMaxWait
	}
	return ReasonDeadline
}

// refuseAt returns the LimitError for a request of key arrived at now that
// needs to wait d and is refused for b, naming b's first bound when d
// itself would fit (a turn within the margin before the deadline).
func (b budget) refuseAt(now time.Time, key string, cost int, d time.Duration) *LimitError {
	if e := b.refuse(now, key, cost, d); e != nil {
		return e
	}
	return &LimitError{Key: key, Cost: cost, Reason: b.reason(now), Wait: d}
}

// bindingCost returns the cost a refusal states: that of limit i, or the
// requests when the key's hold binds (i < 0).
func (l *Limits) bindingCost(cost Cost, i int) int {
	if i < 0 {
		return cost.Requests
	}
	return cost.Of(l.limits[i].dim)
}

// reserveExpectingLocked is WaitCost's answer to a request that reserve
// refused (err) for its budget b at now: when the grants in flight and the
// waiters, settling as their windows' grants have been settling, bring
// its turn within b, it takes its real turn, beyond b (late); else it
// refuses, stating the wait under that expectation. The caller holds mu.
func (l *Limits) reserveExpectingLocked(key string, cost Cost, b budget, now time.Time, err error) (Grant, bool, error) {
	var le *LimitError
	if !errors.As(err, &le) || le.Reason != ReasonDeadline && le.Reason != ReasonMaxWait {
		return Grant{}, false, err
	}
	at, binding, ok := l.expectLocked(key, cost, now)
	if !ok || !at.Before(now.Add(le.Wait)) {
		return Grant{}, false, err // no sooner than the turn the limits give
	}
	if !at.After(b.end(now, true)) {
		g, _, err := l.reserveLocked(key, cost, budget{})
		return g, err == nil, err
	}
	return Grant{}, false, b.refuseAt(now, key, l.bindingCost(cost, binding), at.Sub(now))
}

// giveUpLocked gives back the turn of w, which waited on the expectation
// from start and whose budget b has ended at now, and returns its
// refusal: the wait it needed, from start, as the limits now expect it.
// The caller holds mu.
func (l *Limits) giveUpLocked(w *limitsWaiter, g Grant, b budget, start, now time.Time) *LimitError {
	l.unwait(w)
	g.At = w.at
	l.cancelLocked(g, now)
	at, binding := l.turnLocked(w.key, w.cost, now)
	if e, eb, ok := l.expectLocked(w.key, w.cost, now); ok && e.Before(at) {
		at, binding = e, eb
	}
	return b.refuseAt(start, w.key, l.bindingCost(w.cost, binding), clock.Later(at, now).Sub(start))
}

// turnLocked returns the turn reserve would give a request of cost at
// now, without taking it, and the limit that binds it (-1: the key's hold,
// or none). The caller holds mu.
func (l *Limits) turnLocked(key string, cost Cost, now time.Time) (time.Time, int) {
	at, binding := now, -1
	if d, _ := l.holds.remaining(key); d > 0 {
		at = now.Add(d)
	}
	for i := range l.limits {
		lim := &l.limits[i]
		if c := cost.Of(lim.dim); c > 0 && c <= lim.n {
			if t := l.state(i, key, now).earliest(lim, c, now, l.margin); t.After(at) {
				at, binding = t, i
			}
		}
	}
	return at, binding
}

// expectLocked returns the turn a request of cost on key can expect at
// now once the grants in flight and the waiters settle as their windows'
// grants have been settling, and the limit that binds it (-1: the key's
// hold, or none). ok is false when no expectation applies: the request or
// a waiter counts in a bucket (replan moves no one then), none of the
// request's windows has learnt to expect less than the estimates, or a
// waiter's grant is not where it was given. The caller holds mu.
func (l *Limits) expectLocked(key string, cost Cost, now time.Time) (at time.Time, binding int, ok bool) {
	learnt := false
	for i := range l.limits {
		lim := &l.limits[i]
		if cost.Of(lim.dim) == 0 {
			continue
		}
		if !lim.window {
			return at, -1, false
		}
		if st, found := l.states[i].M[lim.key(key)]; found && st.settled.Expects() {
			learnt = true
		}
	}
	if !learnt {
		return at, -1, false
	}
	p := plan{l: l, now: now, states: make(map[planKey]*window.Plan)}
	var ws []*limitsWaiter
	for _, w := range l.waiters {
		for i := range l.limits {
			if w.cost.Of(l.limits[i].dim) > 0 && !l.limits[i].window {
				return at, -1, false
			}
		}
		if !w.at.After(now) {
			p.going(w) // its turn has come: in flight, where it is
			continue
		}
		ws = append(ws, w)
	}
	slices.SortFunc(ws, func(a, b *limitsWaiter) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return cmp.Compare(a.seq, b.seq)
	})
	for _, w := range ws {
		if !p.remove(w) {
			return at, -1, false
		}
	}
	for _, w := range ws {
		t, _ := p.earliest(w.key, w.cost)
		p.place(w.key, w.cost, clock.Earlier(t, w.at)) // as replan would: never later
	}
	at, binding = p.earliest(key, cost)
	return at, binding, true
}

// plan is a copy of the windows that a request's turn and the waiters'
// touch, in which the grants are expected to settle (expectLocked).
type plan struct {
	l      *Limits
	now    time.Time
	states map[planKey]*window.Plan
}

type planKey struct {
	limit int
	key   string
}

// state returns limit i's window for a request of key, copied from the
// limits when first asked for.
func (p *plan) state(i int, key string) *window.Plan {
	lim := &p.l.limits[i]
	k := planKey{i, lim.key(key)}
	if s := p.states[k]; s != nil {
		return s
	}
	s := &window.Plan{N: lim.n, Win: lim.w + p.l.margin}
	if st, ok := p.l.states[i].M[k.key]; ok {
		st.log.Trim(p.now)
		st.open.Trim(p.now, st.log.W)
		s.Win, s.Stats = st.log.W, st.settled
		for j := st.log.First; j < len(st.log.At); j++ {
			s.Entries = append(s.Entries, window.Entry{At: st.log.At[j], Est: int(st.log.Cost[j]), Exp: int(st.log.Cost[j])})
		}
		for _, o := range st.open {
			if j := s.Find(o.At, int(o.Cost), false); j >= 0 {
				e := &s.Entries[j]
				e.Open = true
				e.Exp, e.Settle = s.Stats.Expect(o.At, e.Est, p.now)
			}
		}
	}
	p.states[k] = s
	return s
}

// remove takes waiter w's grants out of the plan's windows, to be placed
// again; it reports whether every one was found.
func (p *plan) remove(w *limitsWaiter) bool {
	for i := range p.l.limits {
		c := w.cost.Of(p.l.limits[i].dim)
		if c == 0 {
			continue
		}
		s := p.state(i, w.key)
		j := s.Find(w.at, c, false)
		if j < 0 {
			return false
		}
		s.Entries = slices.Delete(s.Entries, j, j+1)
	}
	return true
}

// going counts the grants of waiter w, whose turn has come and which is
// on its way, among the grants in flight of the plan.
func (p *plan) going(w *limitsWaiter) {
	for i := range p.l.limits {
		if c := w.cost.Of(p.l.limits[i].dim); c > 0 {
			s := p.state(i, w.key)
			if j := s.Find(w.at, c, false); j >= 0 {
				e := &s.Entries[j]
				e.Open = true
				e.Exp, e.Settle = s.Stats.Expect(w.at, c, p.now)
			}
		}
	}
}

// earliest returns the first turn, at or after the plan's now and the
// key's hold, at which every window of the plan can grant cost, and the
// limit that binds it (-1: the hold, or none).
func (p *plan) earliest(key string, cost Cost) (time.Time, int) {
	at, binding := p.now, -1
	if d, _ := p.l.holds.remaining(key); d > 0 {
		at = p.now.Add(d)
	}
	for i := range p.l.limits {
		if c := cost.Of(p.l.limits[i].dim); c > 0 {
			if t := p.state(i, key).Earliest(c, p.now); t.After(at) {
				at, binding = t, i
			}
		}
	}
	return at, binding
}

// place grants cost at turn at in the plan's windows: it settles as their
// grants have been settling.
func (p *plan) place(key string, cost Cost, at time.Time) {
	for i := range p.l.limits {
		if c := cost.Of(p.l.limits[i].dim); c > 0 {
			p.state(i, key).Place(c, at)
		}
	}
}
