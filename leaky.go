package egress

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/control"
	"github.com/egress-go/egress/internal/keyed"
)

// LeakyBucket is a local leaky bucket per key: a FIFO queue drained at
// exactly the rate.
//
// Requests of a key leave in order of arrival, spaced 1/rate apart (a request
// of cost c is followed by a gap of c/rate): the output is smooth, never a
// burst, and over any window w a key releases at most rate·w + 1 units (plus
// the cost of the largest request, when costs exceed 1). A request that finds
// no one ahead of it and the last release far enough in the past goes at
// once; otherwise it joins the queue and waits its turn. When the queue
// already holds queueDepth cost units, the request is refused at once with
// ErrQueueFull. A waiter whose context ends leaves the queue without using a
// slot, and those behind it move up.
//
// Choose it in front of a downstream that accepts exactly R per second and
// punishes bursts (a payment gateway at 30 TPS); the queue adds latency.
//
// The waiting is done by the callers' own goroutines, each on its own timer:
// no goroutine runs for a key, idle or not, and a key's state is dropped once
// its queue is empty and its last release is past. The limit holds within one
// process; for a fleet, see the shared limiters. A LeakyBucket is safe for
// simultaneous use by multiple goroutines.
type LeakyBucket struct {
	rate  Rate
	depth int
	learn control.Config
	clock clock.Clock
	seed  func(key string, now time.Time) *control.State // a new key's controller state; nil: none

	mu    sync.Mutex
	lanes keyed.Map[*lane] // guarded by mu
}

// lane is one key's queue. All its fields are guarded by the bucket's mu.
type lane struct {
	next   time.Time       // the earliest time the next release may happen
	queue  []*waiter       // waiting requests, in order of arrival; queue[0] is the head
	queued int             // the sum of the costs of the waiters in queue not gone
	tombs  int             // waiters in queue that are gone (left, not yet dropped)
	ctl    *control.State  // nil while the key has learnt nothing
	learn  *control.Config // the limiter's
}

// waiter is a request in a lane's queue. Only its own goroutine releases it.
type waiter struct {
	cost int
	gone bool          // left the queue unreleased; guarded by the bucket's mu
	head chan struct{} // closed when the waiter becomes the head of the queue
}

func (l *lane) AtRest(now time.Time) bool {
	return len(l.queue) == 0 && !l.next.After(now) && (l.ctl == nil || l.ctl.AtRest(l.learn, now))
}

// NewLeakyBucket returns a leaky bucket per key that releases at rate r and
// queues up to queueDepth cost units per key. A depth of 0 means no queue: a
// request goes at once or is refused. It fails if r is not positive,
// queueDepth < 0 or an option is invalid. The options say how keys learn
// from responses (by default: advertised limits and discovery on).
func NewLeakyBucket(r Rate, queueDepth int, opts ...LimiterOption) (*LeakyBucket, error) {
	const op = "NewLeakyBucket"
	if err := r.validate(op + ": rate"); err != nil {
		return nil, err
	}
	if queueDepth < 0 {
		return nil, configError(op+": queueDepth", queueDepth, "must be at least 0")
	}
	lc, _, err := limiterOptions(op, r, opts)
	if err != nil {
		return nil, err
	}
	lb := newLeakyBucket(r, queueDepth)
	lb.learn = lc
	return lb, nil
}

// newLeakyBucket is NewLeakyBucket for settings known to be valid, learning
// as by default.
func newLeakyBucket(r Rate, queueDepth int) *LeakyBucket {
	return &LeakyBucket{rate: r, depth: queueDepth, learn: control.DefaultConfig(r.PerSecond()), clock: clock.Real{}, lanes: keyed.New[*lane]()}
}

// Wait implements Limiter: it waits for the request's turn in key's queue.
// A cost above the queue depth (above 1 when the depth is 0) fails at once
// with ErrCostTooHigh; a full queue, with ErrQueueFull.
func (lb *LeakyBucket) Wait(ctx context.Context, key string, cost int, maxWait time.Duration) (time.Duration, error) {
	if err := checkCost(key, cost, max(lb.depth, 1)); err != nil || cost == 0 {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	w, start, err := lb.arrive(key, cost, waitBudget(ctx, maxWait))
	if err != nil || w == nil {
		return 0, err
	}
	for {
		turn, released, done := lb.poll(key, w)
		if done {
			return released.Sub(start), nil
		}
		var timer clock.Timer
		var fire <-chan time.Time
		ready := w.head
		if turn > 0 {
			timer = lb.clock.NewTimer(turn)
			fire, ready = timer.C(), nil
		}
		select {
		case <-fire:
		case <-ready:
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			lb.leave(key, w)
			return 0, ctx.Err()
		}
	}
}

// arrive admits a request of cost, now, and says when now was. It returns a
// nil waiter when the request may go at once (its release is recorded), a
// waiter now in the queue, or a *LimitError when the queue is full or the
// wait would not fit in b.
func (lb *LeakyBucket) arrive(key string, cost int, b budget) (w *waiter, now time.Time, err error) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	now = lb.clock.Now() // read under mu, so that releases are in time order
	l := lb.lane(key, now)
	r := effectiveRate(l.ctl, &lb.learn, lb.rate, now)
	if len(l.queue) == 0 && !l.next.After(now) && lb.spend(l, now, now, cost) {
		l.next = lb.after(l, now.Add(durationOf(cost, r)))
		return nil, now, nil
	}
	// Released at the later of next and now, after everyone ahead.
	wait := max(l.next.Sub(now), 0) + durationOf(l.queued, r)
	if l.queued+cost > lb.depth {
		return nil, now, &LimitError{Key: key, Cost: cost, Reason: ReasonQueueFull, Wait: wait}
	}
	if e := b.refuse(now, key, cost, wait); e != nil {
		return nil, now, e
	}
	w = &waiter{cost: cost, head: make(chan struct{})}
	if len(l.queue) == 0 {
		close(w.head)
	}
	l.queue = append(l.queue, w)
	l.queued += cost
	return w, now, nil
}

// poll releases w if it is the head of the queue and its turn has come
// (done, at the time of its turn). Otherwise it says how long the head has
// until its turn, or 0 when w is not the head and must wait to become it.
//
// A head whose goroutine wakes a little late is released at its turn, and
// the next turn follows from that one, so the queue drains at exactly the
// rate whatever the timer slack. After a stall longer than the head's own
// gap, the schedule restarts from now instead of catching up in a burst.
func (lb *LeakyBucket) poll(key string, w *waiter) (turn time.Duration, at time.Time, done bool) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	now := lb.clock.Now()
	l := lb.lanes.M[key]
	if l.queue[0] != w {
		return 0, now, false
	}
	if l.next.After(now) {
		return l.next.Sub(now), now, false
	}
	gap := durationOf(w.cost, effectiveRate(l.ctl, &lb.learn, lb.rate, now))
	at = l.next
	if now.Sub(at) > gap {
		at = now
	}
	if !lb.spend(l, now, at, w.cost) {
		return l.next.Sub(now), now, false
	}
	l.next = lb.after(l, at.Add(gap))
	l.pop(0)
	return 0, at, true
}

// leave takes w out of key's queue, unreleased, in constant time: a waiter
// behind the head is marked gone (its cost no longer counts) and dropped
// when it reaches the head, so that ten thousand waiters cancelled at once
// leave in linear time, not quadratic.
func (lb *LeakyBucket) leave(key string, w *waiter) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	l := lb.lanes.M[key]
	if w.gone {
		return
	}
	if len(l.queue) > 0 && l.queue[0] == w {
		l.pop(0)
		return
	}
	w.gone = true
	l.queued -= w.cost
	l.tombs++
	if l.tombs > 64 && l.tombs > len(l.queue)/2 {
		l.queue = slices.DeleteFunc(l.queue, func(w *waiter) bool { return w.gone })
		l.tombs = 0
	}
}

// spend spends cost units of l's budget for a release at now at its turn
// turn (see control.State.Spend); when they are not there, the key is held and
// its next release moves to the hold's end. The caller holds mu.
func (lb *LeakyBucket) spend(l *lane, now, turn time.Time, cost int) bool {
	if l.ctl == nil || l.ctl.Spend(now, turn, cost, l.ctl.Rate(&lb.learn, now)) {
		return true
	}
	l.next = clock.Later(l.next, l.ctl.Hold)
	return false
}

// after returns the next release after one whose gap ends at next: next,
// or the end of the key's hold when a probe after a hold set one (see
// control.State.Spend). The caller holds mu.
func (lb *LeakyBucket) after(l *lane, next time.Time) time.Time {
	if l.ctl == nil {
		return next
	}
	return clock.Later(next, l.ctl.Hold)
}

// pop removes the head, drops the gone waiters behind it, and wakes the new
// head. i must be 0: only the head leaves by pop.
func (l *lane) pop(i int) {
	l.queued -= l.queue[i].cost
	l.queue[0] = nil
	l.queue = l.queue[1:]
	for len(l.queue) > 0 && l.queue[0].gone {
		l.queue[0] = nil
		l.queue = l.queue[1:]
		l.tombs--
	}
	if len(l.queue) > 0 {
		close(l.queue[0].head)
	} else {
		l.queue = nil // release the array once the queue is empty
	}
}

// lane returns key's lane, making an empty one if there is none. The caller
// holds mu.
func (lb *LeakyBucket) lane(key string, now time.Time) *lane {
	if l, ok := lb.lanes.Get(key, now); ok {
		return l
	}
	l := &lane{learn: &lb.learn}
	if lb.seed != nil {
		l.ctl = lb.seed(key, now)
	}
	lb.lanes.Put(key, l)
	return l
}

// Rate returns the configured rate.
func (lb *LeakyBucket) Rate() Rate { return lb.rate }

// EffectiveRate returns the rate key is released at now: the configured
// rate, or lower when the provider advertised a lower limit or discovery
// lowered it (see WithAdaptive).
func (lb *LeakyBucket) EffectiveRate(key string) Rate {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	l, ok := lb.lanes.M[key]
	if !ok {
		return lb.rate
	}
	return effectiveRate(l.ctl, &lb.learn, lb.rate, lb.clock.Now())
}

// Learn implements Learner: key's controller applies what a response said
// (the README's "How egress learns a limit"). A hold moves the key's next
// release to its end; the queue then drains at the rate from there.
func (lb *LeakyBucket) Learn(_ context.Context, key string, s Signal) Decision {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	l := lb.lane(key, lb.clock.Now())
	if l.ctl == nil {
		l.ctl = &control.State{}
	}
	r := s.response()
	d := l.ctl.Learn(&lb.learn, &r)
	if !d.Hold.IsZero() {
		l.next = clock.Later(l.next, d.Hold)
	}
	if d.Drain && d.Keep < 0 {
		// The requests in flight owe the provider's bucket -keep units:
		// the next release waits for them to refill.
		owed := time.Duration(-d.Keep / l.ctl.Rate(&lb.learn, s.Now) * float64(time.Second))
		l.next = clock.Later(l.next, s.Now.Add(owed))
	}
	return decided(d)
}
