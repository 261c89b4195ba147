package egress

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/fair"
)

// Priority is a request's place when its key's limit binds (see
// WithPriorities): a higher priority goes first, and each lower one keeps
// a minimum share of the limit while it has requests waiting. The zero
// value is PriorityNormal.
type Priority int8

// The priorities, lowest first. A value outside them counts as the
// nearest.
const (
	PriorityLow    Priority = -1 // backfills, batch jobs: what can wait
	PriorityNormal Priority = 0  // the default
	PriorityHigh   Priority = 1  // a user waiting on a page
)

// String returns "low", "normal" or "high" (or the nearest's name).
func (p Priority) String() string {
	switch p.level() {
	case 0:
		return "low"
	case 2:
		return "high"
	}
	return "normal"
}

// level returns p's index among the priorities: 0 (low) to 2 (high).
func (p Priority) level() int {
	return int(min(max(p, PriorityLow), PriorityHigh) - PriorityLow)
}

// Class is whom a request is for, when its key's limit binds: its
// priority, and its tenant (an account, a customer, a job: any name; ""
// is a tenant too). Within a priority, the tenants with requests waiting
// share the limit max-min fairly (see Priorities). The zero Class is a
// normal request of tenant "".
type Class struct {
	Priority Priority
	Tenant   string
}

type classKey struct{}

// WithClass returns a copy of ctx that carries c: a request made with it
// waits as c when the Transport has WithPriorities (and as any other
// request when it has not).
func WithClass(ctx context.Context, c Class) context.Context {
	return context.WithValue(ctx, classKey{}, c)
}

// ClassOf returns the Class that ctx carries (see WithClass), and whether
// it carries one.
func ClassOf(ctx context.Context) (Class, bool) {
	c, ok := ctx.Value(classKey{}).(Class)
	return c, ok
}

// Priorities orders the requests of a key that wait for its limit; see
// WithPriorities. The zero value is the defaults.
type Priorities struct {
	// Classify returns the Class of a request whose context carries none
	// (WithClass): a caller that cannot reach the context (an SDK's
	// calls) reads it from the request, a header or the path. Nil: such a
	// request is a normal request of tenant "".
	Classify func(*http.Request) Class
	// MinShare is the share of the limit each priority below the highest
	// with requests waiting keeps while it has requests waiting, in the
	// limit's own dimension: under a flood of high-priority requests, the
	// normal ones still get MinShare of the grants, and the low ones
	// MinShare too. 0 means 0.1; it must lie in (0, 0.5].
	MinShare float64
	// Weight returns a tenant's weight: within a priority, a tenant of
	// weight 2 gets twice the share of one of weight 1 while both wait.
	// Nil: every tenant weighs 1. A weight that is not a positive finite
	// number counts as 1.
	Weight func(tenant string) float64
}

// The default Priorities.MinShare.
const defaultMinShare = 0.1

// validate reports why p cannot be used.
func (p *Priorities) validate() error {
	if p.MinShare == 0 {
		p.MinShare = defaultMinShare
	}
	if !(p.MinShare > 0 && p.MinShare <= 0.5) {
		return configError("WithPriorities: MinShare", p.MinShare, "must lie in (0, 0.5]")
	}
	return nil
}

// weightOf returns tenant's weight (see Weight).
func (p *Priorities) weightOf(tenant string) float64 { return fair.WeightOf(p.Weight, tenant) }

// classOf returns req's Class: its context's, else the Classify of p.
func (p *Priorities) classOf(req *http.Request) Class {
	if c, ok := ClassOf(req.Context()); ok {
		return c
	}
	if p.Classify != nil {
		return p.Classify(req)
	}
	return Class{}
}

// gate is the Transport's priority queues, one a key. A request with
// the limiter is a lead of its key. A request goes to the limiter at once
// when its key has no lead; when it has fewer than g.leads (one; two for a
// shared limiter, see fleetLeads) and nobody of the request's level or
// above waits; or when it is a high one, no high one waits, and fewer than
// highLeads are with the limiter: a lower lead's turn, already given, is
// not displaced, and the high request reserves its own turn beside it
// rather than after it is granted. Otherwise it waits in the key's
// fair.Queue; when a lead is done, the next waiter goes when there is
// room for a lead, when it is of a higher priority than every lead left,
// when the queue chose it on its level's credit, or when it is a high one
// with room beside the high leads. (Requests side by side while the limit
// does not bind would be cheaper, but a lead does not tell whether it
// waits until it is granted, and every request arriving meanwhile would
// pass the queue.)
type gate struct {
	p     Priorities
	clock *clock.Clock
	lim   Limiter // what a request's work is measured against (see queueTicket.measure)
	depth int     // the most a key's queue may hold, in requests (see depthOf); 0: no bound
	fleet bool    // the limiter is a shared one: it is told each request's fleetTurn
	leads int     // how many requests of a key go to the limiter side by side (see fleetLeads)

	mu    sync.Mutex
	keys  map[string]*gateKey // guarded by mu
	swept int                 // guarded by mu: len(keys) after the last sweep
}

// gateKey is a key's place in the gate.
type gateKey struct {
	leads  [3]int                 // the requests with the limiter, by priority level
	q      *fair.Queue[*gateWait] // the waiters
	queued [3]int                 // the waiters' costs by priority level, in requests
}

// topLead returns the highest level with a lead, or -1 when none.
func (k *gateKey) topLead() int {
	for lv := len(k.leads) - 1; lv >= 0; lv-- {
		if k.leads[lv] > 0 {
			return lv
		}
	}
	return -1
}

// highLeads is how many high requests of a key may be with the limiter
// at once, beside a lower lead, while no other high one waits: a high
// request that comes while another is with a shared limiter (its turn up
// to the fleet's horizon away, and a round trip) reserves its own turn
// behind it at once, rather than after that turn. Callers of high requests
// in a loop keep high leads with the limiter at every hand-on; a waiter
// below goes beside them on its level's credit (see goes).
const highLeads = 4

// straight reports whether a request of level lv goes to the limiter at
// once: when the key has no lead, or fewer than most and nobody of level
// lv or above waits; or, a high request, when fewer than highLeads high
// ones are with the limiter and none waits.
func (k *gateKey) straight(lv, most int) bool {
	if n := k.total(); n == 0 || n < most && (k.q == nil || !k.q.Waiting(lv)) {
		return true
	}
	high := len(k.leads) - 1
	return lv == high && k.leads[high] < highLeads && (k.q == nil || !k.q.Waiting(lv))
}

// goes reports whether the waiter e, next in the queue, goes now: with
// fewer than most leads; above every lead; on its level's credit (its
// minimum share, which leads above it do not hold back); or a high one
// with room beside the high leads.
func (k *gateKey) goes(e *fair.Entry[*gateWait], byCredit bool, most int) bool {
	high := len(k.leads) - 1
	return e.Level > k.topLead() || byCredit || k.total() < most || e.Level == high && k.leads[high] < highLeads
}

// total returns the number of leads.
func (k *gateKey) total() int {
	return k.leads[0] + k.leads[1] + k.leads[2]
}

// sum returns the waiters' costs at the levels below lv (all: 3).
func (k *gateKey) sum(lv int) int {
	n := 0
	for _, c := range k.queued[:lv] {
		n += c
	}
	return n
}

// gateWait is a waiter's side of the gate: told its turn, or that it was
// pushed out of a full queue, by a close of turn.
type gateWait struct {
	turn chan struct{}
	cost int
	out  bool // pushed out: set under the gate's mu before turn is closed
}

func newGate(p Priorities, clk *clock.Clock, l Limiter) *gate {
	g := &gate{p: p, clock: clk, lim: l, depth: depthOf(l), leads: 1, keys: map[string]*gateKey{}}
	if _, fleet := l.(interface{ ordersFleet() }); fleet {
		g.fleet, g.leads = true, fleetLeads
	}
	return g
}

// fleetLeads is how many requests of a key go to a shared limiter side by
// side, whatever their level: the fleet's order holds each back in Redis
// (see fleetTurn), and one held back for its tenant's share must not keep
// the instance's other tenants from the turns meanwhile. (A local limiter
// has one: it gives turns in the order it is asked.)
const fleetLeads = 2

// fleetTurn is what the gate tells a shared limiter, through the context
// of the request it lets through, of the request's place in the fleet's
// priority order and tenants' shares (fair.Order and fair.Shares,
// restated in the reservation script): its level, the share of a level
// held back, its tenant and the tenant's weight. A request the gate did
// not let through has level -1 and share 0: it is not held back.
type fleetTurn struct {
	level  int
	share  float64
	tenant string
	weight float64
}

type fleetTurnKey struct{}

// fleetTurnOf returns the fleetTurn that ctx carries.
func fleetTurnOf(ctx context.Context) fleetTurn {
	if ft, ok := ctx.Value(fleetTurnKey{}).(fleetTurn); ok {
		return ft
	}
	return fleetTurn{level: -1}
}

// fleetHorizon is how far ahead a request below the highest priority may
// take a turn of a shared limiter when the fleet's order holds it back
// (see fair.Order): a high request of any instance then waits behind at
// most this much of lower turns, and the one being sent. It covers a round
// trip to Redis and a busy process's late wake-up, so that the turns a held
// request comes back for follow on without a gap.
const fleetHorizon = 20 * time.Millisecond

// queueTicket is a request's passage through the gate: what it is and needs.
type queueTicket struct {
	key     string
	class   Class
	cost    int     // in requests, for a refusal
	work    float64 // in seconds of the limit (see workOf)
	maxWait time.Duration

	costs    Cost // a copy: a pointer to the caller's would move it to the heap
	measured bool
}

// measure sets t's work against lim, once: only a request that queues,
// or goes past a queue, needs it (a key that never binds pays nothing for
// it).
func (t *queueTicket) measure(lim Limiter) {
	if !t.measured {
		t.work = workOf(lim, t.key, &t.costs)
		t.measured = true
	}
}

// take waits for t's turn at its key and returns the key's place, which
// the caller hands on (handOn) once the limiter has granted or refused it,
// and how long t queued. A request with nobody ahead goes at once.
func (g *gate) take(ctx context.Context, t *queueTicket) (*gateKey, time.Duration, error) {
	if g.depth > 0 && t.cost > g.depth {
		// No queue holds it: the limiter says so (ErrCostTooHigh).
		return nil, 0, &LimitError{Key: t.key, Cost: t.cost, Reason: ReasonCostTooHigh, Class: t.class}
	}
	k, e, since, err := g.enqueue(t)
	if err != nil || e == nil {
		return k, 0, err
	}
	queued, err := g.queue(ctx, k, e, t, waitBudget(ctx, t.maxWait), since)
	if err != nil {
		return nil, queued, err
	}
	return k, queued, nil
}

// enqueue makes t a lead of its key and returns the key's place, when t
// goes at once; else it queues t and returns its entry too, and when. The
// caller's code it runs (a limiter's EffectiveRate, a tenant's Weight) runs
// before the gate's state changes, and a panic there leaves the gate as it
// was, unlocked.
func (g *gate) enqueue(t *queueTicket) (*gateKey, *fair.Entry[*gateWait], time.Time, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := g.key(t.key)
	if lv := t.class.Priority.level(); k.straight(lv, g.leads) {
		if k.q != nil {
			t.measure(g.lim)
			k.q.Charge(lv, t.class.Tenant, t.work)
		}
		k.leads[lv]++
		return k, nil, time.Time{}, nil
	}
	if k.q == nil {
		k.q = fair.New[*gateWait](3, g.p.MinShare, g.p.Weight)
	}
	now := (*g.clock).Now()
	e := g.push(k, t)
	if g.depth > 0 && k.sum(3) > g.depth && !g.pushOut(k, t) {
		g.remove(k, e)
		return nil, nil, now, &LimitError{Key: t.key, Cost: t.cost, Reason: ReasonQueueFull, Class: t.class, Queued: true}
	}
	return k, e, now, nil
}

// push queues t at k. g.mu is held.
func (g *gate) push(k *gateKey, t *queueTicket) *fair.Entry[*gateWait] {
	t.measure(g.lim)
	lv := t.class.Priority.level()
	e := k.q.Push(lv, t.class.Tenant, t.work, &gateWait{turn: make(chan struct{}), cost: t.cost})
	k.queued[lv] += t.cost
	return e
}

// remove takes e out of k's queue and reports whether it was there.
// g.mu is held.
func (g *gate) remove(k *gateKey, e *fair.Entry[*gateWait]) bool {
	if !k.q.Remove(e) {
		return false
	}
	k.queued[e.Level] -= e.Value.cost
	return true
}

// pushOut makes room in k's full queue for t by pushing out the last
// waiters of the lowest priorities below t's, and reports whether it did
// (it pushes out none when they would not make room). g.mu is held.
func (g *gate) pushOut(k *gateKey, t *queueTicket) bool {
	lv := t.class.Priority.level()
	excess := k.sum(3) - g.depth
	if k.sum(lv) < excess {
		return false
	}
	for excess > 0 {
		e := k.q.Last(lv)
		g.remove(k, e)
		excess -= e.Value.cost
		e.Value.out = true
		close(e.Value.turn)
	}
	return true
}

// key returns key's place, made on first use. Idle places are swept when
// the map has doubled since the last sweep. g.mu is held.
func (g *gate) key(key string) *gateKey {
	k := g.keys[key]
	if k != nil {
		return k
	}
	if len(g.keys) >= 2*g.swept+64 {
		for name, k := range g.keys {
			if k.topLead() < 0 {
				delete(g.keys, name)
			}
		}
		g.swept = len(g.keys)
	}
	k = &gateKey{}
	g.keys[key] = k
	return k
}

// queue waits for e's turn, until ctx ends or its budget b (from since)
// runs out, and returns how long it waited. A waiter that gives up leaves
// the queue; one whose turn came as it gave up hands the turn on.
func (g *gate) queue(ctx context.Context, k *gateKey, e *fair.Entry[*gateWait], t *queueTicket, b budget, since time.Time) (time.Duration, error) {
	var expire <-chan time.Time
	if d, ok := b.left(since); ok {
		tm := (*g.clock).NewTimer(d)
		defer tm.Stop()
		expire = tm.C()
	}
	select {
	case <-e.Value.turn:
		if e.Value.out {
			return 0, &LimitError{Key: t.key, Cost: t.cost, Reason: ReasonQueueFull, Class: t.class, Queued: true}
		}
		return (*g.clock).Now().Sub(since), nil
	case <-expire:
	case <-ctx.Done():
	}
	now := (*g.clock).Now()
	waited := now.Sub(since)
	g.mu.Lock()
	if !g.remove(k, e) && !e.Value.out {
		g.next(k, e.Level) // its turn came meanwhile: pass it on
	}
	g.mu.Unlock()
	if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return waited, ctx.Err()
	}
	// Wait: what it waited, the least it would have (see LimitError.Queued).
	le := &LimitError{Key: t.key, Cost: t.cost, Reason: ReasonMaxWait, Wait: waited, Class: t.class, Queued: true}
	if dl := b.deadline; !dl.IsZero() && (b.maxWait <= 0 || !dl.After(since.Add(b.maxWait))) {
		le.Reason = ReasonDeadline
	}
	return waited, le
}

// handOn ends a lead of level lv at k, and gives the next waiter its turn
// when it may go (see gate).
func (g *gate) handOn(k *gateKey, lv int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.next(k, lv)
}

// next is handOn with g.mu held.
func (g *gate) next(k *gateKey, lv int) {
	k.leads[lv]--
	if k.q == nil {
		return
	}
	if e, byCredit := k.q.Peek(); e == nil || !k.goes(e, byCredit, g.leads) {
		return
	}
	e, _ := k.q.Pop()
	k.leads[e.Level]++
	k.queued[e.Level] -= e.Value.cost
	close(e.Value.turn)
}

// left returns how long a wait begun at since may last under b, and false
// when nothing bounds it.
func (b budget) left(since time.Time) (time.Duration, bool) {
	d, ok := time.Duration(math.MaxInt64), false
	if b.maxWait > 0 {
		d, ok = b.maxWait, true
	}
	if !b.deadline.IsZero() {
		d, ok = min(d, max(b.deadline.Sub(since), 0)), true
	}
	return d, ok
}

// String describes c for an error: "priority high, tenant "acme"".
func (c Class) String() string {
	s := "priority " + c.Priority.String()
	if c.Tenant != "" {
		s += ", tenant " + strconv.Quote(c.Tenant)
	}
	return s
}

// enterGate is enter through the key's priority queue (WithPriorities): an
// attempt that costs something waits for its turn in the queue, then
// enters as it would without priorities (the quick way through quick, the
// Transport's own TokenBucket, when it is not nil; now is the clock's
// reading for it), with the time it queued counted against the maximum
// wait. OnQueued is told of a wait.
func (t *Transport) enterGate(req *http.Request, key string, cost *Cost, g *Grant, quick *TokenBucket, now time.Time) (passage, error) {
	ctx := req.Context()
	if t.limiter == nil || *cost == (Cost{}) {
		return t.enter(ctx, key, cost, g, 0)
	}
	tn := queueTicket{key: key, class: t.gate.p.classOf(req), cost: cost.Requests, maxWait: t.maxWait, costs: *cost}
	a, err := t.enterTurn(ctx, &tn, cost, g, quick, now)
	if err != nil {
		if le := (*LimitError)(nil); errors.As(err, &le) {
			le.Class, le.ordered = tn.class, true // (refused by the limiter, after its turn: its class too)
		}
		return a, err
	}
	if a.waited > 0 && t.obs.OnQueued != nil {
		t.obs.OnQueued(key, tn.class, a.waited)
	}
	return a, nil
}

// enterTurn waits for tn's turn in its key's queue, then enters; the turn
// passes on to the next waiter once the attempt is granted or refused.
func (t *Transport) enterTurn(ctx context.Context, tn *queueTicket, cost *Cost, g *Grant, quick *TokenBucket, now time.Time) (passage, error) {
	k, queued, err := t.gate.take(ctx, tn)
	if err != nil {
		return passage{}, err
	}
	defer t.gate.handOn(k, tn.class.Priority.level())
	if t.gate.fleet {
		ctx = context.WithValue(ctx, fleetTurnKey{}, fleetTurn{level: tn.class.Priority.level(), share: t.gate.p.MinShare,
			tenant: tn.class.Tenant, weight: t.gate.p.weightOf(tn.class.Tenant)})
	}
	if quick == nil {
		return t.enter(ctx, tn.key, cost, g, queued)
	}
	if queued > 0 {
		now = time.Time{} // read afresh after the queue
	}
	return t.enterQuick(ctx, quick, tn.key, cost.Requests, now, queued)
}

// workOf returns what cost takes of key's limit, in seconds of it, or in
// requests when l does not tell its rate. With several limits it is the
// largest share (tokens, when they bind before requests).
func workOf(l Limiter, key string, cost *Cost) float64 {
	switch l := l.(type) {
	case *Limits:
		return limitsWork(l.limits, cost)
	case *SharedLimits:
		return limitsWork(l.limits, cost)
	case interface{ EffectiveRate(string) Rate }:
		if r := l.EffectiveRate(key).PerSecond(); r > 0 {
			return float64(cost.Requests) / r
		}
	}
	return float64(cost.Requests)
}

// depthOf returns the queue depth of a leaky bucket, which bounds the
// key's priority queue too (0 for other limiters: no bound).
func depthOf(l Limiter) int {
	switch l := l.(type) {
	case *LeakyBucket:
		return max(l.depth, 1)
	case *SharedLeakyBucket:
		return max(l.depth, 1)
	}
	return 0
}

// limitsWork is workOf for limits enforced together: the most seconds
// cost takes of any one of them.
func limitsWork(limits []Limit, cost *Cost) float64 {
	work := 0.0
	for i := range limits {
		l := &limits[i]
		perSec := l.rate.PerSecond()
		if l.window {
			perSec = float64(l.n) / l.w.Seconds()
		}
		if perSec > 0 {
			work = max(work, float64(cost.Of(l.dim))/perSec)
		}
	}
	return work
}
