package egress

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/egress-go/egress/internal/argv"
	"github.com/egress-go/egress/internal/caller"
	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/keyed"
	"github.com/egress-go/egress/internal/keyspace"
	"github.com/egress-go/egress/internal/lua"
	"github.com/egress-go/egress/internal/window"
)

// SharedLimits is Limits for a whole fleet: every instance that uses the
// same Redis and the same name draws from the same limits, all or nothing,
// with the same arithmetic (a bucket's theoretical arrival time, a
// window's exact log of grants) run by one Lua script on the Redis
// server's clock. A decision across every limit of a request — its key's
// and its parents' — is one script call, and the concurrent waiters of a
// key in one process share a call.
//
// A request refused takes nothing from any limit. A waiter whose context
// ends after it was given a turn, or whose turn falls inside a hold heard
// of afterwards, gives its grant back with one more call (a settlement to
// zero). Settle settles a grant fleet-wide, with one call. When every
// limit is a window and none is a parent's, a settlement that gives room
// back gives the turns still to come again, sooner, fleet-wide (see
// WaitCost).
//
// In Redis, a key's hash tag keeps a counter of grant ids; a bucket keeps
// a hash (its tat and last turn) per key; a window keeps a hash (its sum)
// and a sorted set with one member (about 60 bytes) per grant still in the
// window, so a window of 1,000 per hour used to its limit holds about
// 60 KB per key. Every key has a TTL that ends once its state is at rest.
//
// Redis Cluster: every key that one decision touches carries the hash tag
// of the request's top key — the parent key of the first limit that has a
// Parent, or else the request's own key — so that the routes of one host
// share that host's slot (and its parent limits' state), while different
// hosts spread over the Cluster. A parent limit's state is therefore kept
// per top key: a limit whose parent spans several top keys (an account
// above several hosts, listed after a HostOf limit) is enforced per top
// key, not across them. Give every parent limit the same Parent function;
// for an account above several hosts, key the requests by the account.
//
// It is a Learner as Limits is: a hold is kept in Redis and told to the
// fleet (a waiter whose turn it covers takes a new one after it), and a
// provider's count in a dimension caps that dimension's limits fleet-wide.
// For requests, the count less the requests this process has in flight:
// the fleet's other instances' requests in flight are not known.
//
// When Redis fails or is slow (see WithCommandTimeout), the limiter falls
// back to a local Limits at the instance's share of each limit (a bucket's
// rate and a window's n divided by the live instances, learnt from the
// fleet's heartbeats; a bucket keeps its burst; a window's n is kept at
// least the largest cost asked for, its window stretched to keep the
// share's average), and returns once Redis answers again; grants made by
// the fallback settle there. A settlement that cannot reach Redis is lost:
// the grant counts at its estimate. Call Close when done. A SharedLimits
// is safe for simultaneous use by multiple goroutines.
type SharedLimits struct {
	limits  []Limit
	fleet   *shared // heartbeats, the fallback, holds heard on the channel
	script  *redis.Script
	holds   *holds         // the decisions, made as Limits makes them
	margin  time.Duration  // added to each window's length
	groups  []limitsLimit  // the limits' groups of the script's ARGV, the same for every call
	stop    chan struct{}  // closed by Close: the leads stop holding back
	largest []atomic.Int64 // per limit: the largest cost asked for, which the fallback keeps grantable
	settled settling       // how this process's grants have settled (sharedlimits_expect.go)
	work    sync.WaitGroup // leads, give-backs and cancelled waiters' watchers

	replan  bool // every limit a window, none a parent's: the script gives turns again on a refund
	mu      sync.Mutex
	closed  bool                     // guarded by mu; no work starts once set
	lanes   keyed.Map[*limitsLane]   // guarded by mu; coalescing per request key
	waiting map[string]*sharedWaiter // guarded by mu; by "<key id>:<grant id>"
}

// sharedWaiter is a request of this process waiting for its turn, which
// the script may move sooner (see replan in limits.lua).
type sharedWaiter struct {
	moved chan movedTurn // buffered: the latest move
}

// movedTurn is a waiter's new turn: on the server's clock, and when it is
// due on this process's.
type movedTurn struct {
	turn int64
	due  time.Time
}

// NewSharedLimits returns limits enforced together for the whole fleet,
// named name in rdb (a plain, failover or cluster client). See NewLimits
// for the limits and NewSharedTokenBucket for the name, the options and
// the errors; WithTransitMargin sets the limits' margin (default 5 ms),
// and WithFallbackRate and WithAdaptive do not apply (each limit falls
// back to its own share; Limits discovers nothing). It does not contact
// Redis.
func NewSharedLimits(rdb redis.UniversalClient, name string, limits []Limit, opts ...LimiterOption) (*SharedLimits, error) {
	const op = "NewSharedLimits"
	if err := validateLimits(op, limits); err != nil {
		return nil, err
	}
	// The fleet machinery shares a rate; a SharedLimits has one per limit.
	// Its reference rate is 1/s, so that the share the fallback is given
	// (the reference over the live instances) is the fraction of each limit.
	s, err := newShared(op, rdb, name, Per(1, time.Second), opts)
	if err != nil {
		return nil, err
	}
	if s.cfg.fallbackRate != (Rate{}) {
		return nil, configError(op+": WithFallbackRate", s.cfg.fallbackRate, "does not apply: each limit falls back to its share of the fleet")
	}
	if s.cfg.learn.policy != nil {
		return nil, configError(op+": WithAdaptive", *s.cfg.learn.policy, "does not apply: a SharedLimits discovers no rate")
	}
	l := &SharedLimits{
		limits:  slices.Clone(limits),
		fleet:   s,
		script:  redis.NewScript(lua.Limits),
		margin:  jitterTolerance,
		lanes:   keyed.New[*limitsLane](),
		stop:    make(chan struct{}),
		waiting: make(map[string]*sharedWaiter),
		largest: make([]atomic.Int64, len(limits)),
	}
	l.settled.stats = make([]window.Settling, len(limits))
	l.replan = true
	for _, lim := range limits {
		l.replan = l.replan && lim.window && lim.parent == nil
	}
	if m := s.cfg.learn.margin; m != nil {
		l.margin = *m
	}
	l.holds = newHolds(&s.clock)
	l.groups = make([]limitsLimit, len(l.limits))
	for i := range l.limits {
		l.groups[i] = limitGroup(&l.limits[i], l.margin)
	}
	s.shape = "lm"
	s.local = func(share Rate) Limiter { return l.fallbackLimits(share.PerSecond()) }
	s.onMoved = l.moved
	s.start()
	return l, nil
}

// fallbackLimits returns the local limits at fraction f of each limit: a
// bucket at f of its rate with its whole burst (every cost granted in
// shared mode is still granted), a window at f of its n, but no less than
// the largest cost it has been asked for (a request as large as those
// before it still goes, over a longer time).
func (l *SharedLimits) fallbackLimits(f float64) *Limits {
	local := make([]Limit, len(l.limits))
	for i, lim := range l.limits {
		if lim.window {
			share := max(1, int(float64(lim.n)*f))
			if big := int(l.largest[i].Load()); big > share {
				// The share's average over a window stretched to hold it.
				lim.w = time.Duration(float64(lim.w) * float64(big) / float64(share))
				share = big
			}
			lim.n = share
		} else {
			lim.rate = Rate{n: lim.rate.n * f, per: lim.rate.per}
		}
		local[i] = lim
	}
	fb, _ := NewLimits(local...) // valid: the limits were, scaled down
	fb.margin = l.margin
	fb.clock = l.fleet.clock
	return fb
}

// replanHoldBack is the longest a lead keeps new waiters back when
// refunds move the turns (see lead): long enough to gather the waiters of
// a key asked a hundred times a second or more in one call. (Held back a
// fifth of the way to turns taken beyond a budget, 8 s ahead, a request
// with a 10 s deadline reached Redis 1.6 s after it arrived, behind those
// that came meanwhile.)
const replanHoldBack = 10 * time.Millisecond

// limitsLane is the coalescing state of one request key: its Redis keys,
// and the waiters queued for a call. Guarded by the limiter's mu.
type limitsLane struct {
	keys    []string
	channel string // the key's announcements' (see SharedLimits.channel)
	queue   []*limitsPending
	leading bool
	held    time.Time     // the latest turn this process holds
	called  time.Time     // when the last call returned
	rtt     time.Duration // the last call's round trip
	due     time.Time     // when the lead means to call next; zero while it calls
	wake    chan struct{} // buffered: a waiter that cannot wait until due
}

func (ln *limitsLane) AtRest(now time.Time) bool {
	return !ln.leading && len(ln.queue) == 0 && !ln.held.After(now)
}

// limitsPending is one waiter's request.
type limitsPending struct {
	gone  bool // its waiter left before the call; guarded by mu
	cost  Cost
	limit time.Time // the latest turn it accepts; zero for none
	turn  fleetTurn // its place in the fleet's priority order and shares
	res   chan limitsReply
}

// limitsReply is what the script said of one request.
type limitsReply struct {
	refused bool
	held    bool          // held back by the fleet's order or shares: to come back after wait
	wait    time.Duration // from the reply until the turn
	turn    int64         // admitted: the turn, us of the server's clock
	gid     int64         // admitted: the grant's id
	binding int           // refused: the limit that bound (1-based; 0 the hold)
	at      time.Time     // when the reply came
	err     error
}

// topID returns the id of key's top key: its parent's, when a limit has
// one (see SharedLimits), else its own.
func (l *SharedLimits) topID(key string) string {
	for i := range l.limits {
		if l.limits[i].parent != nil {
			return keyspace.ID(l.limits[i].parent(key))
		}
	}
	return keyspace.ID(key)
}

// channel returns the channel of key's announcements: its top key's, in
// the slot of the keys its decisions touch (see internal/announce).
func (l *SharedLimits) channel(key string) string { return l.fleet.keyChannel(l.topID(key)) }

// redisKeys returns the keys one decision for key touches: the key's hold,
// each limit's state and grants, and the counter of grant ids. They share
// the hash tag of the top key (see SharedLimits).
func (l *SharedLimits) redisKeys(key string) []string {
	tag := keyspace.Tag(l.fleet.name, l.topID(key)) + "lm:"
	keys := make([]string, 1, 4+2*len(l.limits))
	keys[0] = tag + "hold:" + keyspace.ID(key)
	for i := range l.limits {
		k := tag + strconv.Itoa(i) + ":" + keyspace.ID(l.limits[i].key(key))
		keys = append(keys, k, k+":g")
	}
	// Last, the order and shares of the top key (its requests, of every
	// key under it, meet at its limit), which a reservation is given only
	// when a request of it is ordered (see run).
	return append(keys, tag+"gid", tag+"order", tag+"shares")
}

// ordersFleet marks SharedLimits as keeping the fleet's priority order
// (see fleetTurn).
func (*SharedLimits) ordersFleet() {}

// Wait implements Limiter: cost is in requests.
func (l *SharedLimits) Wait(ctx context.Context, key string, cost int, maxWait time.Duration) (time.Duration, error) {
	g, err := l.WaitCost(ctx, key, Cost{Requests: cost}, maxWait)
	return g.Waited, err
}

// WaitCost implements CostLimiter for the fleet: see Limits.WaitCost. When
// every limit is a window and none is a parent's, a settlement that gives
// room back gives the fleet's waiters their turns again, sooner, as a
// Limits does (the script tells the moves on the channel), and a request
// whose turn lies beyond its budget waits when the refunds expected bring
// it within (see sharedlimits_expect.go); otherwise a turn once given
// stays.
func (l *SharedLimits) WaitCost(ctx context.Context, key string, cost Cost, maxWait time.Duration) (Grant, error) {
	if err := l.check(key, cost); err != nil {
		return Grant{}, err
	}
	if err := ctx.Err(); err != nil {
		return Grant{}, err
	}
	s := l.fleet
	start := s.clock.Now()
	for {
		if fb := s.fallback.Load(); fb != nil {
			if s.cfg.failClosed {
				return Grant{}, fmt.Errorf("%w: %s", ErrSharedUnavailable, s.name)
			}
			waited := s.clock.Now().Sub(start)
			local := fb.limiter.(*Limits)
			g, err := local.WaitCost(ctx, key, cost, remaining(maxWait, waited))
			g.Waited += waited
			g.local = local
			return g, err
		}
		g, again, err := l.take(ctx, key, cost, maxWait, start)
		if !again {
			return g, err
		}
	}
}

// check refuses a cost no limit can grant, and notes each limit's largest
// cost asked for (see fallbackLimits).
func (l *SharedLimits) check(key string, cost Cost) error {
	if err := cost.check(key); err != nil {
		return err
	}
	for i := range l.limits {
		c := cost.Of(l.limits[i].dim)
		if c > l.limits[i].n {
			return &LimitError{Key: key, Cost: c, Reason: ReasonCostTooHigh}
		}
		for big := l.largest[i].Load(); int64(c) > big && !l.largest[i].CompareAndSwap(big, int64(c)); big = l.largest[i].Load() {
		}
	}
	return nil
}

// take reserves a turn of cost for key in Redis and waits for it, for a
// request that began at start; again reports that the caller should try
// once more: Redis failed (the fallback is next), a hold heard after the
// turn was given covers it (given back, the script knows of the hold), or
// the fleet's order held it back until now.
func (l *SharedLimits) take(ctx context.Context, key string, cost Cost, maxWait time.Duration, start time.Time) (g Grant, again bool, err error) {
	s := l.fleet
	reservedAt := s.clock.Now()
	b := waitBudget(ctx, remaining(maxWait, reservedAt.Sub(start)))
	rep := l.reserve(ctx, key, cost, b, reservedAt)
	var end time.Time // when a turn taken beyond b is given back; zero for none
	if rep.err == nil && rep.refused {
		wait, late := l.expectation(ctx, key, cost, rep, b, reservedAt)
		if !late {
			return Grant{}, false, b.refuseWith(key, l.bindingCost(cost, rep.binding), wait, s.clock.Now())
		}
		end = b.end(reservedAt, true)
		rep = l.reserve(ctx, key, cost, budget{}, s.clock.Now()) // the real turn, beyond b
	}
	if rep.err == nil && rep.held {
		// Held back by the fleet's priority order or tenants' shares (see
		// fleetTurn): its turn, were it taken now, is within b (the
		// script refuses one that is not); it asks again then.
		if err := sleepOr(ctx, s.clock, rep.at.Add(rep.wait).Sub(s.clock.Now()), nil); err != nil {
			return Grant{}, false, err
		}
		return Grant{}, true, nil
	}
	switch {
	case rep.err != nil && ctx.Err() != nil:
		return Grant{}, false, ctx.Err()
	case errors.Is(rep.err, ErrSharedUnavailable):
		return Grant{}, false, rep.err // closed
	case rep.err != nil:
		s.failed(rep.err)
		return Grant{}, true, nil // to the fallback
	case rep.refused:
		return Grant{}, false, b.refuseWith(key, l.bindingCost(cost, rep.binding), rep.wait, s.clock.Now())
	}
	id := keyspace.ID(key)
	g = Grant{Key: key, Cost: cost, At: rep.at.Add(rep.wait), turn: rep.turn}
	if err := l.sleep(ctx, id, rep.gid, &g, end); err != nil {
		l.giveBack(g)
		if errors.Is(err, errGaveUp) {
			// The refunds did not bring the turn within b: the wait it
			// still needs, from when it was asked for.
			now := s.clock.Now()
			return Grant{}, false, b.refuseAt(reservedAt, key, l.bindingCost(cost, rep.binding), clock.Later(g.At, now).Sub(reservedAt))
		}
		return Grant{}, false, err
	}
	if s.pausedSince(id, reservedAt) {
		l.giveBack(g)
		return Grant{}, true, nil
	}
	g.Waited = s.clock.Now().Sub(start)
	return g, false, nil
}

// bindingCost returns the cost a refusal by limit binding (1-based; 0 the
// key's hold) states.
func (l *SharedLimits) bindingCost(cost Cost, binding int) int {
	if i := binding - 1; i >= 0 && i < len(l.limits) {
		return cost.Of(l.limits[i].dim)
	}
	return cost.Requests
}

// errGaveUp is sleep's error for a turn that end came before.
var errGaveUp = errors.New("egress: the turn did not come before the budget's end")

// sleep waits for g's turn, which a refund elsewhere in the fleet may move
// sooner (the script tells the moves on the channel; see moved), and
// returns errGaveUp if end (unless zero) comes first.
func (l *SharedLimits) sleep(ctx context.Context, id string, gid int64, g *Grant, end time.Time) error {
	clk := l.fleet.clock
	if !g.At.After(clk.Now()) {
		return nil
	}
	if !l.replan {
		return sleep(ctx, clk, g.At.Sub(clk.Now()))
	}
	name := id + ":" + strconv.FormatInt(gid, 10)
	w := &sharedWaiter{moved: make(chan movedTurn, 1)}
	l.mu.Lock()
	l.waiting[name] = w
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.waiting, name)
		l.mu.Unlock()
	}()
	for {
		until := g.At
		if !end.IsZero() && end.Before(until) {
			until = end
		}
		d := until.Sub(clk.Now())
		if d <= 0 {
			if until.Before(g.At) {
				return errGaveUp
			}
			return nil
		}
		t := clk.NewTimer(d)
		select {
		case <-t.C():
		case m := <-w.moved:
			t.Stop()
			if m.turn < g.turn {
				g.At, g.turn = m.due, m.turn
			}
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// moved hears the turns a settlement moved: "<now> <grant id>:<turn> ..."
// (us of the server's clock) for the key of id.
func (l *SharedLimits) moved(id, payload string) {
	now := l.fleet.clock.Now()
	fields := strings.Fields(payload)
	if len(fields) < 2 {
		return
	}
	server, err := strconv.ParseInt(fields[0], 10, 64)
	if err != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, f := range fields[1:] {
		gid, turn, ok := strings.Cut(f, ":")
		w, found := l.waiting[id+":"+gid]
		if !ok || !found {
			continue
		}
		t, err := strconv.ParseInt(turn, 10, 64)
		if err != nil || t < server-int64(time.Hour/time.Microsecond) {
			continue
		}
		m := movedTurn{turn: t, due: now.Add(time.Duration(t-server) * time.Microsecond)}
		select {
		case <-w.moved: // replaced by the latest
		default:
		}
		w.moved <- m
	}
}

// giveBack settles g at nothing in the background: its waiter has gone.
func (l *SharedLimits) giveBack(g Grant) {
	l.goWork(func() { l.Settle(g, Cost{}) })
}

// goWork runs f on a goroutine that Close waits for; once closed, it runs
// nothing (a grant not given back makes the fleet send less, never more).
func (l *SharedLimits) goWork(f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.work.Add(1)
	go func() {
		defer l.work.Done()
		f()
	}()
}

// closedErr is the error of a request made of a closed limiter.
func (l *SharedLimits) closedErr() error {
	return fmt.Errorf("%w: %s: closed", ErrSharedUnavailable, l.fleet.name)
}

// reserve asks Redis for a turn of cost on key, within b, in the key's
// next call. A waiter whose context ends leaves at once; if its request
// was already sent, its grant is given back.
func (l *SharedLimits) reserve(ctx context.Context, key string, cost Cost, b budget, now time.Time) limitsReply {
	p := &limitsPending{cost: cost, limit: b.deadline, turn: fleetTurnOf(ctx), res: make(chan limitsReply, 1)}
	if b.maxWait > 0 && (p.limit.IsZero() || now.Add(b.maxWait).Before(p.limit)) {
		p.limit = now.Add(b.maxWait)
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return limitsReply{err: l.closedErr()}
	}
	ln, ok := l.lanes.Get(key, now)
	if !ok {
		ln = &limitsLane{keys: l.redisKeys(key), channel: l.channel(key), wake: make(chan struct{}, 1)}
		l.lanes.Put(key, ln)
	}
	ln.queue = append(ln.queue, p)
	switch {
	case !ln.leading:
		ln.leading = true
		l.work.Add(1)
		go l.lead(key, ln)
	case !p.limit.IsZero() && !ln.due.IsZero() && p.limit.Before(ln.due.Add(2*ln.rtt+time.Millisecond)):
		// The lead is holding back longer than this waiter can wait.
		select {
		case ln.wake <- struct{}{}:
		default:
		}
	}
	channel := ln.channel
	l.mu.Unlock()
	l.fleet.ann.Want(channel, now)
	select {
	case r := <-p.res:
		return r
	case <-ctx.Done():
		l.mu.Lock()
		p.gone = true
		l.mu.Unlock()
		// A call may already carry it: its turn, if given, goes back.
		l.goWork(func() {
			if r := <-p.res; r.err == nil && !r.refused && r.turn != 0 {
				l.Settle(Grant{Key: key, Cost: cost, turn: r.turn}, Cost{})
			}
		})
		return limitsReply{err: ctx.Err()}
	}
}

// lead runs the script calls of key until its queue is empty: the waiters
// that arrive during a call go together in the next. While this process
// holds turns in the future, the lead keeps new waiters back for a fifth
// of the way from its last call to the last turn it holds, as a shared
// token bucket's lead does (see coalesceShare), so that one call serves
// the waiters that arrive meanwhile.
func (l *SharedLimits) lead(key string, ln *limitsLane) {
	defer l.work.Done()
	s := l.fleet
	for {
		due := l.nextCall(ln)
		if d := due.Sub(s.clock.Now()); d > 0 {
			t := s.clock.NewTimer(d)
			select {
			case <-t.C():
			case <-ln.wake:
				t.Stop()
				continue // due again, with the new waiter's limit
			case <-l.stop:
				// Closed: the waiters still queued go back to their
				// callers rather than wait for a call that will not come.
				t.Stop()
				l.mu.Lock()
				queue := ln.queue
				ln.queue, ln.leading, ln.due = nil, false, time.Time{}
				l.mu.Unlock()
				for _, p := range queue {
					p.res <- limitsReply{err: l.closedErr()}
				}
				return
			}
		}
		l.mu.Lock()
		ln.due = time.Time{}
		var batch []*limitsPending
		taken := 0
		for _, p := range ln.queue {
			if len(batch) == maxBatch {
				break
			}
			taken++
			if !p.gone {
				batch = append(batch, p)
			} else {
				close(p.res) // its waiter left before the call: nothing to give back
			}
		}
		ln.queue = slices.Delete(ln.queue, 0, taken)
		if len(batch) == 0 && len(ln.queue) == 0 {
			ln.leading = false
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		l.callBatch(ln, batch)
	}
}

// nextCall returns when the lead of ln makes its next call, and notes it
// in ln.due (see reserve): a fifth of the way from its last call to the
// last turn it holds (at most replanHoldBack after that call when refunds
// move the turns), and no later than the first queued waiter's latest
// turn allows. It takes l.mu.
func (l *SharedLimits) nextCall(ln *limitsLane) time.Time {
	l.mu.Lock()
	back := ln.held.Sub(ln.called) / coalesceShare
	if l.replan {
		// The turns held move sooner with every refund: the last of
		// them says little of when the next call is worth making.
		back = min(back, replanHoldBack)
	}
	due := ln.called.Add(back)
	// No later than the first queued waiter's latest turn allows.
	for _, p := range ln.queue {
		if !p.gone && !p.limit.IsZero() {
			due = clock.Earlier(due, p.limit.Add(-2*ln.rtt-time.Millisecond))
		}
	}
	ln.due = due
	l.mu.Unlock()
	return due
}

// callBatch makes the reservation call for batch, the waiters the lead of
// ln took from its queue, notes the call and the latest turn it gave this
// process, and then gives each waiter its reply, or the call's error.
func (l *SharedLimits) callBatch(ln *limitsLane, batch []*limitsPending) {
	start := l.fleet.clock.Now()
	replies, err := l.run(ln.keys, batch)
	l.mu.Lock()
	if err == nil {
		ln.called, ln.rtt = replies[0].at, replies[0].at.Sub(start)
		for _, r := range replies {
			if !r.refused && !r.held {
				ln.held = clock.Later(ln.held, r.at.Add(r.wait))
			}
		}
	}
	l.mu.Unlock()
	for i, p := range batch {
		if err != nil {
			p.res <- limitsReply{err: err}
		} else {
			p.res <- replies[i]
		}
	}
}

// run makes one reservation call for batch.
func (l *SharedLimits) run(keys []string, batch []*limitsPending) ([]limitsReply, error) {
	s := l.fleet
	// Without priorities the requests go without their place in the
	// fleet's order: the script then skips it (horizon 0).
	ordered := slices.ContainsFunc(batch, func(p *limitsPending) bool { return p.turn.share > 0 })
	horizon := int64(0)
	if ordered {
		horizon = argv.Micros(fleetHorizon)
	} else {
		keys = keys[:len(keys)-2] // the order's and the shares' (see redisKeys)
	}
	args := limitsReserveArgs(l.groups, horizon, l.requests(batch, ordered, s.clock.Now()))
	s.roundTrips.Add(1)
	var reply any
	err := s.calls.Do(context.Background(), func(ctx context.Context) error {
		var err error
		reply, err = caller.Run(ctx, s.rdb, s.clock, l.script, keys, args...).Result()
		return err
	})
	at := s.clock.Now()
	if err != nil {
		return nil, fmt.Errorf("egress: shared limiter %s: %w", s.name, err)
	}
	rep, err := parseReserved(reply, len(batch), at)
	if err != nil {
		return nil, fmt.Errorf("egress: shared limiter %s: %w", s.name, err)
	}
	for _, r := range rep.requests {
		if !r.refused && !r.held {
			s.admitted.Add(1)
		}
	}
	return rep.requests, nil
}

// requests returns the groups of batch's requests for a reservation at
// now: with their places in the fleet's order when ordered.
func (l *SharedLimits) requests(batch []*limitsPending, ordered bool, now time.Time) []limitsRequest {
	n := len(l.limits)
	costs := make([]int, len(batch)*n)
	reqs := make([]limitsRequest, len(batch))
	for j, p := range batch {
		r := &reqs[j]
		r.costs = costs[j*n : (j+1)*n : (j+1)*n]
		for i := range l.limits {
			r.costs[i] = p.cost.Of(l.limits[i].dim)
		}
		r.maxWait = maxWaitArg(p.limit, now)
		if ordered {
			ft := &p.turn
			r.level, r.share, r.tenant, r.weight = ft.level, ft.share, ft.tenant, ft.weight
			r.work = limitsWork(l.limits, &p.cost) * 1e6
		}
	}
	return reqs
}

// Settle implements CostLimiter for the fleet: see Limits.Settle. It makes
// one call, bounded by the command timeout; a grant the fallback made
// settles there, and nothing is sent while Redis is unreachable.
func (l *SharedLimits) Settle(g Grant, actual Cost) {
	if g.turn != 0 && g.local == nil {
		l.settled.learn(l.limits, g, actual, l.fleet.clock.Now())
	}
	if actual == g.Cost || g.turn == 0 && g.local == nil {
		return
	}
	if g.local != nil {
		g.local.Settle(g, actual)
		return
	}
	s := l.fleet
	if s.fallback.Load() != nil {
		return
	}
	a := limitsSettle{turn: g.turn, costs: make([]limitsSettled, len(l.limits))}
	changed := false
	for i := range l.limits {
		lim := &l.limits[i]
		from, to := g.Cost.Of(lim.dim), min(max(actual.Of(lim.dim), 0), lim.n)
		changed = changed || from != to
		a.costs[i] = limitsSettled{from: from, to: to}
	}
	if !changed {
		return
	}
	a.replan, a.channel, a.id = argv.Flag(l.replan), l.channel(g.Key), keyspace.ID(g.Key)
	args := limitsSettleArgs(l.groups, &a)
	_ = s.calls.Do(context.Background(), func(ctx context.Context) error {
		return caller.Run(ctx, s.rdb, s.clock, l.script, l.redisKeys(g.Key), args...).Err()
	})
}

// Learn implements Learner for the fleet: see Limits.Learn. A hold is set
// in Redis and told to the fleet; the counts cap the limits in Redis; one
// call for both, none when the response holds nothing and counts nothing.
func (l *SharedLimits) Learn(ctx context.Context, key string, sig Signal) Decision {
	d := l.holds.Learn(ctx, key, sig)
	s := l.fleet
	if fb := s.fallback.Load(); fb != nil {
		fb.limiter.(*Limits).Learn(ctx, key, sig)
		return d
	}
	now := s.clock.Now()
	var holdFor int64
	if d.Hold.After(now) {
		holdFor = argv.Micros(d.Hold.Sub(now))
	}
	caps, capped := l.caps(&sig)
	if holdFor == 0 && !capped {
		return d
	}
	id := keyspace.ID(key)
	if holdFor > 0 {
		s.heard(id, pauseMark{until: d.Hold, heard: now}) // this process's waiters need not wait for the channel
	}
	args := limitsLearnArgs(l.groups, &limitsLearn{hold: holdFor, channel: l.channel(key), id: id, caps: caps})
	err := s.calls.Do(context.Background(), func(ctx context.Context) error {
		return caller.Run(ctx, s.rdb, s.clock, l.script, l.redisKeys(key), args...).Err()
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		s.failed(err)
	}
	return d
}

// caps returns what sig says of each limit's dimension, as the script
// caps the limit (the least that any quota of it keeps; -1 for nothing
// said, or nothing below n), and whether it caps any.
func (l *SharedLimits) caps(sig *Signal) ([]limitsCap, bool) {
	caps := make([]limitsCap, len(l.limits))
	capped := false
	counts := sig.capsLimits()
	for i := range l.limits {
		c := limitsCap{keep: -1, reset: -1}
		for _, q := range sig.Quotas {
			if !counts || !q.HasRemaining || q.Dimension != l.limits[i].dim {
				continue
			}
			if k := q.keep(sig); c.keep < 0 || k < c.keep {
				c = limitsCap{keep: k, reset: -1} // -1: no reset
				if q.HasReset {
					c.reset = max(argv.Micros(q.Reset), 0)
				}
				if q.Kind == ResetKindBucket {
					c.bucket = 1
				}
			}
		}
		if c.keep >= 0 && c.keep < float64(l.limits[i].n) {
			capped = true
		} else {
			c.keep = -1
		}
		c.keep = math.Floor(c.keep*1000) / 1000
		caps[i] = c
	}
	return caps, capped
}

// Stats returns the limiter's counters.
func (l *SharedLimits) Stats() SharedStats { return l.fleet.Stats() }

// Close stops the limiter: the waiters queued for a call return an error
// matching ErrSharedUnavailable, the calls under way and the grants being
// given back finish (each within the command timeout), and then the
// background goroutine stops and the instance leaves the fleet's count
// (see SharedTokenBucket.Close). Grants whose waiters leave after Close
// are not given back: the fleet sends less, never more.
func (l *SharedLimits) Close() error {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.stop)
	}
	l.mu.Unlock()
	l.work.Wait()
	return l.fleet.Close()
}
