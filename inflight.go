package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/lease"
)

// InFlightLimiter caps how many requests of a key are in flight at once:
// sent and not yet finished. Providers limit concurrency beside the rate —
// Twilio answers 20429 "too many concurrent requests", Stripe runs a
// concurrency limiter beside its rate limiter. InFlightLimit (one process)
// and SharedInFlightLimit (a fleet, through Redis) implement it, and so can
// a caller's own. Give one to a Transport with WithInFlightLimit.
//
// A slot is a lease: the Transport frees it when the response body is read
// to its end or closed, when the attempt fails, or when the request's
// context ends, whichever comes first; and the limiter takes it back when
// its lease time ends, so that a body nobody closes does not hold a slot
// for ever (see WithLeaseTime).
type InFlightLimiter interface {
	// Acquire blocks until key has a free slot and returns the function
	// that frees it (safe to call more than once, and from any goroutine)
	// and how long it waited. InFlightLimit serves its waiters first come,
	// first served; SharedInFlightLimit in no set order.
	// When no slot frees within maxWait (> 0) it returns a *LimitError
	// with ReasonInFlight; when ctx ends first it returns ctx.Err(). It
	// never returns a slot and an error.
	Acquire(ctx context.Context, key string, maxWait time.Duration) (release func(), waited time.Duration, err error)
}

// InFlightLimit is an InFlightLimiter for one process: at most n requests
// of each key in flight at once. A key's state is dropped when it has no
// slot held and no waiter, so idle keys cost nothing. Its slots are leases
// of WithLeaseTime (default 5 minutes).
type InFlightLimit struct {
	n     int
	lease time.Duration
	clock clock.Clock

	mu   sync.Mutex
	keys map[string]*slots
	ids  uint64
}

// slots is one key's leases and waiters.
type slots struct {
	leases  lease.Set
	waiters []*inFlightWaiter // first come, first served; served ones removed
}

type inFlightWaiter struct {
	ready chan struct{} // closed when the waiter is given a slot
	id    uint64        // the slot's lease, once given
}

const defaultLeaseTime = 5 * time.Minute

// inFlightSettings checks n and applies opts for the in-flight limit op
// (of kind k) over the defaults.
func inFlightSettings(op string, k limiterKind, n int, opts []LimiterOption) (limiterSettings, error) {
	set, err := limiterSettingsFor(op, k, opts)
	if n < 1 {
		err = errors.Join(configError(op+": n", n, "must be at least 1"), err)
	}
	return set, err
}

// NewInFlightLimit returns an InFlightLimit of n requests in flight per
// key. n must be at least 1.
func NewInFlightLimit(n int, opts ...LimiterOption) (*InFlightLimit, error) {
	c, err := inFlightSettings("NewInFlightLimit", localInFlight, n, opts)
	if err != nil {
		return nil, err
	}
	return &InFlightLimit{n: n, lease: c.lease, clock: clock.Real{}, keys: make(map[string]*slots)}, nil
}

// Acquire implements InFlightLimiter.
func (l *InFlightLimit) Acquire(ctx context.Context, key string, maxWait time.Duration) (func(), time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	start := l.clock.Now()
	l.mu.Lock()
	s := l.keys[key]
	if s == nil {
		s = &slots{}
		l.keys[key] = s
	}
	l.expire(s, start)
	if len(s.waiters) == 0 {
		if id, ok := l.take(s, start); ok {
			l.mu.Unlock()
			return l.releaser(key, id), 0, nil
		}
	}
	w := &inFlightWaiter{ready: make(chan struct{})}
	s.waiters = append(s.waiters, w)
	l.mu.Unlock()
	return l.await(ctx, key, s, w, start, maxWait)
}

// await waits, from start, until w, queued among the waiters of key's
// slots s, is given a slot, and returns what Acquire returns: the slot's
// release and the wait, a *LimitError when maxWait (> 0) ends first, or
// ctx.Err() when ctx ends first. A slot given as it gives up is kept.
func (l *InFlightLimit) await(ctx context.Context, key string, s *slots, w *inFlightWaiter, start time.Time, maxWait time.Duration) (func(), time.Duration, error) {
	var deadline <-chan time.Time
	if maxWait > 0 {
		t := l.clock.NewTimer(maxWait)
		defer t.Stop()
		deadline = t.C()
	}
	for {
		// Wake when the earliest lease of the key ends, to take it back.
		l.mu.Lock()
		next := s.leases.Next()
		l.mu.Unlock()
		var expiry clock.Timer
		var expired <-chan time.Time
		if !next.IsZero() {
			expiry = l.clock.NewTimer(max(next.Sub(l.clock.Now()), time.Millisecond))
			expired = expiry.C()
		}
		select {
		case <-w.ready:
			stopTimer(expiry)
			return l.releaser(key, w.id), l.clock.Now().Sub(start), nil
		case <-expired:
			l.mu.Lock()
			l.expire(s, l.clock.Now())
			l.mu.Unlock()
			continue
		case <-deadline:
			stopTimer(expiry)
			if l.leave(key, s, w) {
				return l.releaser(key, w.id), l.clock.Now().Sub(start), nil
			}
			waited := l.clock.Now().Sub(start)
			return nil, waited, &LimitError{Key: key, Cost: 1, Reason: ReasonInFlight, Wait: waited}
		case <-ctx.Done():
			stopTimer(expiry)
			if l.leave(key, s, w) {
				return l.releaser(key, w.id), l.clock.Now().Sub(start), nil
			}
			return nil, l.clock.Now().Sub(start), ctx.Err()
		}
	}
}

func stopTimer(t clock.Timer) {
	if t != nil {
		t.Stop()
	}
}

// leave takes w out of the queue; it reports whether w was given a slot
// meanwhile, which it then keeps (the caller was about to give up, but a
// slot it holds is one it may use).
func (l *InFlightLimit) leave(key string, s *slots, w *inFlightWaiter) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-w.ready:
		return true
	default:
	}
	for i, x := range s.waiters {
		if x == w {
			s.waiters = append(s.waiters[:i], s.waiters[i+1:]...)
			break
		}
	}
	l.tidy(key, s)
	return false
}

// expire takes back the leases of s that ended by now and hands free slots
// to the waiters in order; l.mu is held.
func (l *InFlightLimit) expire(s *slots, now time.Time) {
	s.leases.Expire(now)
	l.serve(s, now)
}

// serve hands free slots to the waiters of s in order; l.mu is held.
func (l *InFlightLimit) serve(s *slots, now time.Time) {
	for len(s.waiters) > 0 {
		id, ok := l.take(s, now)
		if !ok {
			return
		}
		w := s.waiters[0]
		s.waiters[0] = nil
		s.waiters = s.waiters[1:]
		w.id = id
		close(w.ready)
	}
}

// take gives s a new lease from now, with the next id, when fewer than n
// are held; l.mu is held.
func (l *InFlightLimit) take(s *slots, now time.Time) (id uint64, ok bool) {
	if taken, _ := s.leases.Acquire(l.ids+1, l.n, now, l.lease); !taken {
		return 0, false
	}
	l.ids++
	return l.ids, true
}

// releaser returns the function that frees lease id of key.
func (l *InFlightLimit) releaser(key string, id uint64) func() {
	return func() { l.release(key, id) }
}

// release frees lease id of key, if it is still held.
func (l *InFlightLimit) release(key string, id uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.keys[key]
	if s == nil {
		return
	}
	if s.leases.Release(id) {
		l.serve(s, l.clock.Now())
	}
	l.tidy(key, s)
}

// tidy drops the state of a key that has no lease and no waiter; l.mu is
// held.
func (l *InFlightLimit) tidy(key string, s *slots) {
	if len(s.leases) == 0 && len(s.waiters) == 0 {
		delete(l.keys, key)
	}
}

// InFlight returns how many slots of key are held now.
func (l *InFlightLimit) InFlight(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.keys[key]; s != nil {
		return len(s.leases)
	}
	return 0
}

// slotBody frees its request's slot when the body is read to its end (or
// fails), when it is closed, or when the request's context ends.
type slotBody struct {
	io.ReadCloser
	slot *slot
}

func (b *slotBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.slot.free()
	}
	return n, err
}

func (b *slotBody) Close() error {
	err := b.ReadCloser.Close()
	b.slot.free()
	return err
}

// slot is one attempt's hold of an in-flight slot. Its free runs on the
// caller's goroutine (the body read to its end or closed) and on the
// goroutine of the context's AfterFunc, possibly at once, and possibly
// before holdSlot has stored stop: mu orders them, and the first to come
// releases the slot.
type slot struct {
	release func() // set before the slot is shared; read only by the first free

	mu   sync.Mutex
	stop func() bool // stops the context's AfterFunc; nil until set; guarded by mu
	done bool        // the slot was freed; guarded by mu
}

// free releases the slot the first time it is called and does nothing
// after; it is safe for concurrent use.
func (s *slot) free() {
	if s == nil {
		return
	}
	s.mu.Lock()
	if s.done {
		s.mu.Unlock()
		return
	}
	s.done = true
	stop := s.stop
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
	s.release()
}

// watch frees the slot when ctx ends. When ctx has ended already, the
// AfterFunc frees it on a goroutine of its own, which may run before or
// while the stop function is stored.
func (s *slot) watch(ctx context.Context) {
	stop := context.AfterFunc(ctx, s.free)
	s.mu.Lock()
	done := s.done
	if !done {
		s.stop = stop
	}
	s.mu.Unlock()
	if done {
		stop() // freed meanwhile: nothing is left to watch
	}
}

// holdSlot ties the slot release to resp's body, or frees it at once when
// there is no body to wait for (an error, no body, a protocol switch whose
// connection the caller now owns). It returns the response to hand on.
func holdSlot(ctx context.Context, release func(), resp *http.Response, err error) *http.Response {
	if release == nil {
		return resp
	}
	if err != nil || resp == nil || resp.Body == nil || resp.Body == http.NoBody || resp.StatusCode == http.StatusSwitchingProtocols {
		release()
		return resp
	}
	s := &slot{release: release}
	s.watch(ctx)
	resp.Body = &slotBody{ReadCloser: resp.Body, slot: s}
	return resp
}

// inFlightConfigError is the error of a nil InFlightLimiter option.
func inFlightConfigError(l InFlightLimiter) error {
	return configError("WithInFlightLimit", fmt.Sprintf("%T(nil)", l), "the in-flight limiter must not be nil")
}
