package egress

import (
	"context"
	"errors"
	"fmt"
	"math"
	mathrand "math/rand/v2"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/egress-go/egress/internal/announce"
	"github.com/egress-go/egress/internal/caller"
	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/control"
	"github.com/egress-go/egress/internal/keyed"
	"github.com/egress-go/egress/internal/keyspace"
	"github.com/egress-go/egress/internal/lua"
	"github.com/egress-go/egress/internal/member"
)

// SharedTokenBucket is a token bucket per key whose limit holds for a whole
// fleet: every instance that uses the same Redis and the same name draws from
// the same buckets, so the fleet admits at most rate·w + burst cost units in
// any window w, whatever the number of instances.
//
// Each decision is one atomic Lua script on the Redis server's clock (never
// GET-then-SET, never the instances' clocks), one round trip for a batch of
// requests: concurrent waiters of a key in one process share a script call.
// A waiter reserves its turn and sleeps until it; a turn that would outlast
// its deadline or the maximum wait is refused at once, taking nothing. A
// waiter whose context ends after it reserved does not give its tokens back
// (that would cost a round trip); the fleet sends less, never more.
//
// When Redis fails or is slow (see WithCommandTimeout), the limiter falls
// back to a local token bucket at the instance's share of the rate, learnt
// from the fleet's heartbeats, and returns to shared mode once Redis answers
// again; see WithFailClosed and WithFallbackRate. Close stops its background
// goroutine. A SharedTokenBucket is safe for simultaneous use by multiple
// goroutines.
type SharedTokenBucket struct{ *shared }

// SharedLeakyBucket is a pacer per key for a whole fleet: releases of a key
// are spaced 1/rate apart across every instance that uses the same Redis and
// the same name (a request of cost c is followed by a gap of c/rate). Each
// caller atomically reserves the next free slot and sleeps until it; a
// caller that would wait behind queueDepth cost units, fleet-wide, is
// refused at once with ErrQueueFull. The queue counts the units waiting for
// turns after the end of the key's hold, as a LeakyBucket counts its
// waiters: not the time their turns span, which a rate that has risen since
// they were given, or a hold, would turn into phantom waiters. Redis
// failures, pauses and Close work as for SharedTokenBucket. A SharedLeakyBucket is safe for simultaneous use by
// multiple goroutines.
type SharedLeakyBucket struct{ *shared }

// NewSharedTokenBucket returns a fleet-wide token bucket per key, named name
// in rdb (a plain, failover or cluster client), with rate r and burst burst.
// Instances that share rdb and name share the limit. The name is 1 to 64
// letters, digits, '.', '_' or '-'. It fails on invalid settings; it does not
// contact Redis (a Redis that is down at start means fallback mode).
func NewSharedTokenBucket(rdb redis.UniversalClient, name string, r Rate, burst int, opts ...LimiterOption) (*SharedTokenBucket, error) {
	if burst < 1 {
		return nil, configError("NewSharedTokenBucket: burst", burst, "must be at least 1")
	}
	s, err := newShared("NewSharedTokenBucket", rdb, name, r, opts)
	if err != nil {
		return nil, err
	}
	s.shape, s.burst, s.capacity, s.depth = "tb", burst, burst, -1
	s.usable = float64(burst) - jitterMargin(r, burst, s.cfg.learn.transitMargin())
	s.learn.Burst = s.usable
	s.local = func(share Rate) Limiter { return s.fallbackBucket(share) }
	s.start()
	return &SharedTokenBucket{s}, nil
}

// NewSharedLeakyBucket returns a fleet-wide pacer per key, named name in
// rdb, releasing at rate r and refusing a request that would queue behind
// queueDepth cost units already waiting. See NewSharedTokenBucket for
// the name and the errors.
func NewSharedLeakyBucket(rdb redis.UniversalClient, name string, r Rate, queueDepth int, opts ...LimiterOption) (*SharedLeakyBucket, error) {
	if queueDepth < 0 {
		return nil, configError("NewSharedLeakyBucket: queueDepth", queueDepth, "must be at least 0")
	}
	s, err := newShared("NewSharedLeakyBucket", rdb, name, r, opts)
	if err != nil {
		return nil, err
	}
	s.shape, s.burst, s.capacity, s.depth = "lb", 0, max(queueDepth, 1), queueDepth
	s.local = func(share Rate) Limiter {
		lb := newLeakyBucket(share, queueDepth)
		lb.learn, lb.seed = s.fallbackLearn(share), s.seedFallback
		return lb
	}
	s.start()
	return &SharedLeakyBucket{s}, nil
}

type sharedConfig struct {
	timeout      time.Duration // per Redis command
	failClosed   bool
	fallbackRate Rate // zero: the learnt share
	onFallback   func(name string, active bool, err error)
	heartbeat    time.Duration
	learn        learnOptions
	clock        clock.Clock // nil: the real one (tests give a fake one)
}

// The defaults of the shared limiters.
const (
	defaultCommandTimeout = 50 * time.Millisecond
	defaultHeartbeat      = time.Second
	maxBatch              = 128 // requests in one script call
)

// ErrSharedUnavailable matches the error of a fail-closed shared limiter
// (WithFailClosed) while Redis is unreachable.
var ErrSharedUnavailable = errors.New("egress: shared limiter unavailable")

// SharedStats are counters of a shared limiter since it was made.
type SharedStats struct {
	RoundTrips    int64 // reservation scripts run on Redis
	Admitted      int64 // requests admitted through Redis (not the fallback)
	Fallback      bool  // whether the limiter is in fallback mode now
	LiveInstances int   // instances of this name last counted in Redis
}

var sharedNameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// shared is the machinery of both shared shapes.
type shared struct {
	rdb      redis.UniversalClient
	name     string
	shape    string // "tb" or "lb", in key names
	rate     Rate
	burst    int     // 0 for the pacer
	usable   float64 // the burst less the jitter margin (see jitterMargin); 0 for the pacer
	capacity int     // the largest cost ever granted
	depth    int     // pacer: the queue depth in cost units; -1 for none
	cfg      sharedConfig
	member   *member.Member // this instance in the fleet's heartbeat set
	clock    clock.Clock
	local    func(share Rate) Limiter // the fallback at a share of the rate
	onMoved  func(id, payload string) // a SharedLimits' moved turns, "<key id> m <payload>"; nil for others
	coalesce bool                     // false only in measurements

	learn                        control.Config
	reserveScript, controlScript *redis.Script

	calls                caller.Caller // how it waits for Redis
	roundTrips, admitted atomic.Int64
	ann                  *announce.Subs                // the fleet's channels
	fallback             atomic.Pointer[fallbackState] // nil in shared mode
	fallbackShare        atomic.Uint64                 // float64 bits: the fallback's rate over the configured one
	lastFallback         atomic.Pointer[fallbackState] // the fallback last left, and when

	mu     sync.Mutex
	lanes  keyed.Map[*batchLane] // guarded by mu; coalescing state per key id
	pauses map[string]pauseMark  // guarded by mu; pauses heard of, by key id
	// moved are the changes of a key's rate heard of that move the turns
	// given before them, by key id (see retimings).
	moved  keyed.Map[*retimings]  // guarded by mu
	learnt keyed.Map[*learntRate] // guarded by mu; the rates keys were last seen held to, by key id

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// fallbackState is the local limiter used while Redis is unreachable,
// when it was left (zero while in use), and when it sends its first
// request (see phase).
type fallbackState struct {
	limiter Limiter
	left    time.Time
	from    time.Time
}

// fallbackBucket is a shared token bucket's fallback at rate share: a
// local bucket as large as the burst, so that every cost granted in shared
// mode is still granted while Redis is down, of which only the share's
// part of the burst goes at once: the rest is kept in reserve (the
// bucket's margin). A fleet of N instances in fallback at R/N each then
// sends at most R·w + B in any window w, as in shared mode, not R·w + N·B
// (a whole burst each took 256 instances to 5,120 requests in a second
// where the provider allows 220). A cost above the share waits until the
// bucket would hold it and the reserve.
func (s *shared) fallbackBucket(share Rate) *TokenBucket {
	tb := newTokenBucket(share, s.burst)
	tb.learn, tb.seed = s.fallbackLearn(share), s.seedFallback
	f := min(1, share.PerSecond()/s.rate.PerSecond())
	tb.margin = max(jitterMargin(share, s.burst, s.cfg.learn.transitMargin()), float64(s.burst)*(1-f))
	return tb
}

// phase returns when a fallback at share, made at now, sends its first
// request: a random part of one unit's time at the share later. The
// instances of a fleet enter their fallbacks together (Redis fails for
// all of them at once), and with less than one unit of the burst each
// (more instances than the burst) their first turns would come together
// too, one per instance in the same instant, then again a unit later: the
// fleet's requests are spread over the unit instead, as the shared
// bucket spreads them.
func phase(now time.Time, share, whole Rate, u float64) time.Time {
	if share.PerSecond() >= whole.PerSecond() {
		return now
	}
	return now.Add(time.Duration(u * float64(durationOf(1, share))))
}

// pauseMark is a pause heard of: until when, when it was heard, how many
// probes follow it (a throttle without counts set it: see storm), and its
// end on the server's clock (0 when not told), which names it.
type pauseMark struct {
	until, heard time.Time
	probes       int
	end          int64
}

// retimings are the changes of a key's rate heard of that move the turns
// the fleet gave before them: a lowering spreads the turns still to come
// at the new rate, and a raise brings them in, as a local LeakyBucket's
// queue goes at its rate of the moment (see retime in rate.lua).
// Otherwise the turns given ahead (32 waiters are 0.3 to 0.7 s of them)
// go at the rate they were given at, and the counts that tell the rate is
// wrong come that much later. The script numbers the changes and tells
// each reservation how many its turns were given after: a waiter applies,
// in order, exactly the later ones (the message of a change and the reply
// of a reservation come on different connections, in either order), and
// wakes at each one.
type retimings struct {
	ring    [16]retiming
	n       int           // entries in ring
	moved   chan struct{} // closed at the next change
	waiting int           // waiters whose turns are to come
	last    time.Time     // the last change heard, or waiter arrived, or lead waited (see lead)
}

// retiming is one change: a lowering (or, factor below 1, a raise) and
// the script's number for it.
type retiming struct {
	control.Lowering
	seq uint64
}

// add records change seq, decided at at, by factor (the old rate over the
// new), of the turns due after from, and wakes the waiters. A factor that
// moves nothing (not a positive finite number other than 1) is not
// recorded: add reports whether it was.
func (r *retimings) add(at, from time.Time, factor float64, seq uint64) bool {
	if !(factor > 0) || factor == 1 || math.IsInf(factor, 0) {
		return false
	}
	copy(r.ring[1:], r.ring[:len(r.ring)-1])
	r.ring[0] = retiming{control.Lowering{At: at, From: clock.Later(at, from), Factor: factor}, seq}
	r.n = min(r.n+1, len(r.ring))
	r.last = at
	close(r.moved)
	r.moved = make(chan struct{})
	return true
}

// apply returns when a turn due at due is due once the changes numbered
// after applied, heard since since (the turn's reservation was sent: a
// number heard before is another key's life, its state expired and
// counted again), are applied in order, and the last number applied. (A
// waiter more than len(ring) changes behind misses the oldest.)
func (r *retimings) apply(due time.Time, applied uint64, since time.Time) (time.Time, uint64) {
	for {
		next := -1
		for i := range r.n {
			if e := r.ring[i]; e.seq > applied && !e.At.Before(since) && (next < 0 || e.seq < r.ring[next].seq) {
				next = i
			}
		}
		if next < 0 {
			return due, applied
		}
		due, applied = r.ring[next].Move(due), r.ring[next].seq
	}
}

// AtRest reports whether no waiter follows the key's changes and none was
// heard for a minute: its entry can be dropped.
func (r *retimings) AtRest(now time.Time) bool {
	return r.waiting == 0 && now.Sub(r.last) > time.Minute
}

func newShared(op string, rdb redis.UniversalClient, name string, r Rate, opts []LimiterOption) (*shared, error) {
	if rdb == nil || isNilPointer(rdb) {
		return nil, configError(op+": rdb", "nil", "the Redis client must not be nil")
	}
	if !sharedNameRE.MatchString(name) {
		return nil, configError(op+": name", strconv.Quote(name), "must be 1 to 64 letters, digits, '.', '_' or '-'")
	}
	if err := r.validate(op + ": rate"); err != nil {
		return nil, err
	}
	set, err := limiterSettingsFor(op, sharedRate, opts)
	if err != nil {
		return nil, err
	}
	cfg := set.redis
	cfg.learn = set.learn
	lc, err := learnSettings(op, r, cfg.learn)
	if err != nil {
		return nil, err
	}
	lc.Fleet = true // (its burst: the usable one, once known)
	s := &shared{
		rdb: rdb, name: name, rate: r, cfg: cfg,
		learn:         lc,
		clock:         cfg.clock,
		coalesce:      true,
		reserveScript: redis.NewScript(lua.Reserve),
		controlScript: redis.NewScript(lua.Control),
		learnt:        keyed.New[*learntRate](),
		lanes:         keyed.New[*batchLane](),
		pauses:        make(map[string]pauseMark),
		moved:         keyed.New[*retimings](),
		stop:          make(chan struct{}),
		done:          make(chan struct{}),
	}
	s.ann = announce.New(rdb, keyspace.Pattern(name, "pauses"), cfg.timeout)
	if s.clock == nil {
		s.clock = clock.Real{}
	}
	s.member = member.New(rdb, redis.NewScript(lua.Heartbeat), s.membersKey(), s.instanceTTL(), s.clock)
	s.calls.Timeout = cfg.timeout
	return s, nil
}

// The fleet's ring of grants in Redis (rate.lua's granted and between): a
// key's grants counted by their turns in ringSize slots of ringSlot each,
// and kept at least ringLife after the last; and a SharedLimits' counter of
// grant ids, kept grantIDLife after its last grant (limits.lua). The
// scripts read them from internal/lua/tune.lua, generated from the Go
// (TestScriptTune).
const (
	ringSlot    = 10 * time.Millisecond
	ringSize    = 256
	ringLife    = 10 * time.Second
	grantIDLife = 24 * time.Hour
)

// hsetFields is how many fields a script writes to a hash in one HSET
// (fairstate.lua: the tenants' shares): Lua's unpack, which spreads them into
// the call's arguments, is bounded by the interpreter's stack.
const hsetFields = 500

//go:generate go test -run ^TestScriptTune$ . -update

// redisKeys returns the bucket, pause, learnt-state and (for a pacer)
// queue keys of a key id. They share the hash tag {name:id}, so a
// script's keys share a Cluster slot, while different keys spread over
// the Cluster.
func (s *shared) redisKeys(id string) []string {
	tag := keyspace.Tag(s.name, id)
	return append(make([]string, 0, 5), tag+s.shape, tag+"pause", tag+"rate", tag+"queue")
}

// sharesKey returns the key of the tenants' shares of a key id, which a
// reservation touches only when a request of it is ordered (see
// fleetTurn).
func (s *shared) sharesKey(id string) string {
	return keyspace.Tag(s.name, id) + "shares"
}

// ordersFleet marks the shared limiters, which keep the fleet's priority
// order (see fleetTurn).
func (*shared) ordersFleet() {}

func (s *shared) membersKey() string { return keyspace.Own(s.name) + "members" }

// keyChannel is the channel of key id's announcements (see internal/announce).
func (s *shared) keyChannel(id string) string { return keyspace.Tag(s.name, id) + "pauses" }

// Wait implements Limiter for the fleet: see SharedTokenBucket and
// SharedLeakyBucket.
func (s *shared) Wait(ctx context.Context, key string, cost int, maxWait time.Duration) (time.Duration, error) {
	if err := checkCost(key, cost, s.capacity); err != nil || cost == 0 {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	id := keyspace.ID(key)
	start := s.clock.Now()
	for {
		if fb := s.fallback.Load(); fb != nil {
			return s.waitFallback(ctx, fb, key, cost, maxWait, start)
		}
		reservedAt := s.clock.Now()
		b := waitBudget(ctx, remaining(maxWait, reservedAt.Sub(start)))
		rep := s.reserve(ctx, id, cost, b, reservedAt)
		switch {
		case rep.err != nil && ctx.Err() != nil:
			return 0, ctx.Err()
		case rep.err != nil:
			s.failed(rep.err)
			continue // to the fallback
		case rep.code == 1:
			return 0, b.refuseWith(key, cost, rep.wait, s.clock.Now())
		case rep.code == 2:
			return 0, &LimitError{Key: key, Cost: cost, Reason: ReasonQueueFull, Wait: rep.wait}
		case rep.code == 4:
			// Held back by the fleet's priority order (see fleetTurn):
			// its turn, were it taken now, is within its budget (the
			// script refuses one that is not), and it asks again when
			// that turn comes within the order's horizon.
			if err := sleepOr(ctx, s.clock, rep.at.Add(rep.wait).Sub(s.clock.Now()), nil); err != nil {
				return 0, err
			}
			continue
		}
		// (The wait counts from the reply's arrival, not from reservedAt,
		// which may be a batch's round trip earlier, nor from now, which
		// may be a busy process's milliseconds later: turns given after
		// this one, and moved with it, would go before it.)
		if rep.wait > 0 {
			if err := s.awaitTurn(ctx, id, key, cost, rep.at.Add(rep.wait), rep.moves, reservedAt, start, maxWait); err != nil {
				return 0, err
			}
		}
		if !s.pausedSince(id, reservedAt) {
			return s.clock.Now().Sub(start), nil
		}
		// A pause began after this turn was reserved: the turn falls inside
		// it. Reserve again; the script knows the pause.
	}
}

// waitFallback is Wait, begun at start, while Redis is away: fb's local
// limiter decides, from fb's phase on (see phase); with WithFailClosed,
// nothing is granted.
func (s *shared) waitFallback(ctx context.Context, fb *fallbackState, key string, cost int, maxWait time.Duration, start time.Time) (time.Duration, error) {
	if s.cfg.failClosed {
		return 0, fmt.Errorf("%w: %s", ErrSharedUnavailable, s.name)
	}
	now := s.clock.Now()
	if d := fb.from.Sub(now); d > 0 && waitBudget(ctx, remaining(maxWait, now.Sub(start))).refuse(now, key, cost, d) == nil {
		if err := sleepOr(ctx, s.clock, d, nil); err != nil {
			return 0, err
		}
	}
	waited := s.clock.Now().Sub(start)
	w, err := fb.limiter.Wait(ctx, key, cost, remaining(maxWait, waited))
	return waited + w, err
}

// refuseWith returns the LimitError for a wait the script found too long,
// naming the bound that refused it.
func (b budget) refuseWith(key string, cost int, wait time.Duration, now time.Time) *LimitError {
	if e := b.refuse(now, key, cost, wait); e != nil {
		return e
	}
	return &LimitError{Key: key, Cost: cost, Reason: ReasonDeadline, Wait: wait}
}

// pausedSince reports whether a pause of key id was heard after since and
// has not ended.
func (s *shared) pausedSince(id string, since time.Time) bool {
	s.mu.Lock()
	p, ok := s.pauses[id]
	s.mu.Unlock()
	return ok && p.heard.After(since) && p.until.After(s.clock.Now())
}

// awaitTurn sleeps until a turn of key id, due at due, comes, as the
// changes of the key's rate numbered after moves (the reservation's reply
// says how many came before it) move it (see retimings). A turn moved
// later than the caller allows (maxWait since start, and ctx's deadline)
// is given up with a *LimitError: the fleet sends less, never more. A turn
// given for now is not moved (the caller does not wait).
func (s *shared) awaitTurn(ctx context.Context, id, key string, cost int, due time.Time, moves uint64, reservedAt, start time.Time, maxWait time.Duration) error {
	given := due
	s.mu.Lock()
	now := s.clock.Now()
	r := s.retimingsLocked(id, now)
	r.waiting++
	r.last = now
	due, applied := r.apply(due, moves, reservedAt)
	moved := r.moved
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		r.waiting--
		s.mu.Unlock()
	}()
	for {
		now := s.clock.Now()
		left := due.Sub(now)
		if left <= 0 {
			return nil
		}
		if due.After(given) {
			if e := waitBudget(ctx, remaining(maxWait, now.Sub(start))).refuse(now, key, cost, left); e != nil {
				return e
			}
		}
		if err := sleepOr(ctx, s.clock, left, moved); err != nil {
			return err
		}
		s.mu.Lock()
		due, applied = r.apply(due, applied, reservedAt)
		moved = r.moved
		s.mu.Unlock()
	}
}

// retimingsLocked returns key id's changes heard of, making an empty
// record if there is none. The caller holds mu.
func (s *shared) retimingsLocked(id string, now time.Time) *retimings {
	r, ok := s.moved.Get(id, now)
	if !ok {
		r = &retimings{moved: make(chan struct{})}
		s.moved.Put(id, r)
	}
	return r
}

// retime records change seq of key id's rate by factor (old over new),
// heard at now, that moves the turns due after from: the waiters' and
// those the process's own checks count (batchLane).
func (s *shared) retime(id string, factor float64, now, from time.Time, seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.retimingsLocked(id, now)
	if !r.add(now, from, factor, seq) {
		return
	}
	if l, ok := s.lanes.M[id]; ok {
		l.retime(clock.Later(now, from), factor, seq)
	}
}

// heard records a pause of key id, p.
func (s *shared) heard(id string, p pauseMark) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// (A hold this instance set is heard again on the channel, its end
	// measured a message's delay later: the same hold, named by its end on
	// the server's clock, not one begun after the turns reserved since,
	// which would take them again.)
	if old, ok := s.pauses[id]; ok && (!p.until.After(old.until) || p.end != 0 && p.end == old.end) {
		return
	}
	for k, q := range s.pauses {
		if !q.until.After(p.heard) {
			delete(s.pauses, k)
		}
	}
	s.pauses[id] = p
}

// Stats returns the limiter's counters.
func (s *shared) Stats() SharedStats {
	return SharedStats{
		RoundTrips:    s.roundTrips.Load(),
		Admitted:      s.admitted.Load(),
		Fallback:      s.fallback.Load() != nil,
		LiveInstances: int(s.member.Live()),
	}
}

// Close stops the limiter's background goroutine and removes the instance
// from the fleet's count. It returns even when the Redis client was closed
// first (the error then matches redis.ErrClosed, and the instance leaves the
// count when its heartbeat expires). The limiter must not be used after
// Close. Closing the client without closing the limiter is safe: the limiter
// then behaves as one whose Redis is down.
func (s *shared) Close() error {
	s.once.Do(func() { close(s.stop) })
	<-s.done
	if err := s.member.Leave(s.do); err != nil {
		// The instance's heartbeat expires on its own (instanceTTL).
		return fmt.Errorf("egress: shared limiter %s: close: %w", s.name, err)
	}
	return nil
}

// instanceTTL is how long an instance counts as live after its heartbeat.
func (s *shared) instanceTTL() time.Duration { return 3 * s.cfg.heartbeat }

// failed switches to the fallback after a Redis error. The fallback holds
// each key to its share of the rate the fleet learnt for it (advertised or
// discovered), not of the configured one.
func (s *shared) failed(err error) {
	share := s.cfg.fallbackRate
	live := int(s.member.Live())
	if share == (Rate{}) {
		share = Rate{n: s.rate.n / float64(live), per: s.rate.per}
	}
	s.fallbackShare.Store(math.Float64bits(share.PerSecond() / s.rate.PerSecond()))
	// A fallback left moments ago is taken up again, with what it has
	// admitted since, rather than a new one with a whole burst: in a
	// Cluster whose heartbeat key answers while a bucket's master is
	// down, the limiter would otherwise flap, and burst at every flap.
	fb := s.lastFallback.Load()
	if now := s.clock.Now(); fb == nil || now.Sub(fb.left) > fallbackReuse {
		fb = &fallbackState{limiter: s.local(share), from: phase(now, share, s.rate, mathrand.Float64())}
	}
	if s.fallback.CompareAndSwap(nil, fb) && s.cfg.onFallback != nil {
		s.cfg.onFallback(s.name, true, err)
	}
}

// fallbackReuse is how long after leaving it a fallback is taken up again
// as it was.
const fallbackReuse = 10 * time.Second

// start runs the background goroutine: the heartbeat that counts the fleet
// and probes Redis while in fallback, and the subscription that hears pauses.
func (s *shared) start() {
	go s.background()
}

func (s *shared) background() {
	defer close(s.done)
	defer s.ann.Close()
	// A beat of its own at the start, whatever the requests: the count
	// of the fleet that a fallback shares the rate by is known before the
	// first reservation, which may fail (a new instance joining a fleet
	// while Redis is failing falls back to its share, not to the rate).
	// Its reply says, too, how to subscribe to the fleet's channels.
	s.beat()
	s.ann.Sync(true, time.Now())
	tick := time.NewTicker(s.cfg.heartbeat / 4)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case p := <-s.ann.In():
			s.hear(p)
		case <-s.ann.Kicked():
			s.ann.Sync(false, time.Now())
		case now := <-tick.C:
			// Beat when no reservation has carried a beat for two
			// heartbeat periods (see beatDue); probe four times a period
			// while in fallback, to return to shared mode soon after Redis
			// does.
			if s.fallback.Load() != nil || s.member.Since(now) >= idleBeat*s.cfg.heartbeat {
				s.beat()
			}
			// (A subscription whose client was closed is made again
			// once Redis answers; each channel's node is checked once
			// a heartbeat period.)
			if s.fallback.Load() == nil {
				s.ann.Sync(s.ann.Due(now, s.cfg.heartbeat), now)
			}
		}
	}
}

// beat sends a heartbeat and learns the live count; it also probes Redis:
// a failure enters fallback, a success leaves it.
func (s *shared) beat() {
	r, err := s.member.Beat(s.do, s.fallback.Load() != nil)
	if err != nil {
		s.failed(err)
		return
	}
	s.ann.Heard(r.Sharded)
	if fb := s.fallback.Swap(nil); fb != nil {
		s.lastFallback.Store(&fallbackState{limiter: fb.limiter, left: s.clock.Now()})
		if s.cfg.onFallback != nil {
			s.cfg.onFallback(s.name, false, nil)
		}
	}
}

// do runs f as a command to Redis, with the command timeout (see
// caller.Caller.Do).
func (s *shared) do(f func(context.Context) error) error { return s.calls.Do(context.Background(), f) }

// Heartbeats ride on reservations: a reservation made half a heartbeat
// period or more after the last beat carries one, in the same round trip
// (a pipeline), and the background goroutine beats only when none has for
// idleBeat periods. A busy instance then makes no round trip of its own
// for the fleet's count (at 64 instances of one worker each, the beats
// were 0.7 round trips per request sent, at 256 instances 1.3); an idle one makes
// one every idleBeat periods (two seconds by default), within the three
// periods an instance counts as live (instanceTTL).
const idleBeat = 2

// beatDue reports whether a reservation should carry a heartbeat.
func (s *shared) beatDue() bool {
	return s.fallback.Load() == nil && s.member.Since(time.Now()) >= s.cfg.heartbeat/2
}

// hear records what a key's script told the fleet (control.Told): a
// hold, a change of the key's rate that moves the turns given after a
// point (the end of the key's hold), or a SharedLimits' moved turns (see
// SharedLimits.moved). A message that cannot be read is not heard.
func (s *shared) hear(payload string) {
	t, ok := control.ParseTold(payload)
	if !ok {
		return
	}
	switch t.Kind {
	case control.ToldMoved:
		if s.onMoved != nil {
			s.onMoved(t.Key, t.Moved)
		}
	case control.ToldRate:
		now := s.clock.Now()
		s.retime(t.Key, t.Factor, now, now.Add(t.From), t.Seq)
	case control.ToldHold:
		now := s.clock.Now()
		s.heard(t.Key, pauseMark{until: now.Add(t.Left), heard: now, end: t.End, probes: t.Probes})
	}
}
