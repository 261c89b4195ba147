package egress

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/control"
	"github.com/egress-go/egress/internal/keyed"
)

// TokenBucket is a local token bucket per key, built on golang.org/x/time/rate.
//
// Each key's bucket holds up to burst tokens and refills at the rate; a
// request takes as many tokens as it costs. A full bucket lets a burst of
// requests through at once, after which they are spaced to the rate: over any
// window w, a key admits at most rate·w + burst cost units. Choose it for
// callers whose traffic comes in bursts, in front of a provider that allows
// them. Waiters are served in order of arrival; a waiter whose context ends
// gives its tokens back.
//
// A key's bucket is created on first use and dropped once it has refilled
// completely and a sweep (at most once a minute, done lazily by the calls
// themselves) finds it so; a dropped bucket is indistinguishable from a full
// one, so eviction never lets extra requests through. No goroutine runs in
// the background.
//
// The limit holds within one process. For a fleet, see the shared limiters.
// A TokenBucket is safe for simultaneous use by multiple goroutines.
type TokenBucket struct {
	rate   Rate
	limit  rate.Limit
	burst  int     // the configured burst: the largest cost granted
	margin float64 // units of the burst kept in reserve for transit jitter (see jitterMargin)
	learn  control.Config
	clock  clock.Clock
	seed   func(key string, now time.Time) *control.State // a new key's controller state; nil: none

	mu      sync.RWMutex
	buckets keyed.Map[*tokenBucket] // guarded by mu

	// The bucket of the key granted last, and when the map's next sweep is
	// due (in Unix nanoseconds): a grant for the same key, before then,
	// takes the bucket without mu and the map (see reserveAt).
	hot     atomic.Pointer[tokenBucket]
	sweepAt atomic.Int64
}

// tokenBucket is one key's bucket. x/time/rate needs the times it is given in
// order: a time read before another call's but used after it is moved up to
// last, under mu (reading the clock under mu would do too, but costs more
// under contention).
//
// The fields guarded by mu are read and written under mu whatever lock of
// the limiter's the caller holds: the limiter's lock guards its map of
// buckets, not what is in them (a Transport learns holding mu alone: see
// learnAt). lim, which has a lock of its own, is used under mu too.
type tokenBucket struct {
	key     string
	mu      sync.Mutex
	last    time.Time       // guarded by mu; the latest time given to rl
	seen    time.Time       // guarded by mu; the latest clock reading a grant was given (see fresh)
	rl      *rate.Limiter   // read it here; change it through limiter
	limit   rate.Limit      // guarded by mu; rl's limit, kept here so that a grant need not take rl's lock to read it (see startAt)
	known   knownTokens     // guarded by mu; what rl holds after the last grant that went at once (see tokensAt)
	dropped bool            // guarded by mu; a sweep found the bucket at rest and dropped it from the map (see learnAt)
	ctl     *control.State  // guarded by mu; nil while the key has learnt nothing
	learn   *control.Config // the limiter's
	resume  time.Time       // guarded by mu; the end of a hold, at which the bucket holds one token
	waiting []*turn         // guarded by mu; the turns reserved and still to come, which the key's rate changes move (see retime)
	moved   chan struct{}   // guarded by mu; closed when they move earlier; nil until a waiter asks for it
	owed    float64         // guarded by mu; the fraction of a token a raise left owed (see setRate)
	// quiets counts the silent responses learnt without mu (see learnAt),
	// which lock applies to ctl; unlock opens it while it may count.
	quiets control.Quiets
}

// lock takes mu, and applies to the key's controller the silent
// responses counted without it (see learnAt).
func (b *tokenBucket) lock() {
	b.mu.Lock()
	if b.ctl != nil {
		b.ctl.Settle(&b.quiets)
	}
}

// unlock opens the count of silent responses while the key's controller
// may take one without mu (it does not listen for a reset's meaning, its
// meter has begun, and the bucket is not dropped; see control.Quiets),
// closes it otherwise (a dropped bucket's, then applying what was counted
// before the close), and lets mu go.
func (b *tokenBucket) unlock() {
	if b.ctl != nil {
		b.quiets.Open(b.ctl, !b.dropped)
		if b.dropped {
			b.ctl.Settle(&b.quiets) // what was counted before the close
		}
	}
	b.mu.Unlock()
}

// knownTokens is what a bucket's x/time/rate limiter holds after a grant
// at once (allow): its tokens, as of at. Until anything else changes the
// limiter (limiter clears it), the tokens at a later time are these and
// the refill since, which tokensAt works out as the limiter's own advance
// does, to the bit, without its lock: a grant at once takes that lock
// once (AllowN), not twice. (Two lock pairs were 14 ns of the allowed
// path's 294.)
type knownTokens struct {
	at     time.Time
	tokens float64
	ok     bool
}

// limiter returns the bucket's x/time/rate limiter, for a caller that may
// change it: what the bucket knew of its tokens no longer holds. The
// caller holds mu.
func (b *tokenBucket) limiter() *rate.Limiter {
	b.known.ok = false
	return b.rl
}

// tokensAt returns the tokens the bucket holds at at: rl.TokensAt(at),
// worked out from known when it holds (x/time/rate's advance: the tokens
// known, and the refill since at the limit, up to the burst), else asked
// of rl. The caller holds mu.
func (b *tokenBucket) tokensAt(at time.Time, burst int) float64 {
	if !b.known.ok || at.Before(b.known.at) {
		return b.rl.TokensAt(at)
	}
	tokens := b.known.tokens + at.Sub(b.known.at).Seconds()*float64(b.limit)
	if burst := float64(burst); tokens > burst {
		tokens = burst
	}
	return tokens
}

// allow takes cost of the tokens the bucket holds at at (tokens, which
// tokensAt returned), and knows what rl holds then (an infinite rate takes
// none: rl does not count them). The caller holds mu.
func (b *tokenBucket) allow(at time.Time, cost int, tokens float64) {
	b.rl.AllowN(at, cost)
	b.known = knownTokens{at: at, tokens: tokens - float64(cost), ok: b.limit != rate.Inf}
}

// turn is when a reserved turn is due, as the changes of the key's rate
// since it was reserved move it (see retime), and its place in the
// bucket's list of them (-1 once done).
type turn struct {
	due time.Time
	i   int
}

// retime moves the turns reserved and still to come by factor (the old
// rate over the new) from from (the end of the key's hold, or now: the
// turns inside a hold are taken again after it), as the controller
// changes the key's rate: a decrease spreads them at the new rate, and a
// raise brings them in and wakes their waiters. Otherwise the turns given
// ahead — 32 waiters are 1.6 s of them at 20/s — go at the rate they were
// given at: after a decrease, faster than the provider allows, each
// meeting a refusal of its own; after a raise, slower than the key's rate,
// so that what the provider's counts say of the rate (see roomy) is that
// much old. (Before raises moved them, a climb sped by counts of room at
// the queue's 19/s reached 31/s against a limit of 20/s before its own
// turns came out, and met 9 refusals in 5 s, in scenario B of the fleet
// benchmark at that ratio.) The fleet's turns move the same way (see
// retimings). The caller holds b.mu.
func (b *tokenBucket) retime(from time.Time, factor float64) {
	if !(factor > 0) || factor == 1 || math.IsInf(factor, 0) {
		return
	}
	l := control.Lowering{From: from, Factor: factor}
	for _, t := range b.waiting {
		t.due = l.Move(t.due)
	}
	if factor < 1 && b.moved != nil {
		close(b.moved)
		b.moved = nil
	}
}

// wait adds t to the turns still to come. The caller holds b.mu.
func (b *tokenBucket) wait(t *turn) {
	t.i = len(b.waiting)
	b.waiting = append(b.waiting, t)
}

// done forgets t, in constant time (10,000 waiters cancelled at once each
// forget theirs): its waiter goes, or gives its tokens back. The caller
// holds b.mu.
func (b *tokenBucket) done(t *turn) {
	if t.i < 0 {
		return
	}
	last := len(b.waiting) - 1
	b.waiting[t.i] = b.waiting[last]
	b.waiting[t.i].i = t.i
	b.waiting[last] = nil
	b.waiting = b.waiting[:last]
	t.i = -1
}

// setRate sets b's rate to l at t. x/time/rate counts the turns reserved
// and not yet come as tokens owed, which a raise repays at the new rate;
// but those turns keep the times they were given, at the old rate, and the
// next turns would be given among them: for as long as the queue lasts
// the key would go at the old rate and the new one at once, and meet a
// refusal. So a raise scales what is owed by the raise, to the same time:
// the next turn comes after the queue, at the new rate (as the fleet's
// GCRA, which counts what is owed as time, does). That is for the climb
// between responses, a step at a time, which leaves the turns given
// where they are (a response's changes move them: see retime); a jump by
// more than raiseJump is a limit restored (or tried again: see aimBack),
// and a queue given at a fraction of it would hold the key there for as
// long as it lasts: the queue is brought in, as a response's raise brings
// it in, and the next turns follow it at the new rate. (Left where they
// were, the turns of 32 callers given at 37/s went beside the next ones
// given at 95/s, and a provider whose limit was back at 100/s refused
// the key: the fleet benchmark's scenario B'.) A decrease needs nothing:
// the turns reserved before it are spread (see retime).
func (b *tokenBucket) setRate(t time.Time, l rate.Limit) {
	lim := b.limiter()
	old, owe := lim.Limit(), b.owed-lim.TokensAt(t)
	jump := l > old*raiseJump
	lim.SetLimitAt(t, l)
	b.limit = l
	if owe <= 0 || jump {
		b.owed = 0
	}
	if jump && old > 0 && l != rate.Inf {
		b.retime(t, float64(old)/float64(l))
	}
	if owe <= 0 || !(l > old) || jump || old <= 0 || l == rate.Inf {
		return
	}
	b.owed += owe * (float64(l)/float64(old) - 1)
	for n := int(b.owed + 1e-9); n > 0; n = int(b.owed + 1e-9) { // (1e-9: a sum of fractions that makes a whole)
		k := min(n, lim.Burst())
		lim.ReserveN(t, k)
		b.owed -= float64(k)
	}
}

// raiseJump is the largest raise of a TokenBucket's rate at once that
// keeps its queue (see setRate).
const raiseJump = 1.5

// AtRest reports whether the bucket is back to a new one's state at now.
// The sweep that asks drops it then, so a bucket at rest is marked
// dropped: a Transport that holds it from a grant learns through the map
// again (see learnAt).
func (b *tokenBucket) AtRest(now time.Time) bool {
	b.lock()
	defer b.unlock()
	rest := b.rl.TokensAt(now) >= float64(b.rl.Burst()) && (b.ctl == nil || b.ctl.AtRest(b.learn, now)) &&
		(b.resume.IsZero() || now.Sub(b.resume) > keyed.SweepEvery)
	b.dropped = b.dropped || rest
	return rest
}

// jitterMargin is how many units of a burst of burst at r per second a
// limiter keeps in reserve to absorb a variation d of transit time (see
// WithTransitMargin): r·d, a fraction of a unit at most rates, and never
// more than burst−1, so that one unit is always there to use.
func jitterMargin(r Rate, burst int, d time.Duration) float64 {
	return max(0, min(r.PerSecond()*d.Seconds(), float64(burst-1)))
}

// jitterTolerance is the default of WithTransitMargin.
const jitterTolerance = 5 * time.Millisecond

// transitMargin returns the tolerance the options set.
func (o learnOptions) transitMargin() time.Duration {
	if o.margin == nil {
		return jitterTolerance
	}
	return *o.margin
}

// NewTokenBucket returns a token bucket per key with refill rate r and
// capacity burst (in cost units). It fails if r is not positive, burst < 1
// or an option is invalid. The options say how keys learn from responses
// (by default: advertised limits and discovery on).
func NewTokenBucket(r Rate, burst int, opts ...LimiterOption) (*TokenBucket, error) {
	const op = "NewTokenBucket"
	if err := r.validate(op + ": rate"); err != nil {
		return nil, err
	}
	if burst < 1 {
		return nil, configError(op+": burst", burst, "must be at least 1")
	}
	lc, o, err := limiterOptions(op, r, opts)
	if err != nil {
		return nil, err
	}
	tb := newTokenBucket(r, burst)
	tb.learn, tb.margin = lc, jitterMargin(r, burst, o.transitMargin())
	return tb, nil
}

// newTokenBucket is NewTokenBucket for settings known to be valid, learning
// as by default.
func newTokenBucket(r Rate, burst int) *TokenBucket {
	m := jitterMargin(r, burst, jitterTolerance)
	return &TokenBucket{
		rate:    r,
		limit:   rate.Limit(r.PerSecond()),
		burst:   burst,
		margin:  m,
		learn:   control.DefaultConfig(r.PerSecond()),
		clock:   clock.Real{},
		buckets: keyed.New[*tokenBucket](),
	}
}

// Wait implements Limiter: it takes cost tokens from key's bucket, waiting
// for the refill when the bucket holds fewer, and for the end of the key's
// hold, if any. A cost above the burst fails at once with ErrCostTooHigh.
func (tb *TokenBucket) Wait(ctx context.Context, key string, cost int, maxWait time.Duration) (time.Duration, error) {
	waited, _, err := tb.waitFrom(ctx, key, cost, maxWait, time.Time{})
	return waited, err
}

// waitFrom is Wait for a caller that has just read tb's clock, at now
// (zero: it has not, and the clock is read here). It returns the grant
// too: its bucket, and, when the tokens were there at once, the time they
// were taken at (g.at, with no delay). A Transport sends at that time
// without reading the clock again, and learns from the response in that
// bucket (see learnAt).
func (tb *TokenBucket) waitFrom(ctx context.Context, key string, cost int, maxWait time.Duration, now time.Time) (time.Duration, grant, error) {
	if err := checkCost(key, cost, tb.burst); err != nil || cost == 0 {
		return 0, grant{}, err
	}
	if err := ctx.Err(); err != nil {
		return 0, grant{}, err
	}
	var waited time.Duration
	for {
		g, err := tb.reserveAt(key, cost, waitBudget(ctx, remaining(maxWait, waited)), now)
		if err != nil || g.delay == 0 {
			return waited, g, err
		}
		now = time.Time{} // after a wait, the clock is read again
		given := g.at.Add(g.delay)
		for {
			now := tb.clock.Now()
			due, moved := tb.due(g)
			lag := due.Sub(now)
			if lag <= 0 {
				break
			}
			if due.After(given) {
				// The key's rate was lowered after the turn was reserved:
				// it goes at the new rate, if the caller can wait that long.
				if e := waitBudget(ctx, remaining(maxWait, waited)).refuse(now, key, cost, lag); e != nil {
					tb.cancel(g)
					return 0, grant{}, e
				}
			}
			if err := sleepOr(ctx, tb.clock, lag, moved); err != nil {
				tb.cancel(g)
				return 0, grant{}, err
			}
			waited += tb.clock.Now().Sub(now)
		}
		if tb.commit(g, cost) {
			return waited, g, nil
		}
		// A hold began after the tokens were reserved and covers their
		// time, or the key's budget is spent and holds it now: give them
		// back and take them again after the hold.
		tb.cancel(g)
	}
}

// grant is a reservation of a key's tokens, the time it was made at, how
// long to wait for it, and its turn as the key's rate moves it. Tokens
// there at once are a grant with no delay, no reservation and no turn.
type grant struct {
	bk    *tokenBucket
	r     *rate.Reservation
	at    time.Time
	delay time.Duration
	t     *turn
}

// due returns when g's request is due, and a channel closed when its turn
// moves earlier (see retime).
func (tb *TokenBucket) due(g grant) (time.Time, <-chan struct{}) {
	g.bk.lock()
	defer g.bk.unlock()
	if g.bk.moved == nil {
		g.bk.moved = make(chan struct{})
	}
	return g.t.due, g.bk.moved
}

// cancel gives a grant's tokens back. A bucket with a pending reservation
// is not at rest, so bk is still the key's bucket.
func (tb *TokenBucket) cancel(g grant) {
	tb.mu.RLock()
	defer tb.mu.RUnlock()
	g.bk.lock()
	defer g.bk.unlock()
	g.bk.done(g.t)
	g.bk.limiter() // (the reservation changes the limiter: what the bucket knew of it goes)
	g.r.CancelAt(g.bk.inOrder(tb.clock.Now()))
}

// commit makes g, a grant of cost whose wait is over, final: it reports
// false when the key was held after g was reserved, by a hold that has not
// ended, or when the key's budget (what the provider's last report leaves,
// see control.State.Spend) has not cost units left, which holds the key.
// The budget is spent when a request goes, not when its turn is reserved,
// so that a report heard meanwhile counts it as it should: in flight once
// it is sent, from the budget until then.
func (tb *TokenBucket) commit(g grant, cost int) bool {
	tb.mu.RLock()
	defer tb.mu.RUnlock()
	g.bk.lock()
	defer g.bk.unlock()
	ctl, now := g.bk.ctl, tb.clock.Now()
	g.bk.done(g.t)
	if ctl == nil {
		return true
	}
	if ctl.Hold.After(g.at) && ctl.Hold.After(now) {
		return false
	}
	return tb.spendLocked(g.bk, now, g.t.due, cost)
}

// spendLocked spends cost units of bk's budget for a request granted at
// now at its turn turn; when they are not there, the key is now held (see
// control.State.Spend) and the bucket resumes at the rate after the hold. A
// probe after a hold, granted, holds the key a gap after its turn in the
// same way. The caller holds bk.mu.
func (tb *TokenBucket) spendLocked(bk *tokenBucket, now, turn time.Time, cost int) bool {
	ok := bk.ctl.Spend(now, turn, cost, bk.ctl.Rate(&tb.learn, now))
	if bk.ctl.Hold.After(now) {
		bk.resume = clock.Later(bk.resume, bk.ctl.Hold)
	}
	return ok
}

// reserve takes cost tokens from key's bucket, now or, while the key is
// held, at the hold's end. It returns a grant with no delay when the tokens
// were there; otherwise the grant and how long to wait for it, or a
// *LimitError when that wait does not fit in b (and then nothing is taken).
func (tb *TokenBucket) reserve(key string, cost int, b budget) (grant, error) {
	return tb.reserveAt(key, cost, b, time.Time{})
}

// reserveAt is reserve at now, a reading of tb's clock its caller has just
// taken (zero: the clock is read here). A grant of tokens there at once
// has its bucket and its time (see waitFrom).
//
// The bucket of the key granted last is used under its own mutex alone
// while no sweep has dropped it (see AtRest) and none is due: a bucket
// not dropped is the key's, and a sweep takes its mutex to drop it. (The
// read lock's two atomic operations were a tenth of the allowed path.)
// Another existing bucket is used under the read lock and its own mutex;
// the write lock is for adding keys and sweeping, so a bucket is never
// dropped while a call is using it. The write lock waits for the readers,
// and then the clock is read again.
func (tb *TokenBucket) reserveAt(key string, cost int, b budget, now time.Time) (grant, error) {
	if bk := tb.hot.Load(); bk != nil && bk.key == key {
		if now.IsZero() {
			now = tb.clock.Now()
		}
		bk.lock()
		if !bk.dropped && now.UnixNano() < tb.sweepAt.Load() {
			g, err := tb.take(bk, now, key, cost, b)
			bk.unlock()
			return g.of(bk, now, err)
		}
		bk.unlock()
	}
	tb.mu.RLock()
	if bk, ok := tb.buckets.M[key]; ok {
		if now.IsZero() {
			now = tb.clock.Now()
		}
		bk.lock()
		if !tb.buckets.SweepDue(now) {
			g, err := tb.take(bk, now, key, cost, b)
			bk.unlock()
			tb.mu.RUnlock()
			if tb.hot.Load() != bk {
				tb.hot.Store(bk)
			}
			return g.of(bk, now, err)
		}
		bk.unlock()
	}
	tb.mu.RUnlock()
	tb.mu.Lock()
	defer tb.mu.Unlock()
	now = tb.clock.Now()
	bk := tb.bucket(key, now)
	tb.hot.Store(bk)
	bk.lock()
	defer bk.unlock()
	g, err := tb.take(bk, now, key, cost, b)
	return g.of(bk, now, err)
}

// of returns g, taken from bk at now, and err, take's: a grant of tokens
// there at once gets them (a reservation has them already).
func (g grant) of(bk *tokenBucket, now time.Time, err error) (grant, error) {
	if err == nil && g.delay == 0 {
		g.bk, g.at = bk, now
	}
	return g, err
}

// fresh returns now, a reading of the clock for a grant, or the latest
// reading a grant of bk was given when that is later, and records the
// latest. A reading taken before another caller's whose grant took bk.mu
// first is stale: the clock has read that caller's time since, so the
// time is that at least. (Taken as it was, the grant was given the later
// time by inOrder and counted the difference as a wait: under contention,
// requests whose tokens were there went the way of a waiter, a
// reservation and a turn, to wait out a few nanoseconds.) The caller holds
// bk.mu.
func (bk *tokenBucket) fresh(now time.Time) time.Time {
	if now.Before(bk.seen) {
		return bk.seen
	}
	bk.seen = now
	return now
}

// inOrder returns now, or the latest time the bucket was given if now is
// earlier, and records it. The caller holds bk.mu or the write lock.
func (bk *tokenBucket) inOrder(now time.Time) time.Time {
	if now.Before(bk.last) {
		return bk.last
	}
	bk.last = now
	return now
}

// take takes cost tokens from bk at now (or at the end of its hold), at the
// rate the key has learnt; see reserve. The caller holds bk.mu or the write
// lock.
//
// now is the clock's time, from which the delay is counted; the bucket is
// given the later of it, the hold's end and the latest time it was given.
func (tb *TokenBucket) take(bk *tokenBucket, now time.Time, key string, cost int, b budget) (grant, error) {
	now = bk.fresh(now)
	at := tb.startAt(bk, now)
	// The margin: a request goes at once only if it leaves margin units in
	// the bucket; otherwise it waits until the bucket would hold them too
	// (they are not taken: later requests find them).
	tokens := bk.tokensAt(at, tb.burst)
	need := float64(cost) + tb.margin
	if !at.After(now) && tokens >= need {
		if bk.ctl == nil || tb.spendLocked(bk, at, at, cost) {
			bk.allow(at, cost, tokens)
			return grant{}, nil
		}
		// The budget is spent: the key is held from now.
		lim := bk.limiter()
		at = bk.inOrder(bk.ctl.Hold)
		drainTo(lim, at, 1)
		bk.resume = time.Time{}
		tokens = lim.TokensAt(at)
	} else if !at.After(now) && tokens >= float64(cost) && b.refuse(now, key, cost, 0) == nil &&
		time.Duration((need-tokens)/float64(bk.limit)*float64(time.Second)) <= 0 {
		// Short of the margin by less than a nanosecond's refill (two
		// grants at one reading of the clock, at 10¹² a second): the wait
		// below comes to none, and the reservation, its tokens there, to
		// what AllowN takes, without the Reservation ReserveN allocates.
		// (startAt made bk.limit rl's limit.)
		bk.allow(at, cost, tokens)
		if bk.ctl != nil {
			tb.spendLocked(bk, now, now, cost)
		}
		return grant{}, nil
	}
	lim := bk.limiter()
	g := grant{bk: bk, at: now, r: lim.ReserveN(at, cost)}
	g.delay = max(g.r.DelayFrom(now), at.Sub(now)+time.Duration((need-tokens)/float64(lim.Limit())*float64(time.Second)))
	if bk.owed > 0 && g.delay > 0 {
		// The fraction of a token a raise left owed (see setRate) comes
		// before this turn too: without it, the turn came up to a unit
		// early, next to the one given before it (two requests 2 ms apart,
		// the second refused by a provider with no burst).
		g.delay += time.Duration(bk.owed / float64(lim.Limit()) * float64(time.Second))
	}
	if e := b.refuse(now, key, cost, g.delay); e != nil {
		g.r.CancelAt(at)
		return grant{}, e
	}
	if g.delay <= 0 {
		if bk.ctl != nil {
			tb.spendLocked(bk, now, now, cost)
		}
		return grant{}, nil
	}
	g.t = &turn{due: now.Add(g.delay)}
	bk.wait(g.t)
	return g, nil
}

// startAt returns the time a grant at now is taken at: now, or the end of
// the key's hold, moved up to the latest time bk was given (see inOrder).
// The bucket is brought to that time: a hold ended, it resumes with one
// token; and at the key's rate then. The caller holds bk.mu.
func (tb *TokenBucket) startAt(bk *tokenBucket, now time.Time) time.Time {
	at := now
	if bk.ctl != nil && bk.ctl.Hold.After(at) {
		at = bk.ctl.Hold
	}
	at = bk.inOrder(at)
	if !bk.resume.IsZero() && !at.Before(bk.resume) {
		// A hold has ended: resume at the rate, with at most one token, not
		// with the burst the bucket refilled meanwhile (and never with more
		// than it holds: turns reserved before stay owed).
		drainTo(bk.limiter(), at, 1)
		bk.resume = time.Time{}
	}
	if bk.ctl != nil {
		// (The limit is compared with bk.limit, not with lim's, whose
		// lock a grant would take once more.)
		if l := rate.Limit(bk.ctl.Rate(&tb.learn, at)); l != bk.limit {
			if l != bk.rl.Limit() {
				bk.setRate(at, l)
			}
			bk.limit = l
		}
	}
	return at
}

// drainTo takes tokens from lim at t until it holds at most keep; it never
// adds any.
func drainTo(lim *rate.Limiter, t time.Time, keep float64) {
	if n := int(lim.TokensAt(t) - keep); n > 0 {
		lim.ReserveN(t, n)
	}
}

// bucket returns key's bucket, making a full one if there is none. The
// caller holds mu for writing.
func (tb *TokenBucket) bucket(key string, now time.Time) *tokenBucket {
	b, ok := tb.buckets.Get(key, now)
	tb.sweepAt.Store(unixNano(tb.buckets.LastSweep.Add(tb.buckets.Every)))
	if ok {
		return b
	}
	b = &tokenBucket{key: key, rl: rate.NewLimiter(tb.limit, tb.burst), limit: tb.limit, learn: &tb.learn}
	if tb.seed != nil {
		if b.ctl = tb.seed(key, now); b.ctl != nil {
			b.limit = rate.Limit(b.ctl.Rate(&tb.learn, now))
			b.limiter().SetLimitAt(now, b.limit)
		}
	}
	tb.buckets.Put(key, b)
	return b
}

// unixNano is t.UnixNano(), or the largest such number for a time after
// the year 2262, which it cannot tell (a test's sweep that is never due).
func unixNano(t time.Time) int64 {
	if t.After(time.Unix(0, math.MaxInt64)) {
		return math.MaxInt64
	}
	return t.UnixNano()
}

// Rate returns the configured rate.
func (tb *TokenBucket) Rate() Rate { return tb.rate }

// EffectiveRate returns the rate key is held to now: the configured rate,
// or lower when the provider advertised a lower limit or discovery lowered
// it (see WithAdaptive).
func (tb *TokenBucket) EffectiveRate(key string) Rate {
	tb.mu.RLock()
	defer tb.mu.RUnlock()
	bk, ok := tb.buckets.M[key]
	if !ok {
		return tb.rate
	}
	bk.lock()
	defer bk.unlock()
	return effectiveRate(bk.ctl, &tb.learn, tb.rate, tb.clock.Now())
}

// Learn implements Learner: key's controller applies what a response said
// (the README's "How egress learns a limit"). A hold empties the bucket as
// of its end but for one token, so that the key resumes at its rate rather
// than in a burst.
func (tb *TokenBucket) Learn(_ context.Context, key string, s Signal) Decision {
	r := s.response()
	tb.mu.RLock()
	if bk, ok := tb.buckets.M[key]; ok {
		bk.lock()
		d := tb.learnLocked(bk, &r)
		bk.unlock()
		tb.mu.RUnlock()
		return d
	}
	tb.mu.RUnlock()
	tb.mu.Lock()
	defer tb.mu.Unlock()
	bk := tb.bucket(key, tb.clock.Now())
	bk.lock()
	defer bk.unlock()
	return tb.learnLocked(bk, &r)
}

// learnAt is Learn in bk, the bucket that granted the request whose
// response s is (see waitFrom): without the limiter's lock and its map,
// which a Transport's request has just been through to reserve. A bucket
// is the key's as long as no sweep has dropped it (see AtRest); once one
// has, s is learnt in the key's bucket of the moment, as Learn does.
//
// A response that says nothing of the limit (the allowed path's: see
// control.State.Silent) is only counted: it is not read into a Response,
// and decides nothing; while the key's controller allows, it is counted
// without bk's lock (control.Quiets: a lock pair was 15 ns of the path's
// 255, and the 64 goroutines' convoy on it 150 of 950). A zero s.Now says
// that the Transport, whose clock is tb's, did not read it: such a
// response does not need it. learnAt reads it, into s, when s needs it.
func (tb *TokenBucket) learnAt(bk *tokenBucket, key string, s *Signal) Decision {
	plain := s.plain()
	if plain && bk.quiets.Add(s.SentAt) {
		return Decision{} // counted, without the lock: see control.Quiets
	}
	bk.lock()
	if !bk.dropped {
		if bk.ctl == nil {
			bk.ctl = &control.State{} // (as learnLocked would)
		}
		if plain && !bk.ctl.Listens() {
			bk.ctl.Quiet(s.SentAt)
			bk.unlock()
			return Decision{}
		}
		if s.Now.IsZero() {
			s.Now = tb.clock.Now()
		}
		r := s.response()
		d := tb.learnLocked(bk, &r)
		bk.unlock()
		return d
	}
	bk.unlock()
	if s.Now.IsZero() {
		s.Now = tb.clock.Now()
	}
	return tb.Learn(context.Background(), key, *s)
}

// learnLocked applies s to bk. The caller holds bk.mu, and knows bk to be
// the key's bucket: it holds tb.mu (read or write) and found bk in the
// map, or bk is not dropped (see learnAt). A response that says nothing
// of the limit is counted and decides nothing (see control.State.Silent),
// and nothing below reads its time.
func (tb *TokenBucket) learnLocked(bk *tokenBucket, s *control.Response) Decision {
	if bk.ctl == nil {
		bk.ctl = &control.State{}
	}
	d := bk.ctl.Learn(&tb.learn, s)
	if !d.Hold.IsZero() {
		bk.resume = clock.Later(bk.resume, d.Hold)
	}
	if d.Drain {
		// The provider's bucket holds d.Keep once the requests in flight
		// are counted: this one holds no more, as of now (owing, below 0).
		drainTo(bk.limiter(), bk.inOrder(s.Now), d.Keep)
	}
	if d.Why == "throttled" {
		// The throttles that the turns reserved before the decrease meet
		// belong to this episode too, until the last of them, spread at
		// the new rate (below).
		now := bk.inOrder(s.Now)
		if backlog := -bk.rl.TokensAt(now) / d.New; backlog > 0 {
			bk.ctl.Decreased = clock.Later(bk.ctl.Decreased, now.Add(time.Duration(backlog*float64(time.Second))))
		}
	}
	// The change s made to the key's rate, told or not (a climb sped by
	// room is not told): the turns reserved move with it (see retime).
	if d.To != d.From {
		now, l := bk.inOrder(tb.clock.Now()), rate.Limit(d.To)
		switch {
		case d.To < d.From:
			bk.setRate(now, l)
		case l > bk.rl.Limit():
			// (Brought in, the turns given owe what they did: repaid at
			// the new rate, the next turn comes after the last of them.)
			bk.limiter().SetLimitAt(now, l)
			bk.limit = l
		}
		bk.retime(clock.Later(now, bk.ctl.Hold), d.From/d.To)
	}
	return decided(d)
}
