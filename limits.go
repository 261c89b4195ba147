package egress

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/gcra"
	"github.com/egress-go/egress/internal/keyed"
	"github.com/egress-go/egress/internal/window"
)

// Cost is what one request costs, in each dimension a limit may count. The
// zero value costs nothing; a request usually costs Requests: 1, and an
// LLM call also an estimate of its tokens (see WithCosts).
type Cost struct {
	Requests     int
	Tokens       int // input and output together
	InputTokens  int
	OutputTokens int
	Points       int // a query's calculated cost (Shopify GraphQL)
}

// Of returns the cost in dimension d.
func (c Cost) Of(d Dimension) int {
	switch d {
	case Requests:
		return c.Requests
	case Tokens:
		return c.Tokens
	case InputTokens:
		return c.InputTokens
	case OutputTokens:
		return c.OutputTokens
	case Points:
		return c.Points
	}
	return 0
}

// negative returns the first dimension with a negative cost.
func (c Cost) negative() (Dimension, bool) {
	for d := Requests; d <= Points; d++ {
		if c.Of(d) < 0 {
			return d, true
		}
	}
	return 0, false
}

// check returns an error naming the first dimension with a negative cost.
func (c Cost) check(key string) error {
	if d, neg := c.negative(); neg {
		return fmt.Errorf("egress: key %q: cost %d in %s is negative", key, c.Of(d), d)
	}
	return nil
}

// Limit is one limit of a Limits: what it counts (a dimension), how (a
// token bucket or a sliding window), and of which key (the request's own,
// or a parent's: see Parent). Make one with BucketOf or WindowOf.
type Limit struct {
	dim    Dimension
	window bool
	rate   Rate          // a bucket's refill
	n      int           // a bucket's burst; a window's quota
	w      time.Duration // a window's length
	parent func(key string) string
	// parentSet records a call of Parent, so that validate refuses a nil
	// parent rather than read it as no parent.
	parentSet bool
}

// BucketOf returns a token-bucket limit on dimension d: bursts up to burst
// units, then r. In any interval of length t it grants at most r·t + burst.
func BucketOf(d Dimension, r Rate, burst int) Limit {
	return Limit{dim: d, rate: r, n: burst}
}

// WindowOf returns a sliding-window limit on dimension d: at most n units
// in any window of length w, exactly (see WindowLimit, which is one).
func WindowOf(d Dimension, n int, w time.Duration) Limit {
	return Limit{dim: d, window: true, n: n, w: w}
}

// Parent returns the limit applied to a parent of the request's key: the
// key parent(key), which every key with the same parent shares (the whole
// account or host, above one limit per endpoint). HostOf is the parent of
// the keys RouteKeys makes. A request is admitted only when its own key's
// limits and its parents' all grant its cost. parent must not be nil:
// NewLimits and NewSharedLimits refuse a limit whose parent is nil.
func (l Limit) Parent(parent func(key string) string) Limit {
	l.parent = parent
	l.parentSet = true
	return l
}

// HostOf returns the host of a key that RouteKeys made ("api.example.com"
// for "api.example.com/v1/customers/{id}"): the parent for a host-wide
// limit above per-route ones.
func HostOf(key string) string {
	if i := strings.IndexByte(key, '/'); i >= 0 {
		return key[:i]
	}
	return key
}

// String describes the limit: "requests ≤ 100/1s burst 10", "tokens ≤ 30000
// per 1m0s".
func (l Limit) String() string {
	s := ""
	if l.window {
		s = fmt.Sprintf("%s ≤ %d per %v", l.dim, l.n, l.w)
	} else {
		s = fmt.Sprintf("%s ≤ %v burst %d", l.dim, l.rate, l.n)
	}
	if l.parent != nil {
		s += " (parent key)"
	}
	return s
}

func (l Limit) validate(op string, i int) error {
	op = fmt.Sprintf("%s: limit %d (%s)", op, i, l.dim)
	if l.dim > Points {
		return configError(op+": dimension", int(l.dim), "is not one of Requests, Tokens, InputTokens, OutputTokens, Points")
	}
	if l.parentSet && l.parent == nil {
		return configError(op+": Parent", "nil", "the parent function must not be nil")
	}
	if l.window {
		if l.n < 1 || l.n > math.MaxInt32 {
			return configError(op+": n", l.n, "must be from 1 to 2147483647")
		}
		if l.w <= 0 {
			return configError(op+": window", l.w, "must be positive")
		}
		return nil
	}
	if err := l.rate.validate(op + ": rate"); err != nil {
		return err
	}
	if l.n < 1 {
		return configError(op+": burst", l.n, "must be at least 1")
	}
	return nil
}

// key returns the key whose state the limit keeps for a request of key.
func (l *Limit) key(key string) string {
	if l.parent != nil {
		return l.parent(key)
	}
	return key
}

// Limits is a set of limits enforced together, all or nothing: a request
// is admitted only at a turn at which every limit can grant its cost in
// the limit's dimension, and then takes it from all of them at once. A
// request refused, cancelled or timed out takes nothing from any limit. It
// is how "per second and per minute", "requests and tokens", and "per
// endpoint and per account" are kept by one limiter: two Transports or two
// limiters stacked would spend the first's capacity on a request the
// second refuses.
//
// Each limit keeps one state per key: a token bucket (its theoretical
// arrival time, the GCRA arithmetic of the shared limiters' scripts) or a
// sliding window (28 bytes per grant still in the window, as WindowLimit).
// The buckets do their own arithmetic rather than use x/time/rate's,
// because a turn chosen by one limit must be taken at that turn by the
// others, which x/time/rate's reservations cannot do exactly.
//
// A request's cost comes from WaitCost (Wait costs Requests only). When the
// response tells the actual cost, Settle charges or refunds the
// difference. In any interval, a limit then grants at most its bound plus
// the under-estimates of the requests still unsettled when the last of
// them was admitted: the estimate's error times the requests in flight.
//
// A window learns from the settlements how its key's requests settle (the
// ratio of actual to estimate, and how long after their turn), and keeps
// the requests in flight once a settlement has differed from its estimate
// (28 bytes each, until settled). A request whose turn, planned on the
// estimates in flight, lies beyond its deadline or maximum wait is then
// refused at once only when it would lie beyond them even once those
// requests settle as the key's have been settling; otherwise it waits for
// the refunds (see WaitCost). Every turn given is still the one the
// windows allow, so the bound above holds.
//
// A Limits is a Learner: it holds a key as a Transport without a learning
// limiter does (a Retry-After, an exhausted requests quota), and a
// provider's count in a dimension (remaining tokens, remaining requests
// less those in flight) caps the room of that dimension's limits: see
// Learn. It is local (one process: SharedLimits is its fleet-wide form);
// its windows keep a transit margin (see NewLimits). It is safe for
// simultaneous use by multiple goroutines.
type Limits struct {
	limits []Limit
	clock  clock.Clock
	holds  *holds        // the keys' holds, kept as a Transport's own
	margin time.Duration // added to each window's length: see NewLimits

	mu      sync.Mutex
	states  []keyed.Map[*limitState] // one map per limit; guarded by mu
	waiters []*limitsWaiter          // guarded by mu: the requests waiting for their turns
	seq     uint64                   // guarded by mu: the waiters made
}

// limitState is one key's state of one limit: a bucket's tat, or a
// window's grants, and what the window learnt of their settlements.
type limitState struct {
	bucket  gcra.Bucket     // a bucket's
	log     window.Log      // a window's grants
	settled window.Settling // a window's: how its grants have been settling (limits_settle.go)
	open    window.Open     // a window's grants given and not yet settled, once settled tracks them
}

func (s *limitState) AtRest(now time.Time) bool {
	if s.log.W > 0 {
		return s.log.AtRest(now)
	}
	return s.bucket.AtRest(now)
}

// NewLimits returns the limits enforced together. It needs at least one; a
// window needs n ≥ 1 and w > 0, a bucket a valid rate and a burst ≥ 1.
//
// A limit keeps a transit margin of 5 ms. A window's unit comes back 5 ms
// after its grant leaves the window, so that a request that travels faster
// than the one a window before it does not reach the provider while that
// one is still in the provider's window. A bucket keeps 5 ms of its refill
// in reserve (as far as the burst left after a request's cost allows): a
// provider's bucket of the same burst, which a request reaches a little
// sooner or later than its turn, still holds its cost.
func NewLimits(limits ...Limit) (*Limits, error) {
	if err := validateLimits("NewLimits", limits); err != nil {
		return nil, err
	}
	l := &Limits{limits: append([]Limit(nil), limits...), clock: clock.Real{}, margin: jitterTolerance}
	l.holds = newHolds(&l.clock)
	l.states = make([]keyed.Map[*limitState], len(limits))
	for i := range l.states {
		l.states[i] = keyed.New[*limitState]()
	}
	return l, nil
}

// validateLimits checks the limits of a Limits or a SharedLimits.
func validateLimits(op string, limits []Limit) error {
	if len(limits) == 0 {
		return configError(op+": limits", "none", "give at least one")
	}
	for i, l := range limits {
		if err := l.validate(op, i); err != nil {
			return err
		}
	}
	return nil
}

// Grant is what a Limits granted one request: its key, its cost and its
// turn. Settle it with the request's actual cost, once known.
type Grant struct {
	Key    string
	Cost   Cost
	At     time.Time     // the turn the request was given
	Waited time.Duration // how long it waited for it

	turn  int64   // a SharedLimits' grant: its turn, us of the Redis server's clock
	local *Limits // a SharedLimits' grant made by its fallback
}

// Wait implements Limiter: cost is in requests.
func (l *Limits) Wait(ctx context.Context, key string, cost int, maxWait time.Duration) (time.Duration, error) {
	g, err := l.WaitCost(ctx, key, Cost{Requests: cost}, maxWait)
	return g.Waited, err
}

// WaitCost blocks until every limit grants cost, as Limiter.Wait does for
// one cost: never past ctx's deadline nor maxWait (a *LimitError, whose
// Cost is the cost in the dimension of the limit that would have made it
// wait longest), and when ctx ends during the wait it returns ctx.Err()
// and gives every limit its capacity back. A cost above a limit's burst or
// n fails at once with ErrCostTooHigh.
//
// A request that waits for a turn in windows only may go sooner than the
// turn it was first given: when a settlement gives room back, the waiters'
// turns are given again, in their order (see replan). So a request whose
// turn lies beyond its budget is refused at once only when it would still
// lie beyond it once the grants in flight settle as this key's grants have
// been settling (see limits_settle.go); otherwise it waits for its turn,
// and when no refund has brought that turn within its budget by the
// budget's end (a few milliseconds before ctx's deadline), it gives its
// turn back and returns a *LimitError. A refusal states the wait the
// request needs under that expectation, from its arrival.
func (l *Limits) WaitCost(ctx context.Context, key string, cost Cost, maxWait time.Duration) (Grant, error) {
	if err := cost.check(key); err != nil {
		return Grant{}, err
	}
	if err := ctx.Err(); err != nil {
		return Grant{}, err
	}
	b := waitBudget(ctx, maxWait)
	l.mu.Lock()
	g, now, err := l.reserveLocked(key, cost, b)
	late := false // its turn is beyond b: it waits on the expectation
	if err != nil {
		g, late, err = l.reserveExpectingLocked(key, cost, b, now, err)
	}
	if err != nil || !g.At.After(now) {
		l.mu.Unlock()
		return g, err
	}
	l.seq++
	w := &limitsWaiter{key: key, cost: cost, at: g.At, seq: l.seq, moved: make(chan struct{}, 1)}
	l.waiters = append(l.waiters, w)
	l.mu.Unlock()
	return l.awaitTurn(ctx, key, w, g, b, now, late)
}

// awaitTurn waits for the turn of w, which WaitCost queued at now with
// grant g, and returns what WaitCost returns: g taken at w's turn, once it
// comes (replan may bring it sooner); or, having given the turn back,
// ctx.Err() when ctx ends first, or a *LimitError when w is late (its turn
// beyond b) and no refund has brought its turn within b by the budget's
// end.
func (l *Limits) awaitTurn(ctx context.Context, key string, w *limitsWaiter, g Grant, b budget, now time.Time, late bool) (Grant, error) {
	end := b.end(now, late)
	for {
		l.mu.Lock()
		cur := l.clock.Now()
		d := w.at.Sub(cur)
		if d <= 0 {
			break // with mu held
		}
		if late && b.refuse(now, key, 0, w.at.Sub(now)) != nil {
			if !cur.Before(end) {
				e := l.giveUpLocked(w, g, b, now, cur)
				l.mu.Unlock()
				return Grant{}, e
			}
			d = min(d, end.Sub(cur))
		}
		l.mu.Unlock()
		t := l.clock.NewTimer(d)
		select {
		case <-t.C():
		case <-w.moved:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			l.mu.Lock()
			cur := l.clock.Now()
			if late && errors.Is(ctx.Err(), context.DeadlineExceeded) && b.refuse(now, key, 0, w.at.Sub(now)) != nil {
				// Its budget ended before the clock's timer told it.
				e := l.giveUpLocked(w, g, b, now, cur)
				l.mu.Unlock()
				return Grant{}, e
			}
			l.unwait(w)
			g.At = w.at
			l.cancelLocked(g, cur)
			l.mu.Unlock()
			return Grant{}, ctx.Err()
		}
	}
	l.unwait(w)
	g.At = w.at
	l.openLocked(g)
	l.mu.Unlock()
	g.Waited = g.At.Sub(now)
	return g, nil
}

// cancelLocked gives back the grant of a waiter that left before its
// turn, and gives the other waiters their turns again. The caller holds mu.
func (l *Limits) cancelLocked(g Grant, now time.Time) {
	if l.settleLocked(g, Cost{}, now) && len(l.waiters) > 0 {
		l.replan(now)
	}
}

// limitsWaiter is a request waiting for its turn. Its fields are guarded by
// the Limits' mu.
type limitsWaiter struct {
	key   string
	cost  Cost
	at    time.Time     // its turn, which replan may move
	seq   uint64        // its place among waiters of the same turn
	moved chan struct{} // buffered: told when at moves
}

// unwait forgets w. The caller holds mu.
func (l *Limits) unwait(w *limitsWaiter) {
	if i := slices.Index(l.waiters, w); i >= 0 {
		l.waiters = slices.Delete(l.waiters, i, i+1)
	}
}

// replan gives the waiters' turns again, in the order of their turns,
// after a settlement gave a window room back: the turns given while the
// requests in flight still counted at their estimate come sooner once
// their actual cost is known. It is done only when every waiter counts in
// windows only (a bucket's theoretical arrival time cannot give a turn
// back exactly) and every waiter's grant is found where it was given;
// otherwise nothing moves. Each waiter takes the first turn every limit
// allows again, as reserve would (no earlier than the key's hold), and is
// told when its turn moved. The caller holds mu.
func (l *Limits) replan(now time.Time) {
	var buf [32]*limitsWaiter
	ws := buf[:0]
	for _, w := range l.waiters {
		if !w.at.After(now) {
			continue // its turn has come: its waiter is on its way
		}
		for i := range l.limits {
			if w.cost.Of(l.limits[i].dim) > 0 && !l.limits[i].window {
				return
			}
		}
		ws = append(ws, w)
	}
	if len(ws) == 0 {
		return
	}
	slices.SortFunc(ws, func(a, b *limitsWaiter) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return cmp.Compare(a.seq, b.seq)
	})
	// Take every waiter's grant out, the last first, or none.
	for _, w := range ws {
		if !l.holdsGrantOf(w) {
			return
		}
	}
	for j := len(ws) - 1; j >= 0; j-- {
		w := ws[j]
		for i := range l.limits {
			if c := w.cost.Of(l.limits[i].dim); c > 0 {
				l.states[i].M[l.limits[i].key(w.key)].log.Remove(w.at, c)
			}
		}
	}
	for _, w := range ws {
		l.regrant(w, now)
	}
}

// regrant gives w, whose grant replan took out of its windows, the first
// turn every limit allows again, no earlier than the key's hold and no
// later than the turn it had, takes its grant at that turn, and tells w
// when its turn moved. The caller holds mu.
func (l *Limits) regrant(w *limitsWaiter, now time.Time) {
	at := now
	if d, _ := l.holds.remaining(w.key); d > 0 {
		at = now.Add(d)
	}
	for i := range l.limits {
		lim := &l.limits[i]
		if c := w.cost.Of(lim.dim); c > 0 {
			at = clock.Later(at, l.state(i, w.key, now).earliest(lim, c, now, l.margin))
		}
	}
	// Never later than the turn it had, which still fits: the turns
	// before it moved sooner or stayed. (Only a hold learnt after the
	// turn was given could ask for later, and a waiter keeps its turn
	// through such a hold, as it did before.)
	at = clock.Earlier(at, w.at)
	for i := range l.limits {
		if c := w.cost.Of(l.limits[i].dim); c > 0 {
			l.state(i, w.key, now).log.Insert(at, c) // a window: replan moves no bucket's turn
		}
	}
	if !at.Equal(w.at) {
		w.at = at
		select {
		case w.moved <- struct{}{}:
		default:
		}
	}
}

// holdsGrantOf reports whether every window w counts in holds its grant.
func (l *Limits) holdsGrantOf(w *limitsWaiter) bool {
	for i := range l.limits {
		c := w.cost.Of(l.limits[i].dim)
		if c == 0 {
			continue
		}
		st, ok := l.states[i].M[l.limits[i].key(w.key)]
		if !ok || st.log.Find(w.at, c) < 0 {
			return false
		}
	}
	return true
}

// reserve gives a request of cost the first turn, at or after now, at
// which every limit can grant its share, and takes it from all; it refuses,
// taking nothing, when that turn does not fit b.
func (l *Limits) reserve(key string, cost Cost, b budget) (Grant, time.Time, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reserveLocked(key, cost, b)
}

// reserveLocked is reserve; the caller holds mu. A grant whose turn has
// come is counted among the grants in flight (see openLocked).
func (l *Limits) reserveLocked(key string, cost Cost, b budget) (Grant, time.Time, error) {
	now := l.clock.Now()
	at, binding := now, -1
	if d, _ := l.holds.remaining(key); d > 0 {
		// The key is held: nothing goes before the hold ends. A refusal
		// states the turn the limits give after it, which a provider's
		// count (see Learn) may put later than the hold.
		at = now.Add(d)
	}
	var buf [4]*limitState
	states := buf[:0] // the states of the limits, nil where the cost is 0
	for i := range l.limits {
		lim := &l.limits[i]
		c := cost.Of(lim.dim)
		if c == 0 {
			states = append(states, nil)
			continue
		}
		if c > lim.n {
			return Grant{}, now, &LimitError{Key: key, Cost: c, Reason: ReasonCostTooHigh}
		}
		st := l.state(i, key, now)
		states = append(states, st)
		if t := st.earliest(lim, c, now, l.margin); t.After(at) {
			at, binding = t, i
		}
	}
	if at.After(now) {
		c := cost.Requests // the hold binds
		if binding >= 0 {
			c = cost.Of(l.limits[binding].dim)
		}
		if e := b.refuse(now, key, c, at.Sub(now)); e != nil {
			return Grant{}, now, e
		}
	}
	for i, st := range states {
		if st != nil {
			st.take(&l.limits[i], cost.Of(l.limits[i].dim), at)
			if !at.After(now) && st.settled.Track {
				st.open = append(st.open, window.OpenGrant{At: at, Cost: int32(cost.Of(l.limits[i].dim))})
			}
		}
	}
	return Grant{Key: key, Cost: cost, At: at}, now, nil
}

// state returns limit i's state for a request of key, made when missing.
func (l *Limits) state(i int, key string, now time.Time) *limitState {
	lim := &l.limits[i]
	k := lim.key(key)
	s, ok := l.states[i].Get(k, now)
	if !ok {
		s = &limitState{}
		if lim.window {
			s.log.W = lim.w + l.margin
		}
		l.states[i].Put(k, s)
	}
	if lim.window {
		s.log.Trim(now)
		s.open.Trim(now, s.log.W)
	}
	return s
}

// earliest returns the first turn at or after now at which the limit can
// grant c (≤ its burst or n).
func (s *limitState) earliest(lim *Limit, c int, now time.Time, margin time.Duration) time.Time {
	if lim.window {
		return s.log.Earliest(now, c, lim.n)
	}
	return s.bucket.Earliest(durationOf(lim.n-c, lim.rate), margin, now)
}

// take grants c at turn at, which earliest allowed.
func (s *limitState) take(lim *Limit, c int, at time.Time) {
	if lim.window {
		s.log.Add(at, c)
		return
	}
	s.bucket.Take(durationOf(c, lim.rate), at)
}

// refund gives a bucket back units of a grant whose turn was at (see
// gcra.Bucket.Refund).
func (s *limitState) refund(lim *Limit, units int, at, now time.Time) {
	s.bucket.Refund(durationOf(units, lim.rate), at, now)
}

// Settle charges or refunds each limit the difference between the cost g
// was granted and actual, the request's actual cost (a cancelled request
// settles at Cost{}: it takes nothing). A bucket refunds no further than
// full, and less what the turns given after g's took (see refund); a
// window counts the difference at g's turn, exactly, and forgets it once
// that turn has left the window. A charge is counted as at most the
// limit's burst or n. A grant settles once; settling a key the
// limits no longer hold (its turn long gone) does nothing.
//
// Each window learns from its settlements how its grants settle (see
// learnLocked), which decides whether WaitCost queues a request whose turn
// lies beyond its budget.
func (l *Limits) Settle(g Grant, actual Cost) {
	if g.At.IsZero() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	l.learnLocked(g, actual, now)
	if l.settleLocked(g, actual, now) && len(l.waiters) > 0 {
		l.replan(now)
	}
}

// settleLocked is Settle; it reports whether a window gave room back. The
// caller holds mu.
func (l *Limits) settleLocked(g Grant, actual Cost, now time.Time) (refunded bool) {
	if actual == g.Cost || g.At.IsZero() {
		return false
	}
	for i := range l.limits {
		lim := &l.limits[i]
		// A charge beyond the limit's whole capacity counts as that: one
		// response never parks the key for longer than the capacity takes
		// to come back.
		from, to := g.Cost.Of(lim.dim), min(max(actual.Of(lim.dim), 0), lim.n)
		if from == to {
			continue
		}
		s, ok := l.states[i].M[lim.key(g.Key)]
		if !ok && to > from {
			s, ok = l.state(i, g.Key, now), true // a dimension the grant did not count
		}
		if !ok {
			continue
		}
		switch {
		case lim.window:
			s.log.Trim(now) // a grant that has left the window is not adjusted
			switch {
			case from > 0 && s.log.Adjust(g.At, from, to):
				refunded = refunded || to < from
				if to == 0 && g.At.After(now) {
					s.log.Remove(g.At, 0) // a turn still to come, given back: replan gives the turns after it again
				}
			case to <= from:
				// a refund of a turn that has left the window: nothing to give back
			case g.At.Add(s.log.W).After(now) && from == 0:
				s.log.Insert(g.At, to) // a cost of 0 took no entry
			default:
				// Its turn has left the window (a stream longer than it): the
				// difference counts from now.
				s.log.Insert(now, to-from)
			}
		case to > from:
			// Charged as a grant of the difference now: a later refund
			// of an earlier grant counts it among the turns after.
			s.take(lim, to-from, now)
		default:
			s.refund(lim, from-to, g.At, now)
		}
	}
	return refunded
}

// Learn implements Learner. It holds the key as a Transport's own holds do
// (the README's "How egress learns a limit", without a rate to discover),
// and each count the response reports caps the room of the limits of its
// dimension: a limit of the key (or its parent) grants no more until its
// window moves on, or its bucket refills, than the provider said remains.
// For requests, the provider's remaining less the requests in flight
// (Signal.InFlight), which will spend it; for tokens, the remaining as
// reported. A window's cap ends at the provider's reset when it is sooner
// than the window's own end.
func (l *Limits) Learn(ctx context.Context, key string, s Signal) Decision {
	d := l.holds.Learn(ctx, key, s)
	if !s.capsLimits() {
		return d
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	for _, q := range s.Quotas {
		if !q.HasRemaining {
			continue
		}
		for i := range l.limits {
			if lim := &l.limits[i]; lim.dim == q.Dimension {
				l.state(i, key, now).cap(lim, q.keep(&s), q, now)
			}
		}
	}
	return d
}

// capsLimits reports whether s's counts cap a Limits' room: a success's or
// a throttle's, when it has any.
func (s *Signal) capsLimits() bool {
	return len(s.Quotas) > 0 && (s.throttled() || s.Status/100 == 2)
}

// keep is the room a count leaves the limits of its dimension: for
// requests, the provider's remaining less the requests in flight, which
// will spend it; for the others, the remaining as reported. Never below 0.
func (q *Quota) keep(s *Signal) float64 {
	k := q.Remaining
	if q.Dimension == Requests {
		k -= float64(s.InFlight)
	}
	return max(k, 0)
}

// capParts is how many parts a bucket provider's excess leaves in.
const capParts = 8

// cap lowers the limit's room at now to keep units, when it has more: a
// bucket owes what it has above keep; a window takes a grant of the excess
// that leaves it at the provider's reset, or with the window.
func (s *limitState) cap(lim *Limit, keep float64, q Quota, now time.Time) {
	if !(keep < float64(lim.n)) {
		return // room for the whole limit (or a count too large to read)
	}
	if lim.window {
		reset := s.log.W
		if q.HasReset && q.Reset < reset {
			reset = q.Reset
		}
		// Room that grants leaving before the provider's reset would give
		// back: a window provider gives nothing back before it, so the
		// excess counts only the grants that stay past it. A bucket
		// provider gives back as it refills, as the grants leave.
		held := s.log.Sum
		if q.Kind != ResetKindBucket {
			held = s.log.Staying(now.Add(reset))
		}
		excess := lim.n - held - int(math.Ceil(keep))
		if excess <= 0 {
			return
		}
		// A bucket provider gives its units back as it refills, not all
		// at its reset: the excess leaves in parts, evenly until then.
		parts := 1
		if q.Kind == ResetKindBucket {
			parts = min(capParts, excess)
		}
		for i := 1; i <= parts; i++ {
			n := excess*i/parts - excess*(i-1)/parts
			s.log.Insert(now.Add(reset*time.Duration(i)/time.Duration(parts)-s.log.W), n)
		}
		return
	}
	// The bucket holds burst − (tat − now)/I units; keep at most keep.
	s.bucket.Cap(durationOf(lim.n-int(math.Floor(keep)), lim.rate), now)
}
