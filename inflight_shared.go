package egress

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/egress-go/egress/internal/announce"
	"github.com/egress-go/egress/internal/argv"
	"github.com/egress-go/egress/internal/caller"
	"github.com/egress-go/egress/internal/keyspace"
	"github.com/egress-go/egress/internal/lease"
	"github.com/egress-go/egress/internal/lua"
	"github.com/egress-go/egress/internal/member"
)

// SharedInFlightLimit is an InFlightLimiter for a fleet: at most n requests
// of each key in flight at once across every instance that shares the
// name, through one Redis (or Redis Cluster).
//
// A slot is a lease in Redis, in a sorted set per key, taken and given
// back by one script call on the server's clock. A lease lives for
// WithLiveness (10 s by default) unless its instance renews it; each
// instance renews the leases it holds every third of that, up to
// WithLeaseTime (5 minutes), at which the lease ends. So an instance
// killed with kill -9 gives its slots back within the liveness period, and
// a body nobody closes gives its slot back at its lease time. A release
// wakes one waiter of the key in each instance (a message on the limiter's
// channel); a waiter also tries again when the earliest lease of its key
// expires, and at the latest every 100 ms. Waiters of one key are not
// served in a fleet-wide order (nor first come, first served within an
// instance).
//
// While Redis is unreachable (errors, or commands slower than
// WithCommandTimeout) each instance falls back to a local InFlightLimit of
// its share of n, ceil(n / live instances), the live instances counted
// from a heartbeat; during an outage the fleet may thus have up to live ×
// share requests of a key in flight. Once Redis answers again, the slots
// still held through the fallback are added to Redis, so that they count
// against n until they are released. WithFailClosed makes Acquire fail
// with ErrSharedUnavailable instead. WithFallbackObserver is told of each
// switch.
//
// Keys in Redis: egress:{<name>:<key hash>}:slots per key (each key's
// leases in one Cluster slot, different keys spread over the Cluster),
// egress:{<name>}:slot-members for the heartbeat (both expire when
// unused), and each key's channel egress:{<name>:<key hash>}:released,
// in the key's slot.
//
// Close stops the background goroutine and gives back the leases the
// instance holds. A SharedInFlightLimit is safe for simultaneous use by
// multiple goroutines.
type SharedInFlightLimit struct {
	rdb    redis.UniversalClient
	name   string
	n      int
	lease  time.Duration // the longest a slot is held
	live   time.Duration // a lease's life in Redis unless renewed
	cfg    sharedConfig
	member *member.Member // this instance in the fleet's heartbeat set
	slots  *redis.Script

	mu      sync.Mutex
	held    map[string]heldLease       // lease id → lease held in Redis; guarded by mu
	local   map[string]heldLease       // lease id → slot held through the fallback; guarded by mu
	orphans map[string]string          // lease id → key id, to remove from Redis; guarded by mu
	waiters map[string][]chan struct{} // key id → waiters to wake, oldest first; guarded by mu
	seq     uint64                     // guarded by mu

	fallback   atomic.Pointer[InFlightLimit] // non-nil while Redis is unreachable
	ann        *announce.Subs                // the keys' released slots
	roundTrips atomic.Int64
	admitted   atomic.Int64
	stop       chan struct{}
	done       chan struct{}
	closed     sync.Once
}

// heldLease is a slot this instance holds.
type heldLease struct {
	keyID string
	until time.Time // the end of its lease time
}

// The defaults and bounds of the shared in-flight limit.
const (
	defaultLiveness = 10 * time.Second
	slotPoll        = 100 * time.Millisecond // the longest a waiter sleeps without trying again
	slotMembersTTL  = 3 * time.Second        // an instance counts as live this long after its heartbeat
	maxOrphans      = 4096                   // beyond, a lost lease just expires
)

// NewSharedInFlightLimit returns a limit of n requests in flight per key
// for the fleet of instances that share name through rdb (a plain,
// failover or cluster client). n must be at least 1; the name is 1 to 64
// letters, digits, '.', '_' or '-'. Its options are WithLeaseTime,
// WithLiveness, WithCommandTimeout, WithFailClosed and
// WithFallbackObserver. It does not contact Redis (a Redis that is down at
// start means fallback mode).
func NewSharedInFlightLimit(rdb redis.UniversalClient, name string, n int, opts ...LimiterOption) (*SharedInFlightLimit, error) {
	const op = "NewSharedInFlightLimit"
	if rdb == nil || isNilPointer(rdb) {
		return nil, configError(op+": rdb", "nil", "the Redis client must not be nil")
	}
	if !sharedNameRE.MatchString(name) {
		return nil, configError(op+": name", strconv.Quote(name), "must be 1 to 64 letters, digits, '.', '_' or '-'")
	}
	c, err := inFlightSettings(op, sharedInFlight, n, opts)
	if err != nil {
		return nil, err
	}
	s := &SharedInFlightLimit{
		rdb: rdb, name: name, n: n, lease: c.lease, live: c.liveness, cfg: c.redis,
		slots: redis.NewScript(lua.Slots),
		held:  map[string]heldLease{}, local: map[string]heldLease{}, orphans: map[string]string{},
		waiters: map[string][]chan struct{}{},
		stop:    make(chan struct{}), done: make(chan struct{}),
	}
	s.member = member.New(rdb, redis.NewScript(lua.Heartbeat), s.membersKey(), slotMembersTTL, nil)
	s.ann = announce.New(rdb, keyspace.Pattern(name, "released"), s.cfg.timeout)
	go s.background()
	return s, nil
}

func (s *SharedInFlightLimit) slotsKey(id string) string {
	return keyspace.Tag(s.name, id) + "slots"
}
func (s *SharedInFlightLimit) membersKey() string { return keyspace.Own(s.name) + "slot-members" }

// channel is the channel of key id's released slots (see internal/announce).
func (s *SharedInFlightLimit) channel(id string) string {
	return keyspace.Tag(s.name, id) + "released"
}

// Acquire implements InFlightLimiter. Waiting in Redis, it returns a
// *LimitError with ReasonInFlight when maxWait (> 0) passes, ctx.Err()
// when ctx ends (a slot granted meanwhile is given back at once), and an
// error matching ErrSharedUnavailable when Redis is unreachable and the
// limit fails closed.
func (s *SharedInFlightLimit) Acquire(ctx context.Context, key string, maxWait time.Duration) (func(), time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	id := keyspace.ID(key)
	start := time.Now()
	var expired <-chan time.Time
	if maxWait > 0 {
		t := time.NewTimer(maxWait)
		defer t.Stop()
		expired = t.C
	}
	for {
		select {
		case <-s.stop:
			return nil, time.Since(start), s.errClosed()
		default:
		}
		if fb := s.fallback.Load(); fb != nil {
			return s.acquireLocal(ctx, fb, key, id, start, maxWait)
		}
		wake := s.register(id)
		lease := s.newLease()
		got, wait, err := s.try(id, lease)
		switch {
		case err != nil:
			s.leave(id, wake)
			s.orphan(id, lease) // in case the server took it and the reply was lost
			s.failed(err)
			if ctx.Err() != nil {
				return nil, time.Since(start), ctx.Err()
			}
			continue // to the fallback
		case got:
			s.leave(id, wake)
			if ctx.Err() != nil {
				s.release(id, lease) // its waiter has gone
				return nil, time.Since(start), ctx.Err()
			}
			return s.releaser(id, lease), time.Since(start), nil
		}
		t := time.NewTimer(min(max(wait, time.Millisecond), slotPoll))
		select {
		case <-wake: // unregistered by wake
		case <-t.C:
			s.unregister(id, wake) // tries again, woken or not
		case <-expired:
			s.leave(id, wake)
			waited := time.Since(start)
			return nil, waited, &LimitError{Key: key, Cost: 1, Reason: ReasonInFlight, Wait: waited}
		case <-ctx.Done():
			s.leave(id, wake)
			return nil, time.Since(start), ctx.Err()
		case <-s.stop:
			s.leave(id, wake)
			return nil, time.Since(start), s.errClosed()
		}
		t.Stop()
	}
}

// acquireLocal takes a slot of the fallback fb while Redis is
// unreachable, or fails when the limit fails closed.
func (s *SharedInFlightLimit) acquireLocal(ctx context.Context, fb *InFlightLimit, key, id string, start time.Time, maxWait time.Duration) (func(), time.Duration, error) {
	waited := time.Since(start)
	if s.cfg.failClosed {
		return nil, waited, fmt.Errorf("%w: %s", ErrSharedUnavailable, s.name)
	}
	if maxWait > 0 && waited >= maxWait {
		return nil, waited, &LimitError{Key: key, Cost: 1, Reason: ReasonInFlight, Wait: waited}
	}
	release, w, err := fb.Acquire(ctx, key, remaining(maxWait, waited))
	if err != nil {
		return nil, waited + w, err
	}
	lease := s.newLease()
	s.mu.Lock()
	s.local[lease] = heldLease{keyID: id, until: time.Now().Add(s.lease)}
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			release()
			s.mu.Lock()
			_, local := s.local[lease]
			delete(s.local, lease)
			s.mu.Unlock()
			if !local { // adopted into Redis since
				s.release(id, lease)
			}
		})
	}, waited + w, nil
}

func (s *SharedInFlightLimit) errClosed() error {
	return fmt.Errorf("egress: shared in-flight limit %s: closed", s.name)
}

// try runs the acquire script for lease on key id: whether it got a slot,
// and if not how long until the earliest lease expires.
func (s *SharedInFlightLimit) try(id, lid string) (bool, time.Duration, error) {
	s.roundTrips.Add(1)
	var reply []int64
	err := s.do(func(ctx context.Context) error {
		var err error
		reply, err = caller.Run(ctx, s.rdb, nil, s.slots, []string{s.slotsKey(id)}, lease.AcquireArgs(lid, s.n, min(s.live, s.lease))...).Int64Slice()
		return err
	})
	if err != nil {
		return false, 0, err
	}
	r, err := lease.ParseReply(reply)
	if err != nil || r.N > 1 {
		return false, 0, fmt.Errorf("egress: shared in-flight limit %s: malformed reply %v", s.name, reply)
	}
	if r.N == 1 {
		s.admitted.Add(1)
		s.mu.Lock()
		s.held[lid] = heldLease{keyID: id, until: time.Now().Add(s.lease)}
		s.mu.Unlock()
		return true, 0, nil
	}
	return false, r.Wait, nil
}

// releaser returns the function that gives lease of key id back, once.
func (s *SharedInFlightLimit) releaser(id, lease string) func() {
	var once sync.Once
	return func() { once.Do(func() { s.release(id, lease) }) }
}

// release gives lease back, which tells the fleet's waiters of key id. A
// lease that cannot be removed now is removed once Redis answers again, or
// expires within the liveness period.
func (s *SharedInFlightLimit) release(id, lease string) {
	s.mu.Lock()
	_, ok := s.held[lease]
	delete(s.held, lease)
	s.mu.Unlock()
	if !ok {
		return // its lease time ended: it has expired in Redis
	}
	if s.fallback.Load() != nil || s.releaseAll(id, lease) != nil {
		s.orphan(id, lease)
	}
}

// releaseAll removes the leases of key id from Redis.
func (s *SharedInFlightLimit) releaseAll(id string, leases ...string) error {
	args := lease.ReleaseArgs(s.channel(id), id, leases)
	return s.do(func(ctx context.Context) error {
		return caller.Run(ctx, s.rdb, nil, s.slots, []string{s.slotsKey(id)}, args...).Err()
	})
}

// orphan records a lease to remove from Redis once it answers again.
func (s *SharedInFlightLimit) orphan(id, lease string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.orphans) < maxOrphans {
		s.orphans[lease] = id
	}
}

func (s *SharedInFlightLimit) newLease() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	return s.member.ID() + ":" + strconv.FormatUint(s.seq, 36)
}

// register adds a waiter of key id, woken when a slot of it is released.
func (s *SharedInFlightLimit) register(id string) chan struct{} {
	ch := make(chan struct{})
	s.mu.Lock()
	s.waiters[id] = append(s.waiters[id], ch)
	s.mu.Unlock()
	s.ann.Want(s.channel(id), time.Now())
	return ch
}

// unregister removes the waiter ch of key id; it reports false when ch was
// no longer there: wake took it.
func (s *SharedInFlightLimit) unregister(id string, ch chan struct{}) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	ws := s.waiters[id]
	for i, w := range ws {
		if w == ch {
			ws = append(ws[:i], ws[i+1:]...)
			if len(ws) == 0 {
				delete(s.waiters, id)
			} else {
				s.waiters[id] = ws
			}
			return true
		}
	}
	return false
}

// leave removes the waiter ch of key id, which will not try again: a wake
// it was given goes on to the next waiter.
func (s *SharedInFlightLimit) leave(id string, ch chan struct{}) {
	if !s.unregister(id, ch) {
		s.wake(id)
	}
}

// wake wakes the oldest waiter of key id: a slot of it was released.
func (s *SharedInFlightLimit) wake(id string) {
	s.mu.Lock()
	ws := s.waiters[id]
	if len(ws) == 0 {
		s.mu.Unlock()
		return
	}
	w := ws[0]
	if len(ws) == 1 {
		delete(s.waiters, id)
	} else {
		s.waiters[id] = ws[1:]
	}
	s.mu.Unlock()
	close(w)
}

// do runs f with the command timeout, returning when it passes even if f
// does not.
func (s *SharedInFlightLimit) do(f func(context.Context) error) error {
	return caller.WithTimeout(context.Background(), s.cfg.timeout, f)
}

// failed enters the fallback: a local limit of this instance's share of n
// (unused when the limit fails closed, whose Acquire then refuses).
func (s *SharedInFlightLimit) failed(err error) {
	if s.fallback.Load() != nil {
		return
	}
	live := int(s.member.Live())
	fb, _ := NewInFlightLimit((s.n+live-1)/live, WithLeaseTime(s.lease))
	if s.fallback.CompareAndSwap(nil, fb) && s.cfg.onFallback != nil {
		s.cfg.onFallback(s.name, true, err)
	}
}

// background heartbeats (counting the fleet, probing Redis in fallback),
// renews the leases held, and hears released slots.
func (s *SharedInFlightLimit) background() {
	defer close(s.done)
	defer s.ann.Close()
	s.beat() // (its reply says how to subscribe to the released slots)
	s.ann.Sync(true, time.Now())
	beat := time.NewTicker(defaultHeartbeat / 4)
	defer beat.Stop()
	renew := time.NewTicker(s.live / 3)
	defer renew.Stop()
	last := time.Now()
	for {
		select {
		case <-s.stop:
			return
		case id := <-s.ann.In():
			s.wake(id)
		case <-s.ann.Kicked():
			s.ann.Sync(false, time.Now())
		case now := <-beat.C:
			// Beat once a second; probe four times as often in fallback.
			if s.fallback.Load() != nil || now.Sub(last) >= defaultHeartbeat {
				s.beat()
				last = now
			}
			if s.fallback.Load() == nil {
				s.ann.Sync(s.ann.Due(now, defaultHeartbeat), now)
			}
		case <-renew.C:
			if s.fallback.Load() == nil {
				s.renew()
			}
		}
	}
}

// beat records this instance as live and counts the fleet; a failure
// enters the fallback, a success leaves it, adds the slots taken in the
// fallback to Redis and removes the leases left there.
func (s *SharedInFlightLimit) beat() {
	r, err := s.member.Beat(s.do, s.fallback.Load() != nil)
	if err != nil {
		s.failed(err)
		return
	}
	s.ann.Heard(r.Sharded)
	left := s.fallback.Swap(nil) != nil
	s.adopt()
	s.removeOrphans()
	if left && s.cfg.onFallback != nil {
		s.cfg.onFallback(s.name, false, nil)
	}
}

// leases groups the leases of m by key id, with the life each is given in
// Redis: the liveness period, or less when its lease time ends sooner. A
// lease whose lease time has ended is dropped from m. s.mu is held.
func (s *SharedInFlightLimit) leases(m map[string]heldLease, now time.Time) map[string][]lease.Lease {
	by := map[string][]lease.Lease{}
	for lid, h := range m {
		if !h.until.After(now) {
			delete(m, lid) // ended: expired in Redis, or taken back by the fallback
			continue
		}
		by[h.keyID] = append(by[h.keyID], lease.Lease{ID: lid, Life: argv.Micros(min(s.live, h.until.Sub(now)))})
	}
	return by
}

// renew extends the leases held, up to their lease time; a lease Redis
// lost (restarted, or down longer than the liveness period) is added back.
func (s *SharedInFlightLimit) renew() {
	s.mu.Lock()
	by := s.leases(s.held, time.Now())
	s.mu.Unlock()
	for id, leases := range by {
		var reply []int64
		err := s.do(func(ctx context.Context) error {
			var err error
			reply, err = caller.Run(ctx, s.rdb, nil, s.slots, []string{s.slotsKey(id)}, lease.LeasesArgs("renew", leases)...).Int64Slice()
			return err
		})
		if r, perr := lease.ParseReply(reply); err == nil && perr == nil && r.N < int64(len(leases)) {
			s.restore(id, leases)
		}
	}
}

// adopt adds to Redis the slots held through the fallback, so that they
// count against n until released.
func (s *SharedInFlightLimit) adopt() {
	s.mu.Lock()
	by := s.leases(s.local, time.Now())
	s.mu.Unlock()
	for id, leases := range by {
		s.restore(id, leases)
	}
}

// restore adds the leases of key id that Redis lacks; then those still
// held, in Redis or through the fallback, are held in Redis, and those
// released meanwhile are removed again.
func (s *SharedInFlightLimit) restore(id string, leases []lease.Lease) {
	err := s.do(func(ctx context.Context) error {
		return caller.Run(ctx, s.rdb, nil, s.slots, []string{s.slotsKey(id)}, lease.LeasesArgs("adopt", leases)...).Err()
	})
	if err != nil {
		return // next time
	}
	var gone []string
	s.mu.Lock()
	for _, l := range leases {
		lid := l.ID
		if h, ok := s.local[lid]; ok {
			delete(s.local, lid)
			s.held[lid] = h
		} else if _, ok := s.held[lid]; !ok {
			gone = append(gone, lid)
		}
	}
	s.mu.Unlock()
	if len(gone) > 0 && s.releaseAll(id, gone...) != nil {
		for _, lid := range gone {
			s.orphan(id, lid)
		}
	}
}

// removeOrphans removes from Redis the leases released, or perhaps
// granted to a waiter that had gone, while Redis did not answer.
func (s *SharedInFlightLimit) removeOrphans() {
	s.mu.Lock()
	by := map[string][]string{}
	for lease, id := range s.orphans {
		by[id] = append(by[id], lease)
	}
	s.mu.Unlock()
	for id, leases := range by {
		if s.releaseAll(id, leases...) != nil {
			continue
		}
		s.mu.Lock()
		for _, lease := range leases {
			delete(s.orphans, lease)
		}
		s.mu.Unlock()
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
		n, err = s.rdb.ZCount(c, s.slotsKey(keyspace.ID(key)), strconv.FormatInt(t.UnixMicro()+1, 10), "+inf").Result()
		return err
	})
	return int(n), err
}

// Fallback reports whether the limit runs on its local fallback now (or,
// failing closed, refuses).
func (s *SharedInFlightLimit) Fallback() bool { return s.fallback.Load() != nil }

// Stats returns the limit's counters: RoundTrips counts the acquire
// scripts run, Admitted the slots Redis granted.
func (s *SharedInFlightLimit) Stats() SharedStats {
	return SharedStats{
		RoundTrips:    s.roundTrips.Load(),
		Admitted:      s.admitted.Load(),
		Fallback:      s.fallback.Load() != nil,
		LiveInstances: int(s.member.Live()),
	}
}

// Close stops the background goroutine, gives back the leases this
// instance holds and removes it from the fleet's count. Requests still
// holding slots free nothing more after Close, and Acquire fails. A lease
// that cannot be given back (Redis down) expires within the liveness
// period.
func (s *SharedInFlightLimit) Close() error {
	var err error
	s.closed.Do(func() {
		close(s.stop)
		<-s.done
		s.mu.Lock()
		by := map[string][]string{}
		for lease, h := range s.held {
			by[h.keyID] = append(by[h.keyID], lease)
		}
		for lease, id := range s.orphans {
			by[id] = append(by[id], lease)
		}
		s.held, s.local, s.orphans = map[string]heldLease{}, map[string]heldLease{}, map[string]string{}
		s.mu.Unlock()
		var errs []error
		for id, leases := range by {
			errs = append(errs, s.releaseAll(id, leases...))
		}
		errs = append(errs, s.member.Leave(s.do))
		if e := errors.Join(errs...); e != nil {
			err = fmt.Errorf("egress: shared in-flight limit %s: close: %w", s.name, e)
		}
	})
	return err
}
