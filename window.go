package egress

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/keyed"
	"github.com/egress-go/egress/internal/window"
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
	logs keyed.Map[*window.Log] // guarded by mu; one key's grants still in the window
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
	return &WindowLimit{n: n, w: w, clock: clock.Real{}, logs: keyed.New[*window.Log]()}, nil
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
	g, ok := l.logs.Get(key, now)
	if !ok {
		g = &window.Log{W: l.w}
		l.logs.Put(key, g)
	}
	g.Trim(now)
	at = g.Earliest(now, cost, l.n)
	if e := b.refuse(now, key, cost, at.Sub(now)); e != nil {
		return time.Time{}, now, e
	}
	g.Add(at, cost)
	return at, now, nil
}

// cancel gives back the turn at of cost, which its waiter did not use. The
// turns after it stay where they are.
func (l *WindowLimit) cancel(key string, at time.Time, cost int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	g, ok := l.logs.M[key]
	if !ok {
		return
	}
	g.Adjust(at, cost, 0)
}

// Used returns the cost units granted to key in the window ending now.
func (l *WindowLimit) Used(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	g, ok := l.logs.M[key]
	if !ok {
		return 0
	}
	now := l.clock.Now()
	g.Trim(now)
	used := 0
	for i := g.First; i < len(g.At); i++ {
		if !g.At[i].After(now) {
			used += int(g.Cost[i])
		}
	}
	return used
}
