// Package fair owns the order in which the waiters of one key go when its
// limit binds: levels of priority, where a higher level goes first and
// each lower level keeps a minimum share of the grants while it has
// waiters, and, within a level, tenants that share max-min fairly in the
// limit's own dimension (a waiter's work: its cost in seconds of the limit,
// or in any unit its owner chooses, the same for all).
//
// It knows nothing of time, HTTP, limiters, contexts or goroutines: its
// owner tells it of arrivals (Push), departures (Remove: a waiter that gave
// up) and grants (Pop: who goes next), under the owner's lock. egress's
// priority gate keeps one Queue a key.
//
// The rules, which the property tests hold on random schedules:
//   - Priority: Pop takes the highest level with waiters, unless a lower
//     level with waiters has earned its turn: every grant of work w, to any
//     level, earns each level below the highest with waiters share·w of
//     credit, and a level whose credit covers its next waiter's work goes
//     first and spends it. A level keeps at least its share of the work
//     granted while it has waiters; credit is dropped when it has none,
//     and when it is served as the highest level with waiters.
//   - Fairness: within a level, the tenant that has been served the least
//     work (divided by its weight) goes next, each tenant's own waiters in
//     arrival order. A tenant that comes back after a pause starts level
//     with the least served of those waiting, so a pause is not banked.
//   - No trace: a waiter that leaves before its turn is not charged to its
//     tenant nor kept; when its tenant and level had other waiters all
//     along, and none of them weighed less than it, the order of every
//     other waiter is what it would have been had it never come. (While it
//     is its level's next, its level waits for credit to cover its work:
//     a heavy waiter that leaves may have held its level back meanwhile.
//     And one alone at its level keeps the level's credit running while it
//     waits; the credit goes when the level is left empty.)
//
// Memory: a tenant is kept while it waits, and after, while it has been
// served more than the level's latest (it would otherwise bank a pause),
// up to remembered of those a level. Choosing the next waiter takes time
// in the number of tenants waiting at its level.
package fair

import (
	"cmp"
	"math"
	"slices"
)

// Queue is one key's waiters. The zero value is not usable: see New. It is
// not safe for concurrent use: its owner guards it.
type Queue[T any] struct {
	levels []level[T]
	share  float64
	weight func(tenant string) float64
	n      int    // waiters queued
	seq    uint64 // arrivals, to break ties in arrival order
}

// level is one priority level's waiters, by tenant.
type level[T any] struct {
	tenants map[string]*tenant[T]
	waiting []*tenant[T] // the tenants with waiters, in no order
	active  int          // len(waiting)
	pruned  int          // len(tenants) after the last prune
	queued  float64      // the work of its waiters
	credit  float64      // earned by grants while the level waited below the top
	vtime   float64      // the served work of the tenant served last, before that grant
}

// tenant is one tenant's state in a level: its waiters in arrival order
// and the work served to it, divided by its weight.
type tenant[T any] struct {
	name    string
	waiters []*Entry[T]
	served  float64
	floor   float64 // the level's vtime when it last began to wait
	weight  float64
	at      int // its index in the level's waiting, while it waits
}

// Entry is a waiter in a Queue.
type Entry[T any] struct {
	Value  T
	Level  int
	Tenant string
	Work   float64
	seq    uint64
	queued bool
}

// New returns an empty Queue of levels levels (0 the lowest), where each
// level below the highest with waiters keeps share of the grants (0 ≤
// share, share·(levels−1) ≤ 1), and a tenant's weight is weight(tenant)
// (every tenant weighs 1 when weight is nil; a weight that is not a
// positive finite number counts as 1).
func New[T any](levels int, share float64, weight func(string) float64) *Queue[T] {
	q := &Queue[T]{levels: make([]level[T], max(levels, 1)), share: share, weight: weight}
	for i := range q.levels {
		q.levels[i].tenants = map[string]*tenant[T]{}
	}
	return q
}

// Len returns the number of waiters queued.
func (q *Queue[T]) Len() int { return q.n }

// Push queues a waiter of work at level lv (clamped to the levels) for
// tenant, holding v, and returns its entry.
func (q *Queue[T]) Push(lv int, tenantName string, work float64, v T) *Entry[T] {
	lv = min(max(lv, 0), len(q.levels)-1)
	if !(work >= 0) || math.IsInf(work, 0) {
		work = 0
	}
	l := &q.levels[lv]
	t := l.tenants[tenantName]
	if t == nil && len(l.tenants) >= 2*max(l.pruned, l.active)+64 {
		l.prune() // tenants that went ahead and left
	}
	if t == nil {
		t = &tenant[T]{name: tenantName, served: l.vtime, weight: q.weightOf(tenantName)}
		l.tenants[tenantName] = t
	}
	if len(t.waiters) == 0 {
		t.floor = l.vtime
		t.at = len(l.waiting)
		l.waiting = append(l.waiting, t)
		l.active++
	}
	q.seq++
	e := &Entry[T]{Value: v, Level: lv, Tenant: tenantName, Work: work, seq: q.seq, queued: true}
	t.waiters = append(t.waiters, e)
	l.queued += work
	q.n++
	return e
}

func (q *Queue[T]) weightOf(name string) float64 { return WeightOf(q.weight, name) }

// WeightOf returns tenant's weight by weight: 1 when weight is nil, or
// when it is not a positive finite number.
func WeightOf(weight func(tenant string) float64, tenant string) float64 {
	if weight == nil {
		return 1
	}
	if w := weight(tenant); w > 0 && !math.IsInf(w, 0) {
		return w
	}
	return 1
}

// Remove takes e out of the queue before its turn and reports whether it
// was there (false once Pop has returned it, or after an earlier Remove).
func (q *Queue[T]) Remove(e *Entry[T]) bool {
	if e == nil || !e.queued {
		return false
	}
	l := &q.levels[e.Level]
	t := l.tenants[e.Tenant]
	for i, w := range t.waiters {
		if w == e {
			t.waiters = append(t.waiters[:i], t.waiters[i+1:]...)
			break
		}
	}
	q.leave(l, t, e)
	return true
}

// leave accounts e's departure from t's waiters in l.
func (q *Queue[T]) leave(l *level[T], t *tenant[T], e *Entry[T]) {
	e.queued = false
	q.n--
	l.queued -= e.Work
	if len(t.waiters) > 0 {
		return
	}
	l.active--
	t.waiters = nil
	last := l.waiting[len(l.waiting)-1]
	l.waiting[t.at], last.at = last, t.at
	l.waiting[len(l.waiting)-1] = nil
	l.waiting = l.waiting[:len(l.waiting)-1]
	if t.served <= l.vtime {
		delete(l.tenants, t.name) // nothing to remember: it would start at vtime
	}
	if l.active == 0 {
		l.credit, l.queued = 0, 0
	}
}

// remembered is how many tenants that wait no more a level keeps while
// they are ahead of it (served more than vtime); beyond, the least ahead
// are dropped, and come back level with the rest, a little ahead of where
// they were.
const remembered = 1024

// prune drops the tenants of l that wait no more and are not ahead of the
// level (served at most vtime): each would come back at vtime anyway; and,
// beyond remembered of them, the least ahead.
func (l *level[T]) prune() {
	var ahead []*tenant[T]
	for name, t := range l.tenants {
		switch {
		case len(t.waiters) > 0:
		case t.served <= l.vtime:
			delete(l.tenants, name)
		default:
			ahead = append(ahead, t)
		}
	}
	if len(ahead) > remembered {
		slices.SortFunc(ahead, func(a, b *tenant[T]) int { return cmp.Compare(a.served, b.served) })
		for _, t := range ahead[:len(ahead)-remembered/2] {
			delete(l.tenants, t.name)
		}
	}
	l.pruned = len(l.tenants)
}

// Pop returns the waiter whose turn it is and takes it out of the queue,
// accounting its grant; false when the queue is empty.
func (q *Queue[T]) Pop() (*Entry[T], bool) {
	top, lv, byCredit := q.turn()
	if lv < 0 {
		return nil, false
	}
	l := &q.levels[lv]
	t := l.next()
	e := t.waiters[0]
	t.waiters = t.waiters[1:]
	if byCredit {
		l.credit = max(l.credit-e.Work, 0)
	} else {
		// Served as the top, the level is not held back: credit kept
		// would be banked, and spent later to pass a higher level by
		// more than its share.
		l.credit = 0
	}
	t.served = max(t.served, t.floor) + e.Work/t.weight
	l.vtime = max(l.vtime, t.served-e.Work/t.weight)
	q.leave(l, t, e)
	q.earn(top, e.Work) // to the levels still waiting
	return e, true
}

// Peek returns the waiter Pop would return, leaving it queued, and
// whether its level's credit covers it (its minimum share: an owner that
// holds the top level back for grants that do not queue lets it go
// beside them); nil when the queue is empty.
func (q *Queue[T]) Peek() (*Entry[T], bool) {
	_, lv, byCredit := q.turn()
	if lv < 0 {
		return nil, false
	}
	return q.levels[lv].next().waiters[0], byCredit
}

// turn returns the highest level with waiters (-1 for none), the level
// whose turn it is, and whether that level's credit covers its next
// waiter (which then goes on it; the top level's can, when it earned it
// from grants that did not queue: see Charge).
func (q *Queue[T]) turn() (top, lv int, byCredit bool) {
	top = q.top()
	if top < 0 {
		return top, top, false
	}
	for i := top; i >= 0 && q.share > 0; i-- {
		l := &q.levels[i]
		if l.active > 0 && covers(l.credit, l.next().waiters[0].Work) {
			return top, i, true
		}
	}
	return top, top, false
}

// Waiting reports whether any level from lv up has waiters.
func (q *Queue[T]) Waiting(lv int) bool {
	return q.top() >= lv
}

// Charge accounts a grant of work at level lv to tenant that went without
// queuing (nobody of its level or above was waiting): the tenant is
// charged, and the levels below with waiters earn their share of it.
func (q *Queue[T]) Charge(lv int, tenantName string, work float64) {
	lv = min(max(lv, 0), len(q.levels)-1)
	if !(work >= 0) || math.IsInf(work, 0) {
		return
	}
	l := &q.levels[lv]
	if t := l.tenants[tenantName]; t != nil {
		t.served = max(t.served, l.vtime) + work/t.weight
	} else if l.active > 0 {
		t = &tenant[T]{name: tenantName, served: l.vtime + work/q.weightOf(tenantName), weight: q.weightOf(tenantName)}
		l.tenants[tenantName] = t
	}
	q.earn(lv, work)
}

// covers reports whether credit covers work, but for the rounding of the
// sums that made it (ten grants of 0.1 at share 0.1 cover 0.1).
func covers(credit, work float64) bool {
	return credit >= work*(1-1e-9)
}

// top returns the highest level with waiters, or -1.
func (q *Queue[T]) top() int {
	for i := len(q.levels) - 1; i >= 0; i-- {
		if q.levels[i].active > 0 {
			return i
		}
	}
	return -1
}

// earn credits each level below top that has waiters with share of a
// grant of work. (Credit needs no cap: a level spends it as soon as it
// covers its next waiter, and loses it when it has none.)
func (q *Queue[T]) earn(top int, work float64) {
	for i := top - 1; i >= 0; i-- {
		if l := &q.levels[i]; l.active > 0 {
			l.credit += q.share * work
		}
	}
}

// next returns the tenant of l whose turn it is: the least served (by
// weight) of those waiting, ties to the earliest waiter.
func (l *level[T]) next() *tenant[T] {
	var best *tenant[T]
	var bestServed float64
	for _, t := range l.waiting {
		s := max(t.served, t.floor)
		if best == nil || s < bestServed || (s == bestServed && t.waiters[0].seq < best.waiters[0].seq) {
			best, bestServed = t, s
		}
	}
	return best
}

// Last returns the waiter that arrived last at the lowest level below lv
// that has waiters, or nil when no level below lv has any: the one to
// refuse when a queue of bounded depth is full and a waiter of level lv
// comes.
func (q *Queue[T]) Last(lv int) *Entry[T] {
	for i := 0; i < min(lv, len(q.levels)); i++ {
		l := &q.levels[i]
		if l.active == 0 {
			continue
		}
		var last *Entry[T]
		for _, t := range l.waiting {
			if n := len(t.waiters); last == nil || t.waiters[n-1].seq > last.seq {
				last = t.waiters[n-1]
			}
		}
		return last
	}
	return nil
}
