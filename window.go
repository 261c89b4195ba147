package egress

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/egress-go/egress/internal/clock"
)

// WindowLimit is a local sliding-window limit per key: at most n cost units
// in any window of length w, exactly. It is how a provider's "1,000 per
// hour" is used in full without ever being exceeded: a token bucket of the
// same average (1000/h, burst B) admits up to 1000 + B in an hour, and one
// with a burst of 1 spaces the requests 3.6 s apart; a WindowLimit sends
// the first 1,000 at once and then each as the one an hour before it
// leaves the window.
//
// A request of cost c goes when the units granted in the window ending at
// its turn, plus c, are at most n. Turns are taken in order of arrival: a
// request waits behind those that came before it, and one whose context
// ends, or whose wait would not fit its deadline or the maximum wait, takes
// nothing (those behind it keep the turns they were given, which stay
// within the limit).
//
// Memory: the limit keeps, per key, one entry (28 bytes) per grant still in
// the window: at most n entries, so 28·n bytes for a key used to its limit
// (28 KB for 1,000 per hour); a key's state is dropped once its last grant
// has left the window. A cost above n fails at once with ErrCostTooHigh.
//
// A WindowLimit is not a Learner: a Transport keeps the holds the provider
// asks for itself (see Learner). It is safe for simultaneous use by
// multiple goroutines.
type WindowLimit struct {
	n     int
	w     time.Duration
	clock clock.Clock

	mu   sync.Mutex
	logs keyed[*grantLog] // guarded by mu
}

// grantLog is one key's grants still in the window, in time order (the
// last ones may be in the future: turns given to waiters). Guarded by the
// limit's mu.
type grantLog struct {
	at    []time.Time
	cost  []int32
	sum   int           // the costs in the log
	first int           // at[:first] are gone (trimmed lazily)
	w     time.Duration // the window, to tell when the log is at rest
}

func (g *grantLog) atRest(now time.Time) bool {
	return g.first == len(g.at) || !g.at[len(g.at)-1].Add(g.w).After(now)
}

// NewWindowLimit returns a sliding-window limit of n cost units in any
// window w per key. n must be at least 1 and w positive.
func NewWindowLimit(n int, w time.Duration) (*WindowLimit, error) {
	const op = "NewWindowLimit"
	if n < 1 || n > math.MaxInt32 {
		return nil, configError(op+": n", n, "must be from 1 to 2147483647")
	}
	if w <= 0 {
		return nil, configError(op+": window", w, "must be positive")
	}
	return &WindowLimit{n: n, w: w, clock: clock.Real{}, logs: newKeyed[*grantLog]()}, nil
}

// Rate returns the limit's average rate, n per w.
func (l *WindowLimit) Rate() Rate { return Per(float64(l.n), l.w) }

// Wait implements Limiter.
func (l *WindowLimit) Wait(ctx context.Context, key string, cost int, maxWait time.Duration) (time.Duration, error) {
	if err := checkCost(key, cost, l.n); err != nil || cost == 0 {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	at, now, err := l.reserve(key, cost, waitBudget(ctx, maxWait))
	if err != nil {
		return 0, err
	}
	d := at.Sub(now)
	if d <= 0 {
		return 0, nil
	}
	if err := sleep(ctx, l.clock, d); err != nil {
		l.cancel(key, at, cost)
		return 0, err
	}
	return d, nil
}

// reserve gives a request of cost the first turn, at or after now and
// after every turn given before, at which the window ending there holds at
// most n − cost; it refuses, taking nothing, when that turn does not fit b.
func (l *WindowLimit) reserve(key string, cost int, b budget) (at, now time.Time, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now = l.clock.Now()
	g, ok := l.logs.get(key, now)
	if !ok {
		g = &grantLog{w: l.w}
		l.logs.put(key, g)
	}
	g.trim(now)
	at = g.earliest(now, cost, l.n)
	if e := b.refuse(now, key, cost, at.Sub(now)); e != nil {
		return time.Time{}, now, e
	}
	g.add(at, cost)
	return at, now, nil
}

// earliest returns the first turn, at or after from and after every turn
// given before, at which the window ending there holds at most n − cost.
func (g *grantLog) earliest(from time.Time, cost, n int) time.Time {
	at := from
	if len(g.at) > g.first {
		at = maxTime(at, g.at[len(g.at)-1]) // after every turn given before
	}
	// Entries in (at−w, at] count. Drop from the count those out of that
	// window, then the oldest until cost fits, and go when the last one
	// dropped leaves the window.
	sum, i := g.sum, g.first
	for ; i < len(g.at) && !g.at[i].Add(g.w).After(at); i++ {
		sum -= int(g.cost[i])
	}
	j := i
	for ; sum+cost > n; j++ {
		sum -= int(g.cost[j])
	}
	if j > i {
		at = g.at[j-1].Add(g.w)
	}
	return at
}

// add records a grant of cost at turn at, which must be at or after every
// turn given before (earliest's).
func (g *grantLog) add(at time.Time, cost int) {
	g.at = append(g.at, at)
	g.cost = append(g.cost, int32(cost))
	g.sum += cost
}

// staying returns the costs of the grants still in the window at t.
func (g *grantLog) staying(t time.Time) int {
	n := 0
	for i := g.first; i < len(g.at); i++ {
		if g.at[i].Add(g.w).After(t) {
			n += int(g.cost[i])
		}
	}
	return n
}

// insert records a grant of cost at turn at, in time order (a cost
// charged after the fact, at a turn before later ones).
func (g *grantLog) insert(at time.Time, cost int) {
	i := len(g.at)
	for i > g.first && g.at[i-1].After(at) {
		i--
	}
	g.at = append(g.at, time.Time{})
	g.cost = append(g.cost, 0)
	copy(g.at[i+1:], g.at[i:])
	copy(g.cost[i+1:], g.cost[i:])
	g.at[i], g.cost[i] = at, int32(cost)
	g.sum += cost
}

// adjust changes the cost of the grant of cost from at turn at to cost to
// (a settlement; 0 gives the turn back), and reports whether it was still
// in the log. The turns after it stay where they are.
func (g *grantLog) adjust(at time.Time, from, to int) bool {
	i := g.find(at, from)
	if i < 0 {
		return false
	}
	g.sum += to - from
	g.cost[i] = int32(to) // kept in place, so that the log stays in time order
	return true
}

// find returns the index of the last grant of cost at turn at, or -1.
func (g *grantLog) find(at time.Time, cost int) int {
	for i := len(g.at) - 1; i >= g.first; i-- {
		if g.at[i].Equal(at) && int(g.cost[i]) == cost {
			return i
		}
		if g.at[i].Before(at) {
			return -1
		}
	}
	return -1
}

// remove takes the grant of cost at turn at out of the log, if it is in it.
func (g *grantLog) remove(at time.Time, cost int) {
	if i := g.find(at, cost); i >= 0 {
		g.at = slices.Delete(g.at, i, i+1)
		g.cost = slices.Delete(g.cost, i, i+1)
		g.sum -= cost
	}
}

// trim drops the grants that left the window by now, and compacts the log
// when most of it is gone.
func (g *grantLog) trim(now time.Time) {
	for g.first < len(g.at) && !g.at[g.first].Add(g.w).After(now) {
		g.sum -= int(g.cost[g.first])
		g.first++
	}
	if g.first > 32 && g.first*2 > len(g.at) {
		n := copy(g.at, g.at[g.first:])
		copy(g.cost, g.cost[g.first:])
		g.at, g.cost, g.first = g.at[:n], g.cost[:n], 0
	}
}

// cancel gives back the turn at of cost, which its waiter did not use. The
// turns after it stay where they are.
func (l *WindowLimit) cancel(key string, at time.Time, cost int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	g, ok := l.logs.m[key]
	if !ok {
		return
	}
	g.adjust(at, cost, 0)
}

// Used returns the cost units granted to key in the window ending now.
func (l *WindowLimit) Used(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	g, ok := l.logs.m[key]
	if !ok {
		return 0
	}
	now := l.clock.Now()
	g.trim(now)
	used := 0
	for i := g.first; i < len(g.at); i++ {
		if !g.at[i].After(now) {
			used += int(g.cost[i])
		}
	}
	return used
}
