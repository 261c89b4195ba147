package egress

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/egress-go/egress/internal/clock"
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
	burst  int
	clock  clock.Clock
	policy atomic.Pointer[AdaptivePolicy] // nil: adaptive mode is off

	mu      sync.RWMutex
	buckets keyed[*tokenBucket] // guarded by mu
}

// tokenBucket is one key's bucket. x/time/rate needs the times it is given in
// order: a time read before another call's but used after it is moved up to
// last, under mu (reading the clock under mu would do too, but costs more
// under contention).
type tokenBucket struct {
	mu     sync.Mutex
	last   time.Time // guarded by mu; the latest time given to lim
	lim    *rate.Limiter
	adapt  *adaptState // guarded by mu; nil while the key has learnt nothing
	resume time.Time   // guarded by mu; the end of a pause, at which the bucket holds one token
}

func (b *tokenBucket) atRest(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lim.TokensAt(now) >= float64(b.lim.Burst()) && (b.adapt == nil || b.adapt.atRest(now)) &&
		(b.resume.IsZero() || now.Sub(b.resume) > sweepEvery)
}

// NewTokenBucket returns a token bucket per key with refill rate r and
// capacity burst (in cost units). It fails if r is not positive or burst < 1.
func NewTokenBucket(r Rate, burst int) (*TokenBucket, error) {
	if err := r.validate("NewTokenBucket: rate"); err != nil {
		return nil, err
	}
	if burst < 1 {
		return nil, configError("NewTokenBucket: burst", burst, "must be at least 1")
	}
	return newTokenBucket(r, burst), nil
}

// newTokenBucket is NewTokenBucket for settings known to be valid.
func newTokenBucket(r Rate, burst int) *TokenBucket {
	return &TokenBucket{
		rate:    r,
		limit:   rate.Limit(r.PerSecond()),
		burst:   burst,
		clock:   clock.Real{},
		buckets: newKeyed[*tokenBucket](),
	}
}

// Wait implements Limiter: it takes cost tokens from key's bucket, waiting
// for the refill when the bucket holds fewer. A cost above the burst fails at
// once with ErrCostTooHigh.
func (tb *TokenBucket) Wait(ctx context.Context, key string, cost int, maxWait time.Duration) (time.Duration, error) {
	if err := checkCost(key, cost, tb.burst); err != nil || cost == 0 {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	bk, r, delay, err := tb.reserve(key, cost, waitBudget(ctx, maxWait))
	if err != nil || delay == 0 {
		return 0, err
	}
	if err := sleep(ctx, tb.clock, delay); err != nil {
		// A bucket with a pending reservation is not at rest, so bk is
		// still the key's bucket.
		tb.mu.RLock()
		bk.mu.Lock()
		r.CancelAt(bk.inOrder(tb.clock.Now()))
		bk.mu.Unlock()
		tb.mu.RUnlock()
		return 0, err
	}
	return delay, nil
}

// reserve takes cost tokens from key's bucket, now. It returns no
// reservation and no delay when the tokens were there; otherwise the
// reservation and how long to wait for it, or a *LimitError when that wait
// does not fit in b (and then nothing is taken).
//
// An existing bucket is used under the read lock and its own mutex; the
// write lock is for adding keys and sweeping, so a bucket is never dropped
// while a call is using it.
func (tb *TokenBucket) reserve(key string, cost int, b budget) (*tokenBucket, *rate.Reservation, time.Duration, error) {
	tb.mu.RLock()
	if bk, ok := tb.buckets.m[key]; ok {
		now := tb.clock.Now()
		bk.mu.Lock()
		now = bk.inOrder(now)
		if !tb.buckets.sweepDue(now) {
			r, delay, err := bk.take(now, key, cost, b)
			bk.mu.Unlock()
			tb.mu.RUnlock()
			return bk, r, delay, err
		}
		bk.mu.Unlock()
	}
	tb.mu.RUnlock()
	tb.mu.Lock()
	defer tb.mu.Unlock()
	now := tb.clock.Now()
	bk := tb.bucket(key, now)
	r, delay, err := bk.take(bk.inOrder(now), key, cost, b)
	return bk, r, delay, err
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

// take takes cost tokens from the bucket at now, at the rate the key has
// learnt; see reserve. The caller holds b.mu or the write lock.
func (bk *tokenBucket) take(now time.Time, key string, cost int, b budget) (*rate.Reservation, time.Duration, error) {
	if !bk.resume.IsZero() && !now.Before(bk.resume) {
		// A pause has ended: resume at the rate, with one token, not with
		// the burst the bucket refilled meanwhile.
		bk.lim = rate.NewLimiter(bk.lim.Limit(), bk.lim.Burst())
		bk.lim.AllowN(now, bk.lim.Burst()-1)
		bk.resume = time.Time{}
	}
	lim := bk.lim
	if bk.adapt != nil {
		if l := rate.Limit(bk.adapt.rate(now)); l != lim.Limit() {
			lim.SetLimitAt(now, l)
		}
	}
	if lim.AllowN(now, cost) {
		return nil, 0, nil
	}
	r := lim.ReserveN(now, cost)
	delay := r.DelayFrom(now)
	if e := b.refuse(now, key, cost, delay); e != nil {
		r.CancelAt(now)
		return nil, 0, e
	}
	return r, delay, nil
}

// bucket returns key's bucket, making a full one if there is none. The
// caller holds mu for writing.
func (tb *TokenBucket) bucket(key string, now time.Time) *tokenBucket {
	if b, ok := tb.buckets.get(key, now); ok {
		return b
	}
	b := &tokenBucket{lim: rate.NewLimiter(tb.limit, tb.burst)}
	tb.buckets.put(key, b)
	return b
}

// Rate returns the configured rate.
func (tb *TokenBucket) Rate() Rate { return tb.rate }

// EffectiveRate returns the rate key is held to now: the configured rate,
// or lower when the provider advertised a lower limit or, in adaptive mode,
// throttled the key (see WithAdaptive).
func (tb *TokenBucket) EffectiveRate(key string) Rate {
	tb.mu.RLock()
	defer tb.mu.RUnlock()
	bk, ok := tb.buckets.m[key]
	if !ok {
		return tb.rate
	}
	bk.mu.Lock()
	defer bk.mu.Unlock()
	return effective(bk.adapt, tb.rate, tb.clock.Now())
}

func (tb *TokenBucket) setAdaptive(p AdaptivePolicy) { tb.policy.Store(&p) }

// resumeAt makes key's bucket hold one token when a pause ends at until
// (see resumer).
func (tb *TokenBucket) resumeAt(key string, until time.Time) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	bk := tb.bucket(key, tb.clock.Now())
	bk.resume = maxTime(bk.resume, until)
}

// learn applies what a response taught about key's limit.
func (tb *TokenBucket) learn(_ context.Context, key string, l lesson) (old, new float64, err error) {
	tb.mu.RLock()
	if bk, ok := tb.buckets.m[key]; ok {
		bk.mu.Lock()
		old, new = tb.apply(bk, l)
		bk.mu.Unlock()
		tb.mu.RUnlock()
		return old, new, nil
	}
	tb.mu.RUnlock()
	tb.mu.Lock()
	defer tb.mu.Unlock()
	old, new = tb.apply(tb.bucket(key, tb.clock.Now()), l)
	return old, new, nil
}

// apply applies l to bk. The caller holds bk.mu or the write lock.
func (tb *TokenBucket) apply(bk *tokenBucket, l lesson) (old, new float64) {
	now := bk.inOrder(tb.clock.Now())
	old, new = learnInto(&bk.adapt, tb.rate, tb.policy.Load(), now, l)
	if new != old {
		bk.lim.SetLimitAt(now, rate.Limit(new))
	}
	return old, new
}
