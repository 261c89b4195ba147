package egress

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/lua"
)

// SharedInFlightLimit is an InFlightLimiter for a fleet: at most n requests
// of each key in flight at once across every instance that shares the
// name, through one Redis (or Redis Cluster).
//
// A slot is a lease in Redis, in a sorted set per key, taken and given
// back by one script call on the server's clock. A lease lives for
// WithLiveness (10 s by default) unless its instance renews it; each
// instance renews the leases it holds every third of that, for at most
// WithLeaseTime (5 minutes). So an instance killed with kill -9 gives its
// slots back within the liveness period, and a body nobody closes gives
// its slot back at its lease time. A waiter is woken when a slot of its
// key is released anywhere in the fleet (a message on the limiter's
// channel), when the earliest lease expires, or at the latest every
// slotPoll; waiters of one key are not served in a fleet-wide order.
//
// While Redis is unreachable (errors, or commands slower than
// WithCommandTimeout) each instance falls back to a local InFlightLimit of
// its share of n: ceil(n / live instances), counted from a heartbeat;
// during an outage the fleet may thus have up to live × share in flight.
// WithFailClosed makes Acquire fail with ErrSharedUnavailable instead.
// Slots taken in the fallback are freed there.
//
// Keys in Redis: egress:{<name>:<key hash>}:slots per key (each key's
// leases in one Cluster slot), egress:{<name>}:slot-members for the
// heartbeat, and the channel egress:{<name>}:slots. Close stops the
// background goroutine and gives back the leases the instance holds.
type SharedInFlightLimit struct {
	rdb     redis.UniversalClient
	name    string
	n       int
	lease   time.Duration // the longest a lease is renewed
	live    time.Duration // a lease's life in Redis unless renewed
	cfg     sharedConfig
	id      string // this instance
	slots   *redis.Script
	beating *redis.Script

	mu      sync.Mutex
	held    map[string]heldLease       // lease id → lease; guarded by mu
	waiters map[string][]chan struct{} // key id → waiters to wake; guarded by mu
	seq     uint64                     // guarded by mu

	fallback atomic.Pointer[InFlightLimit]
	liveN    atomic.Int64
	stop     chan struct{}
	done     chan struct{}
	closed   sync.Once
}

// heldLease is a lease this instance holds.
type heldLease struct {
	keyID string
	until time.Time // renewed until then (the lease time)
}

// The defaults and bounds of the shared in-flight limit.
const (
	defaultLiveness = 10 * time.Second
	slotPoll        = 100 * time.Millisecond // the longest a waiter sleeps without trying again
)

type livenessOption time.Duration

func (o livenessOption) applyInFlight(c *inFlightConfig) {
	if o <= 0 {
		c.errs = append(c.errs, configError("WithLiveness", time.Duration(o), "must be positive"))
	}
	c.liveness, c.livenessSet = time.Duration(o), true
}

// WithLiveness sets how long a SharedInFlightLimit's lease lives in Redis
// unless its instance renews it: how soon the slots of an instance that
// died come back. Default 10 seconds; it must be positive.
func WithLiveness(d time.Duration) InFlightOption { return livenessOption(d) }

// The shared limiters' options (WithCommandTimeout, WithFailClosed,
// WithFallbackObserver) apply to a SharedInFlightLimit too.
func (f sharedOptionFunc) applyInFlight(c *inFlightConfig) {
	c.sharedSet = true
	f(&c.shared)
}

// NewSharedInFlightLimit returns a limit of n requests in flight per key
// for the fleet of instances that share name through rdb. n must be at
// least 1; name as for NewSharedTokenBucket. WithFallbackRate does not
// apply.
func NewSharedInFlightLimit(rdb redis.UniversalClient, name string, n int, opts ...InFlightOption) (*SharedInFlightLimit, error) {
	const op = "NewSharedInFlightLimit"
	if rdb == nil || isNilPointer(rdb) {
		return nil, configError(op+": rdb", "nil", "the Redis client must not be nil")
	}
	if !sharedNameRE.MatchString(name) {
		return nil, configError(op+": name", strconv.Quote(name), "must be 1 to 64 letters, digits, '.', '_' or '-'")
	}
	c, err := inFlightSettings(op, n, opts, true)
	if err != nil {
		return nil, err
	}
	if c.shared.fallbackRate != (Rate{}) {
		return nil, configError(op+": WithFallbackRate", c.shared.fallbackRate, "does not apply to an in-flight limit (its fallback is a share of n)")
	}
	var id [8]byte
	rand.Read(id[:])
	s := &SharedInFlightLimit{
		rdb: rdb, name: name, n: n, lease: c.lease, live: c.liveness, cfg: c.shared,
		id:    hex.EncodeToString(id[:]),
		slots: redis.NewScript(lua.Slots), beating: redis.NewScript(lua.Heartbeat),
		held: map[string]heldLease{}, waiters: map[string][]chan struct{}{},
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	s.liveN.Store(1)
	go s.background()
	return s, nil
}

func (s *SharedInFlightLimit) slotsKey(id string) string {
	return "egress:{" + s.name + ":" + id + "}:slots"
}
func (s *SharedInFlightLimit) membersKey() string { return "egress:{" + s.name + "}:slot-members" }
func (s *SharedInFlightLimit) channel() string    { return "egress:{" + s.name + "}:slots" }

// Acquire implements InFlightLimiter.
func (s *SharedInFlightLimit) Acquire(ctx context.Context, key string, maxWait time.Duration) (func(), time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	id := keyID(key)
	start := time.Now()
	var expired <-chan time.Time
	if maxWait > 0 {
		t := time.NewTimer(maxWait)
		defer t.Stop()
		expired = t.C
	}
	for {
		if fb := s.fallback.Load(); fb != nil {
			waited := time.Since(start)
			if maxWait > 0 && waited >= maxWait {
				return nil, waited, &LimitError{Key: key, Cost: 1, Reason: ReasonInFlight, Wait: waited}
			}
			release, w, err := fb.Acquire(ctx, key, remaining(maxWait, waited))
			return release, waited + w, err
		}
		wake := s.register(id)
		lease := s.newLease()
		got, wait, err := s.try(id, lease)
		if err != nil {
			s.unregister(id, wake)
			if s.cfg.failClosed {
				return nil, time.Since(start), fmt.Errorf("%w: %s: %v", ErrSharedUnavailable, s.name, err)
			}
			s.failed(err)
			continue
		}
		if got {
			s.unregister(id, wake)
			return s.releaser(id, lease), time.Since(start), nil
		}
		t := time.NewTimer(min(max(wait, time.Millisecond), slotPoll))
		select {
		case <-wake:
		case <-t.C:
		case <-expired:
			t.Stop()
			s.unregister(id, wake)
			waited := time.Since(start)
			return nil, waited, &LimitError{Key: key, Cost: 1, Reason: ReasonInFlight, Wait: waited}
		case <-ctx.Done():
			t.Stop()
			s.unregister(id, wake)
			return nil, time.Since(start), ctx.Err()
		case <-s.stop:
			t.Stop()
			s.unregister(id, wake)
			return nil, time.Since(start), fmt.Errorf("egress: shared in-flight limit %s: closed", s.name)
		}
		t.Stop()
		s.unregister(id, wake)
	}
}

// try runs the acquire script for lease on key id: whether it got a slot,
// and if not how long until the earliest lease expires.
func (s *SharedInFlightLimit) try(id, lease string) (bool, time.Duration, error) {
	var reply []int64
	err := s.do(func(ctx context.Context) error {
		var err error
		reply, err = s.slots.Run(ctx, s.rdb, []string{s.slotsKey(id)}, "acquire", lease, s.n, micros(s.live)).Int64Slice()
		return err
	})
	if err != nil {
		return false, 0, err
	}
	if len(reply) != 2 || reply[1] < 0 {
		return false, 0, fmt.Errorf("egress: shared in-flight limit %s: malformed reply %v", s.name, reply)
	}
	if reply[0] == 1 {
		s.mu.Lock()
		s.held[lease] = heldLease{keyID: id, until: time.Now().Add(s.lease)}
		s.mu.Unlock()
		return true, 0, nil
	}
	return false, time.Duration(reply[1]) * time.Microsecond, nil
}

// releaser returns the function that gives lease of key id back, once.
func (s *SharedInFlightLimit) releaser(id, lease string) func() {
	var once sync.Once
	return func() { once.Do(func() { s.release(id, lease) }) }
}

// release gives lease back and tells the fleet's waiters of key id. An
// error leaves the lease to expire within the liveness period.
func (s *SharedInFlightLimit) release(id, lease string) {
	s.mu.Lock()
	_, ok := s.held[lease]
	delete(s.held, lease)
	s.mu.Unlock()
	if !ok {
		return // its lease time ended: no longer renewed, soon gone
	}
	_ = s.do(func(ctx context.Context) error {
		return s.slots.Run(ctx, s.rdb, []string{s.slotsKey(id)}, "release", lease, 0, 0, s.channel(), id).Err()
	})
}

func (s *SharedInFlightLimit) newLease() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	return s.id + ":" + strconv.FormatUint(s.seq, 36)
}

// register adds a waiter of key id, woken when a slot of it is released.
func (s *SharedInFlightLimit) register(id string) chan struct{} {
	ch := make(chan struct{})
	s.mu.Lock()
	s.waiters[id] = append(s.waiters[id], ch)
	s.mu.Unlock()
	return ch
}

func (s *SharedInFlightLimit) unregister(id string, ch chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ws := s.waiters[id]
	for i, w := range ws {
		if w == ch {
			ws = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(s.waiters, id)
	} else {
		s.waiters[id] = ws
	}
}

// wake wakes the waiters of key id: a slot of it was released.
func (s *SharedInFlightLimit) wake(id string) {
	s.mu.Lock()
	ws := s.waiters[id]
	delete(s.waiters, id)
	s.mu.Unlock()
	for _, w := range ws {
		close(w)
	}
}

// do runs f with the command timeout, returning when it passes even if f
// does not.
func (s *SharedInFlightLimit) do(f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.timeout)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- f(ctx) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// failed enters the fallback: a local limit of this instance's share of n.
func (s *SharedInFlightLimit) failed(err error) {
	if s.cfg.failClosed || s.fallback.Load() != nil {
		return // fail-closed: every Acquire asks Redis, and fails while it is down
	}
	live := int(max(1, s.liveN.Load()))
	share := (s.n + live - 1) / live
	fb := &InFlightLimit{n: share, lease: s.lease, clock: clock.Real{}, keys: make(map[string]*slots)}
	if s.fallback.CompareAndSwap(nil, fb) && s.cfg.onFallback != nil {
		s.cfg.onFallback(s.name, true, err)
	}
}

// background heartbeats (counting the fleet, probing Redis in fallback),
// renews the leases held, and hears released slots.
func (s *SharedInFlightLimit) background() {
	defer close(s.done)
	sub := s.rdb.Subscribe(context.Background(), s.channel())
	msgs := sub.Channel()
	defer func() { _ = sub.Close() }()
	s.beat()
	beat := time.NewTicker(time.Second / 4)
	defer beat.Stop()
	renew := time.NewTicker(s.live / 3)
	defer renew.Stop()
	last := time.Now()
	for {
		select {
		case <-s.stop:
			return
		case m, ok := <-msgs:
			if !ok {
				msgs = nil
				continue
			}
			s.wake(m.Payload)
		case now := <-beat.C:
			if s.fallback.Load() != nil || now.Sub(last) >= time.Second {
				s.beat()
				last = now
			}
			if msgs == nil && s.fallback.Load() == nil {
				_ = sub.Close()
				sub = s.rdb.Subscribe(context.Background(), s.channel())
				msgs = sub.Channel()
			}
		case <-renew.C:
			s.renew()
		}
	}
}

// beat records this instance as live and counts the fleet; a failure
// enters the fallback, a success leaves it.
func (s *SharedInFlightLimit) beat() {
	var n int64
	err := s.do(func(ctx context.Context) error {
		var err error
		n, err = s.beating.Run(ctx, s.rdb, []string{s.membersKey()}, s.id, (3 * time.Second).Milliseconds(), 1).Int64()
		return err
	})
	if err != nil {
		s.failed(err)
		return
	}
	s.liveN.Store(max(1, n))
	if s.fallback.Swap(nil) != nil && s.cfg.onFallback != nil {
		s.cfg.onFallback(s.name, false, nil)
	}
}

// renew extends the leases held; a lease past its lease time is no longer
// renewed and expires within the liveness period.
func (s *SharedInFlightLimit) renew() {
	now := time.Now()
	s.mu.Lock()
	type item struct{ lease, id string }
	var items []item
	for lease, h := range s.held {
		if now.After(h.until) {
			delete(s.held, lease)
			continue
		}
		items = append(items, item{lease, h.keyID})
	}
	s.mu.Unlock()
	if len(items) == 0 {
		return
	}
	// One call a lease (not a pipeline, in which a script the server has
	// forgotten could not be loaded again): a lease not renewed expires
	// within the liveness period, no sooner.
	for _, it := range items {
		_ = s.do(func(ctx context.Context) error {
			return s.slots.Run(ctx, s.rdb, []string{s.slotsKey(it.id)}, "renew", it.lease, 0, micros(s.live)).Err()
		})
	}
}

// InFlight returns how many slots of key the fleet holds now, as Redis
// counts them (leases not yet expired).
func (s *SharedInFlightLimit) InFlight(ctx context.Context, key string) (int, error) {
	var n int64
	err := s.do(func(c context.Context) error {
		t, err := s.rdb.Time(c).Result()
		if err != nil {
			return err
		}
		n, err = s.rdb.ZCount(c, s.slotsKey(keyID(key)), strconv.FormatInt(t.UnixMicro()+1, 10), "+inf").Result()
		return err
	})
	return int(n), err
}

// Fallback reports whether the limit runs on its local fallback now.
func (s *SharedInFlightLimit) Fallback() bool { return s.fallback.Load() != nil }

// Close stops the background goroutine, gives back the leases this
// instance holds and removes it from the fleet's count. Requests still
// holding slots free nothing more after Close.
func (s *SharedInFlightLimit) Close() error {
	var err error
	s.closed.Do(func() {
		close(s.stop)
		<-s.done
		s.mu.Lock()
		held := s.held
		s.held = map[string]heldLease{}
		s.mu.Unlock()
		var errs []error
		for lease, h := range held {
			errs = append(errs, s.do(func(ctx context.Context) error {
				return s.slots.Run(ctx, s.rdb, []string{s.slotsKey(h.keyID)}, "release", lease, 0, 0, s.channel(), h.keyID).Err()
			}))
		}
		errs = append(errs, s.do(func(ctx context.Context) error {
			return s.beating.Run(ctx, s.rdb, []string{s.membersKey()}, s.id, (3 * time.Second).Milliseconds(), 0).Err()
		}))
		err = errors.Join(errs...)
	})
	return err
}
