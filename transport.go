package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/egress-go/egress/internal/argv"
	"github.com/egress-go/egress/internal/clock"
)

// Transport is an http.RoundTripper that holds outbound requests to the rate
// its Limiter allows, key by key, honours the holds providers ask for, and
// retries what is safe to retry.
//
// For each request it computes the key (KeyFunc, the host by default) and the
// cost (CostFunc, 1 by default), takes one of the key's in-flight slots when
// WithInFlightLimit caps them, waits for the limiter to grant that cost (and
// for any hold of the key to end), then sends the request through the base
// RoundTripper. It reads every response into a Signal and hands it to
// the key's controller — the limiter's, when the limiter is a Learner, or
// the Transport's own — which decides whether the key is held, its rate
// changed, or only this request delayed (see Learner). Retry-After is capped
// by WithMaxPause, an exhausted quota's reset by WithMaxQuotaHold. With
// WithRetry, failed attempts are sent again as RetryPolicy describes; each
// attempt passes the limiter again. A request the limiter
// refuses (its wait would outlast the context's deadline or the maximum
// wait, its queue is full, its cost is too high) is not sent: RoundTrip
// returns a *LimitError that matches ErrRateLimited, and closes the request
// body. A request whose context ends while it waits returns the context's
// error.
//
// A Transport without a limiter (no WithLimiter option) sends every request
// unthrottled; it still honours holds. Without WithRetry it sends each
// request once.
//
// Transport keeps the http.RoundTripper contract: it does not modify the
// request, it returns either a response or an error, and it closes the
// request body on every path where it does not send it. It is safe for
// simultaneous use by multiple goroutines.
type Transport struct {
	base         http.RoundTripper
	limiter      Limiter
	inFlight     InFlightLimiter // nil: no cap
	keyFunc      func(*http.Request) string
	costFunc     func(*http.Request) int
	costs        func(*http.Request) Cost // WithCosts; nil: costFunc
	costLimiter  CostLimiter              // the limiter, with WithCosts
	maxWait      time.Duration
	obs          Observer
	retry        *RetryPolicy // nil: no retries
	budget       retryBudget  // used when retry != nil
	resends      *resends     // the calls ended with an error, for an SDK's resends; nil with no retry or RetryPolicy.SDKRetries
	maxPause     time.Duration
	maxQuotaHold time.Duration
	learner      Learner      // the limiter, when it is one; else the Transport's own holds
	quick        *TokenBucket // the limiter, when it is a TokenBucket and nothing else holds a request up (see quickBucket); nil otherwise
	holds        *holds       // the Transport's own holds, when the limiter is not a Learner; nil otherwise
	clock        clock.Clock
	rand         func() float64 // the backoff's random source; nil: math/rand/v2
	signals      signalConfig   // how responses are read (dialect.go)
	sending      *keyCounts     // per key, the attempts sent and not answered yet
	shadow       bool           // compute and report, do not enforce
	nearLimit    float64        // the ratio of remaining to limit below which a key is near its limit
	near         *keyCounts     // per key, 1 while it was last reported near its limit
	gate         *gate          // WithPriorities: the keys' priority queues; nil otherwise
}

// New returns a Transport that sends requests through base, which defaults
// to http.DefaultTransport when nil. It fails, naming the option and the
// value, when an option is invalid.
func New(base http.RoundTripper, opts ...Option) (*Transport, error) {
	c, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if base == nil {
		base = http.DefaultTransport
	}
	t := &Transport{
		base:         base,
		limiter:      c.limiter,
		inFlight:     c.inFlight,
		keyFunc:      c.keyFunc,
		costFunc:     c.costFunc,
		costs:        c.costs,
		maxWait:      c.maxWait,
		obs:          c.observer,
		retry:        c.retry,
		maxPause:     c.maxPause,
		maxQuotaHold: c.maxQuota,
		clock:        clock.Real{},
		signals:      c.signals,
		sending:      newKeyCounts(),
		shadow:       c.shadow,
		nearLimit:    c.near,
		near:         newKeyCounts(),
	}
	if c.costs != nil {
		t.costLimiter = c.limiter.(CostLimiter) // checkCosts made sure
	}
	if !c.costFuncSet {
		t.costFunc = nil // a request costs one, without a call (see costOf)
	}
	if t.retry != nil {
		t.budget = retryBudget{ratio: t.retry.BudgetRatio, floor: t.retry.BudgetFloor}
		if !t.retry.SDKRetries {
			t.resends = new(resends)
		}
	}
	if l, ok := c.limiter.(Learner); ok {
		t.learner = l
	} else {
		t.holds = newHolds(&t.clock)
		t.learner = t.holds
	}
	if c.priorities != nil && !t.shadow {
		t.gate = newGate(*c.priorities, &t.clock, t.limiter)
	}
	if tb, ok := c.limiter.(*TokenBucket); ok && t.inFlight == nil && t.costs == nil && !t.shadow {
		t.quick = tb
	}
	return t, nil
}

// RoundTrip implements http.RoundTripper: the path of a request in the
// package doc, attempt after attempt. With a RetryPolicy it is the one
// layer that retries (see RetryPolicy.SDKRetries): an SDK's resend of a
// call it ended with an error gets that error again, unsent, and a
// response it returns is marked final.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	key := t.keyFunc(req)
	if t.resends == nil {
		return t.roundTrip(req, key)
	}
	if resp, err, ok := t.resends.recall(req, t.clock); ok {
		if err != nil {
			return nil, t.reject(req, key, err)
		}
		if req.Body != nil {
			req.Body.Close()
		}
		return resp, nil
	}
	resp, err := t.roundTrip(req, key)
	markFinal(resp)
	t.resends.end(req, resp, err, t.clock)
	return resp, err
}

// roundTrip sends req, of key, attempt after attempt.
//
// The clock is read once before the first attempt, when the retries count
// from then or the limiter can take the reading (see quickBucket): a
// request granted at once is sent at that time. It is read again once the
// response is there, when the response or the key's controller needs the
// time (see learn). (A reading costs about 37 ns on a virtual machine's
// clock, kvm-clock, with clock.Real's one reading of the monotonic clock:
// time.Now, which reads the wall clock too, costs 57 ns, two thirds of
// x/time/rate's Allow. The allowed path made four.)
func (t *Transport) roundTrip(req *http.Request, key string) (*http.Response, error) {
	cost, err := t.costOf(req, key)
	if err != nil {
		return nil, t.reject(req, key, err)
	}
	quick := t.quickBucket()
	var start time.Time // of the first attempt; read only when retries may follow, or for the limiter
	if t.retry != nil || quick != nil {
		start = t.clock.Now()
	}
	if t.retry != nil {
		t.budget.deposit(start)
	}
	backoff := FullJitter{Rand: t.rand}
	r, now := req, start
	var grant Grant // an attempt's, with WithCosts
	var h heard     // an attempt's, which learn fills
	for attempt := 1; ; attempt++ {
		var a passage
		switch {
		case t.gate != nil:
			a, err = t.enterGate(r, key, &cost, &grant, quick, now)
		case quick != nil:
			a, err = t.enterQuick(r.Context(), quick, key, cost.Requests, now, 0)
		default:
			a, err = t.enter(r.Context(), key, &cost, &grant, 0)
		}
		if err != nil {
			return nil, t.reject(r, key, err)
		}
		sending := t.sending.inc(key)
		resp, err := t.base.RoundTrip(r)
		others := sending.dec()
		resp = holdSlot(r.Context(), a.release, resp, err)
		if t.obs.OnSent != nil {
			t.obs.OnSent(key, attempt, statusOf(resp, err), err)
		}
		t.learn(r, key, resp, &a, others, &grant, &h)
		resp = t.settle(&grant, resp, err)
		delay, next := t.plan(req, key, attempt, resp, err, &h, start, &backoff)
		switch next {
		case stop:
			return resp, err
		case giveUp:
			return t.giveUp(key, attempt, resp, err, h.sig.asked)
		}
		drain(resp)
		if err := sleep(req.Context(), t.clock, delay); err != nil {
			return nil, err
		}
		if r, err = rewind(req); err != nil {
			return nil, err
		}
		now = time.Time{} // the next attempt reads the clock afresh
	}
}

// quickBucket returns the Transport's limiter when a request may go the
// quick way through it (see enterQuick): it is a TokenBucket that nothing
// else before it holds a request up (no in-flight cap, no costs in
// dimensions, no shadow mode), on the Transport's own clock, so that one
// reading serves both. Otherwise nil.
func (t *Transport) quickBucket() *TokenBucket {
	if t.quick != nil && t.quick.clock == t.clock {
		return t.quick
	}
	return nil
}

// passage is how an attempt went through to be sent: the in-flight slot it
// holds, when it was let go, and the bucket that granted it, when it went
// the quick way (nil otherwise).
type passage struct {
	release func() // frees the slot; nil when there is none
	sentAt  time.Time
	waited  time.Duration // for a slot, a hold and the limiter (with what it queued before: see enter)
	bk      *tokenBucket
}

// reject closes the body of a request that will not be sent, as the
// http.RoundTripper contract requires, tells the observer, and returns err.
func (t *Transport) reject(req *http.Request, key string, err error) error {
	if req.Body != nil {
		req.Body.Close()
	}
	if t.obs.OnReject != nil {
		t.obs.OnReject(key, err)
	}
	return err
}

// enter waits until an attempt of key may be sent: for an in-flight slot
// when the Transport caps them, then for the limiter (and the key's hold).
// In shadow mode it reports instead of waiting. (The quick way through the
// Transport's own TokenBucket is enterQuick.)
//
// queued is how long the attempt has waited already, in the key's priority
// queue (see enterGate), and counts against the maximum wait.
func (t *Transport) enter(ctx context.Context, key string, cost *Cost, g *Grant, queued time.Duration) (passage, error) {
	var a passage
	if t.shadow {
		a.release = t.shadowEnter(ctx, key, cost, g)
		a.sentAt = t.clock.Now()
		return a, nil
	}
	release, waited, err := t.takeSlot(ctx, key, queued)
	if err != nil {
		return a, err
	}
	waited, err = t.admit(ctx, key, cost, queued+waited, g)
	if err != nil {
		if release != nil {
			release()
		}
		return a, err
	}
	a.release, a.sentAt, a.waited = release, t.clock.Now(), waited
	return a, nil
}

// enterQuick is enter when the limiter is the Transport's own TokenBucket
// and nothing else holds an attempt up (see quickBucket): admit's loop
// comes to one Wait, which takes the Transport's reading of the clock, now
// (or reads it, when now is zero), as its own. Tokens there at once are
// taken at now, and the attempt is sent at now; after a wait the clock is
// read again. The attempt's response is learnt in the bucket that granted
// it (see TokenBucket.learnAt). queued is how long the attempt waited in
// the key's priority queue before (see enterGate).
func (t *Transport) enterQuick(ctx context.Context, tb *TokenBucket, key string, cost int, now time.Time, queued time.Duration) (passage, error) {
	waited, g, err := tb.waitFrom(ctx, key, cost, remaining(t.maxWait, queued), now)
	if err != nil {
		return passage{}, err
	}
	if waited += queued; waited > 0 && t.obs.OnWait != nil {
		t.obs.OnWait(key, waited)
	}
	a := passage{sentAt: g.at, bk: g.bk, waited: waited}
	if g.delay != 0 || a.sentAt.IsZero() {
		a.sentAt = t.clock.Now()
	}
	return a, nil
}

// shadowEnter asks each part that may delay an attempt what it would do,
// without waiting, and reports a delay or a refusal to OnShadow. It takes
// the in-flight slot when one is free, so that the count goes on as it
// would; release frees it. A limiter that can reserve without waiting
// (TokenBucket) grants the attempt its turn as if it waited; any other is
// asked whether capacity is there at once, and takes none when it is not.
func (t *Transport) shadowEnter(ctx context.Context, key string, c *Cost, g *Grant) (release func()) {
	cost := c.Requests
	const now = time.Nanosecond // a maximum wait that only capacity there at once meets
	var wait time.Duration
	var refused error
	if t.inFlight != nil {
		var err error
		if release, _, err = t.inFlight.Acquire(ctx, key, now); err != nil {
			refused = err // waiting for a slot: for how long, nobody knows
		}
	}
	if t.holds != nil {
		wait, _ = t.holds.remaining(key)
	}
	if r, ok := t.limiter.(reserver); ok && cost > 0 && refused == nil {
		d, err := r.reserveNow(ctx, key, cost, remaining(t.maxWait, wait))
		var le *LimitError
		if errors.As(err, &le) {
			d = le.Wait
		}
		if err != nil {
			refused = err
		}
		wait += d
	} else if t.limiter != nil && *c != (Cost{}) && refused == nil {
		_, err := t.wait(ctx, key, c, now, g)
		var le *LimitError
		switch {
		case errors.As(err, &le) && (le.Reason == ReasonMaxWait || le.Reason == ReasonDeadline):
			wait += le.Wait
		case err != nil:
			refused = err
		}
	}
	if refused == nil && wait > 0 {
		if e := waitBudget(ctx, t.maxWait).refuse(t.clock.Now(), key, cost, wait); e != nil {
			refused = e
		}
	}
	if (wait > 0 || refused != nil) && t.obs.OnShadow != nil {
		t.obs.OnShadow(key, wait, refused)
	}
	return release
}

// takeSlot takes one of key's in-flight slots, when the Transport caps
// them, within what is left of the maximum wait after queued; release is
// nil when it does not.
func (t *Transport) takeSlot(ctx context.Context, key string, queued time.Duration) (release func(), waited time.Duration, err error) {
	if t.inFlight == nil {
		return nil, 0, nil
	}
	release, waited, err = t.inFlight.Acquire(ctx, key, remaining(t.maxWait, queued))
	if err == nil && release == nil {
		err = fmt.Errorf("egress: the InFlightLimiter %T returned no release function for key %q", t.inFlight, key)
	}
	return release, waited, err
}

// admit waits for the limiter to grant cost to key, within the context's
// deadline and what is left of the maximum wait after waited, and returns
// the whole wait, waited with it. A limiter
// that is a Learner holds its keys itself; otherwise the Transport waits
// out its own hold of the key first.
func (t *Transport) admit(ctx context.Context, key string, cost *Cost, waited time.Duration, g *Grant) (time.Duration, error) {
	for {
		if t.holds != nil {
			if d, now := t.holds.remaining(key); d > 0 {
				if e := waitBudget(ctx, remaining(t.maxWait, waited)).refuse(now, key, cost.Requests, d); e != nil {
					return waited, e
				}
				if err := sleep(ctx, t.clock, d); err != nil {
					return waited, err
				}
				waited += d
			}
		}
		if t.limiter == nil || *cost == (Cost{}) {
			break
		}
		w, err := t.wait(ctx, key, cost, remaining(t.maxWait, waited), g)
		if err != nil {
			return waited, err
		}
		waited += w
		if t.holds == nil {
			break
		}
		if d, _ := t.holds.remaining(key); d == 0 {
			break
		}
		if t.costLimiter != nil {
			t.costLimiter.Settle(*g, Cost{}) // held meanwhile: waits again
		}
	}
	if waited > 0 && t.obs.OnWait != nil {
		t.obs.OnWait(key, waited)
	}
	return waited, nil
}

// wait asks the limiter for cost: in dimensions when the Transport counts
// them (WithCosts), into g, the grant to settle; else in requests.
func (t *Transport) wait(ctx context.Context, key string, cost *Cost, maxWait time.Duration, g *Grant) (time.Duration, error) {
	if t.costLimiter != nil {
		var err error
		*g, err = t.costLimiter.WaitCost(ctx, key, *cost, maxWait)
		return g.Waited, err
	}
	return t.limiter.Wait(ctx, key, cost.Requests, maxWait)
}

// heard is what the Transport made of an attempt's outcome: the Signal it
// read and what the key's controller decided. An attempt's are kept in one
// place, which learn fills, rather than copied from call to call.
type heard struct {
	sig Signal
	dec Decision
}

// learn reads what resp says about key's limit into h and hands it to the
// key's controller (the limiter's, or the Transport's own holds), which
// decides what the key does next (inFlight is Signal.InFlight). It reports
// the holds and rate changes decided, and a key near its limit.
func (t *Transport) learn(req *http.Request, key string, resp *http.Response, a *passage, inFlight int, g *Grant, h *heard) {
	if resp == nil {
		h.sig, h.dec = Signal{Now: t.clock.Now(), SentAt: a.sentAt, InFlight: inFlight}, Decision{}
		return
	}
	sig, maxWait := &h.sig, max(t.maxPause, t.maxQuotaHold)
	if reads, builtin := t.signals.reads(resp); a.bk != nil && !reads {
		// The quick way, a response no reader reads is read the same at
		// any time: the clock is not read for it, and the limiter reads it
		// if its controller needs the time (see TokenBucket.learnAt).
		t.signals.unread(sig, resp, req.URL.Host, a.sentAt, maxWait)
	} else {
		t.signals.readInto(sig, resp, req.URL.Host, a.sentAt, t.clock.Now(), maxWait, builtin)
	}
	sig.InFlight = inFlight
	t.checkNear(key, sig)
	sig.asked = sig.RetryAfter
	if sig.RetryAfter > t.maxPause {
		// Retry-After has the pause cap; only a quota's reset may hold longer.
		sig.RetryAfter, sig.RetryAfterTooLong = t.maxPause, true
	}
	t.settleThrottled(g, sig) // before the counts it carries cap the limits
	if a.bk != nil {
		h.dec = t.quick.learnAt(a.bk, key, sig) // the limiter's Learn, in the bucket that granted the attempt
	} else {
		h.dec = t.learner.Learn(req.Context(), key, *sig)
	}
	if d := &h.dec; !d.Hold.IsZero() && t.obs.OnCooldown != nil {
		t.obs.OnCooldown(key, d.Hold, d.Err)
	}
	if d := &h.dec; d.Old != d.New && t.obs.OnRateChange != nil {
		t.obs.OnRateChange(key, d.Old, d.New, d.Why)
	}
}

// checkNear tells OnNearLimit when s reports key below the near-limit
// ratio of one of its quotas, once per crossing.
func (t *Transport) checkNear(key string, s *Signal) {
	if t.obs.OnNearLimit == nil {
		return
	}
	var low Quota
	counted, near := false, false
	for _, q := range s.Quotas {
		if !q.HasLimit || !q.HasRemaining || q.Limit <= 0 {
			continue
		}
		counted = true
		if r := q.Remaining / q.Limit; r < t.nearLimit && (!near || r < low.Remaining/low.Limit) {
			low, near = q, true
		}
	}
	if !counted && !s.NearLimit {
		return // nothing said either way
	}
	near = near || (!counted && s.NearLimit)
	was := t.near.swap(key, argv.Flag(near))
	if near && was == 0 {
		t.obs.OnNearLimit(key, low)
	}
}

// next is what the Transport does after an attempt.
type next uint8

const (
	stop   next = iota // return the attempt's outcome as it is
	retry              // wait, then send again
	giveUp             // worth a retry, but out of attempts, time or budget
)

// plan decides whether attempt is followed by another, and after what
// delay.
func (t *Transport) plan(req *http.Request, key string, attempt int, resp *http.Response, err error, h *heard, start time.Time, b *FullJitter) (time.Duration, next) {
	p, s, d := t.retry, &h.sig, &h.dec
	if p == nil || !p.worthRetry(req, resp, err, s) {
		return 0, stop
	}
	if s.RetryAfterTooLong || s.RetryAfter > p.MaxRetryAfter || attempt >= p.MaxAttempts {
		return 0, giveUp
	}
	if b.Base == 0 {
		b.Base, b.Max = p.BaseDelay, p.MaxDelay
	}
	// The next attempt goes neither before its own Retry-After nor before
	// the key's hold ends (the limiter would hold it anyway).
	now := t.clock.Now()
	delay := max(s.RetryAfter, b.NextBackOff(), d.NotBefore.Sub(now), d.Hold.Sub(now))
	if s.overloaded() {
		delay = max(delay, overloadPause)
	}
	at := now.Add(delay)
	if dl, ok := req.Context().Deadline(); (ok && at.After(dl)) || at.Sub(start) > p.MaxElapsed {
		return 0, giveUp
	}
	if !t.budget.withdraw(now, askedRetry(s)) {
		if t.obs.OnBudgetExhausted != nil {
			t.obs.OnBudgetExhausted(key)
		}
		return 0, giveUp
	}
	if t.obs.OnRetry != nil {
		t.obs.OnRetry(key, attempt+1, delay, statusOf(resp, err), err)
	}
	return delay, retry
}

// giveUp returns the last outcome of a request that ran out of attempts,
// time or budget: as it is, or as a *RetryError when the policy says so.
// asked is the wait the last response asked for, past the pause cap.
func (t *Transport) giveUp(key string, attempts int, resp *http.Response, err error, asked time.Duration) (*http.Response, error) {
	if !t.retry.ErrorOnExhausted {
		return resp, err
	}
	drain(resp)
	return nil, &RetryError{Key: key, Attempts: attempts, Status: statusOf(resp, err), RetryAfter: asked, Err: err}
}

// rewind returns a copy of req to send again, with a fresh body from
// GetBody.
func rewind(req *http.Request) (*http.Request, error) {
	r := req.Clone(req.Context())
	if req.Body != nil && req.Body != http.NoBody {
		body, err := req.GetBody()
		if err != nil {
			return nil, fmt.Errorf("egress: rewinding the request body for a retry: %w", err)
		}
		r.Body = body
	}
	return r, nil
}

// drainLimit bounds how much of a discarded response body is read so that
// its connection can be reused.
const drainLimit = 64 << 10

// drain reads what is left of resp's body, up to drainLimit, and closes it.
func drain(resp *http.Response) {
	if resp == nil || resp.Body == nil {
		return
	}
	io.CopyN(io.Discard, resp.Body, drainLimit)
	resp.Body.Close()
}

// CloseIdleConnections closes the idle connections of the base RoundTripper,
// when it has such a method, so that http.Client.CloseIdleConnections works
// through a Transport.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func statusOf(resp *http.Response, err error) int {
	if err != nil || resp == nil {
		return 0
	}
	return resp.StatusCode
}
