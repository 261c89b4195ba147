// Package egress shapes outbound HTTP: an http.RoundTripper that keeps the
// calls a service makes to a third-party API under the limit the provider
// enforces.
//
// Wrap the base transport of an http.Client with New and give it a Limiter:
// a TokenBucket (bursts up to B, sustained R per second) or a LeakyBucket (a
// FIFO queue released at exactly R per second). Requests are grouped by key
// (the host by default, or a caller-chosen key such as an account ID) and each
// key has its own bucket. A request waits for capacity, but never past its
// context's deadline or the Transport's maximum wait: when the wait would be
// too long it fails at once with an error that matches ErrRateLimited and
// carries the key and the wait it would have needed (see *LimitError).
//
//	limiter, err := egress.NewTokenBucket(egress.PerSecond(30), 10)
//	if err != nil { ... }
//	tr, err := egress.New(http.DefaultTransport, egress.WithLimiter(limiter))
//	if err != nil { ... }
//	client := &http.Client{Transport: tr}
//	resp, err := client.Get("https://api.example.com/v1/charges")
//
// Every response is read in the provider's dialect (OpenAI, Anthropic,
// GitHub, the IETF fields, ...; see SignalReader) and handed to the key's
// controller: an exhausted quota holds every request of the key, a throttle
// that is not about the quota delays only its request, an advertised limit
// lowers the key's rate, and throttling at the configured rate discovers the
// real one (see Learner and WithAdaptive). WithRetry adds polite retries
// (full-jitter backoff, safe methods only, a retry budget). WithPriorities
// orders the requests that wait for a key by their Class: a higher
// priority first, with a minimum share for each lower one, and tenants
// sharing fairly (see WithClass).
// NewSharedTokenBucket and NewSharedLeakyBucket hold one limit, and its
// controller, for a whole fleet through Redis.
//
// Every type in this package is safe for simultaneous use by multiple
// goroutines unless its documentation says otherwise.
package egress

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/egress-go/egress/internal/clock"
)

// Rate is a number of cost units per period, written the way provider docs
// write it: PerSecond(30), PerMinute(100), Every(250*time.Millisecond),
// Per(1000, time.Hour). The zero Rate is invalid: constructors reject it.
type Rate struct {
	n   float64
	per time.Duration
}

// PerSecond returns a rate of n units per second.
func PerSecond(n float64) Rate { return Rate{n: n, per: time.Second} }

// PerMinute returns a rate of n units per minute.
func PerMinute(n float64) Rate { return Rate{n: n, per: time.Minute} }

// Per returns a rate of n units per period d, as in "1000 requests per hour".
func Per(n float64, d time.Duration) Rate { return Rate{n: n, per: d} }

// Every returns a rate of one unit every d.
func Every(d time.Duration) Rate { return Rate{n: 1, per: d} }

// PerSecond returns the rate in units per second.
func (r Rate) PerSecond() float64 {
	if r.per <= 0 {
		return 0
	}
	return r.n / r.per.Seconds()
}

// Interval returns the time one unit takes at this rate (1/rate), at least
// one nanosecond.
func (r Rate) Interval() time.Duration {
	return durationOf(1, r)
}

// String returns the rate as it was written, e.g. "30/s", "100/min",
// "1/250ms".
func (r Rate) String() string {
	n := strconv.FormatFloat(r.n, 'g', -1, 64)
	switch r.per {
	case time.Second:
		return n + "/s"
	case time.Minute:
		return n + "/min"
	case time.Hour:
		return n + "/h"
	}
	return n + "/" + r.per.String()
}

// validate reports why r cannot be used, naming it as option says.
func (r Rate) validate(option string) error {
	if r.per <= 0 || !(r.n > 0) || math.IsInf(r.n, 0) {
		return configError(option, r, "must be a positive, finite number of units per positive period")
	}
	return nil
}

// durationOf returns the time cost units take at rate r, rounded up to the
// nanosecond and clamped to [1ns, MaxInt64]; no time for no cost.
func durationOf(cost int, r Rate) time.Duration {
	if cost <= 0 {
		return 0
	}
	ns := math.Ceil(float64(cost) * float64(r.per) / r.n)
	switch {
	case !(ns >= 1):
		return 1
	case ns >= math.MaxInt64:
		return math.MaxInt64
	}
	return time.Duration(ns)
}

// Limiter decides when a request may be sent. TokenBucket and LeakyBucket
// implement it, and so can a caller's own limiter. Implementations must be
// safe for concurrent use.
type Limiter interface {
	// Wait blocks until cost units of key's capacity are granted and returns
	// how long it waited (0 when the capacity was there at once).
	//
	// It never waits past ctx's deadline, nor longer than maxWait when
	// maxWait > 0: when the wait it would need is longer, it returns at once
	// with a *LimitError that matches ErrRateLimited. When ctx ends during
	// the wait it returns ctx.Err() at once and gives the capacity back.
	// A cost of 0 is granted at once.
	Wait(ctx context.Context, key string, cost int, maxWait time.Duration) (time.Duration, error)
}

// Errors returned by egress. Use errors.Is to test for them: the errors that
// carry details (*LimitError) match the sentinel of their reason.
var (
	// ErrRateLimited matches every request refused for lack of capacity.
	ErrRateLimited = errors.New("egress: rate limited")
	// ErrQueueFull matches a request refused because a leaky bucket's queue
	// was full. It also matches ErrRateLimited.
	ErrQueueFull = fmt.Errorf("%w: queue full", ErrRateLimited)
	// ErrCostTooHigh matches a request whose cost exceeds what the limiter
	// can ever grant at once (the burst, or the queue depth). Waiting would
	// never help. It also matches ErrRateLimited.
	ErrCostTooHigh = fmt.Errorf("%w: cost exceeds capacity", ErrRateLimited)
	// ErrTooManyInFlight matches a request refused because its key's
	// requests in flight stayed at the cap for the whole maximum wait (see
	// InFlightLimiter). It also matches ErrRateLimited.
	ErrTooManyInFlight = fmt.Errorf("%w: too many requests in flight", ErrRateLimited)
	// ErrInvalidConfig matches every error a constructor returns for an
	// invalid setting.
	ErrInvalidConfig = errors.New("egress: invalid configuration")
)

// Reason says why a LimitError refused a request.
type Reason uint8

// The reasons a request is refused without being sent.
const (
	// ReasonDeadline: the wait needed would outlast the context's deadline.
	ReasonDeadline Reason = iota + 1
	// ReasonMaxWait: the wait needed is longer than the Transport's maximum wait.
	ReasonMaxWait
	// ReasonQueueFull: the leaky bucket's queue for the key is full.
	ReasonQueueFull
	// ReasonCostTooHigh: the cost exceeds the burst or queue depth.
	ReasonCostTooHigh
	// ReasonInFlight: the key's requests in flight stayed at the
	// InFlightLimiter's cap for the whole maximum wait.
	ReasonInFlight
)

// String returns a short name of the reason.
func (r Reason) String() string {
	switch r {
	case ReasonDeadline:
		return "deadline"
	case ReasonMaxWait:
		return "max wait"
	case ReasonQueueFull:
		return "queue full"
	case ReasonCostTooHigh:
		return "cost too high"
	case ReasonInFlight:
		return "in flight"
	}
	return "Reason(" + strconv.Itoa(int(r)) + ")"
}

// LimitError is returned when a request is refused without being sent. It
// matches ErrRateLimited, and ErrQueueFull, ErrCostTooHigh or
// ErrTooManyInFlight when that is the reason.
type LimitError struct {
	Key    string        // the request's limiter key
	Cost   int           // the request's cost
	Reason Reason        // why it was refused
	Wait   time.Duration // the wait it would have needed; 0 when waiting could never help (cost too high)
	// Class is the request's, with WithPriorities (else the zero Class).
	Class Class
	// Queued says the request was refused in its key's priority queue
	// (WithPriorities), its deadline or maximum wait ended there: Wait is
	// then what it waited, the least it would have (requests of a higher
	// priority arriving later would have gone before it).
	Queued bool

	ordered bool // see Ordered
}

// Ordered reports whether the request went through its key's priority
// queue (WithPriorities): Class is then its class, the zero Class a normal
// request of tenant "".
func (e *LimitError) Ordered() bool { return e.ordered }

// Error describes the refusal.
func (e *LimitError) Error() string {
	s := fmt.Sprintf("egress: rate limited: key %q cost %d: %s", e.Key, e.Cost, e.Reason)
	switch {
	case e.Queued:
		s += fmt.Sprintf(" (%s; would wait %v or more)", e.Class, e.Wait)
	case e.Wait > 0:
		s += fmt.Sprintf(" (would wait %v)", e.Wait)
	}
	return s
}

// Unwrap returns the sentinel of the error's reason, so that errors.Is links
// the error to it and to ErrRateLimited.
func (e *LimitError) Unwrap() error {
	switch e.Reason {
	case ReasonQueueFull:
		return ErrQueueFull
	case ReasonCostTooHigh:
		return ErrCostTooHigh
	case ReasonInFlight:
		return ErrTooManyInFlight
	}
	return ErrRateLimited
}

// configError is the error of a constructor refusing a setting.
func configError(option string, value any, why string) error {
	return fmt.Errorf("%w: %s %v: %s", ErrInvalidConfig, option, value, why)
}

// budget is how long a wait may last: until the context's deadline and no
// longer than maxWait.
type budget struct {
	deadline time.Time     // zero when the context has none
	maxWait  time.Duration // 0 for no limit
}

func waitBudget(ctx context.Context, maxWait time.Duration) budget {
	dl, _ := ctx.Deadline()
	return budget{deadline: dl, maxWait: maxWait}
}

// remaining returns what is left of maxWait after waited: 0 (no limit) when
// maxWait is 0, and at least 1ns, which refuses any further wait.
func remaining(maxWait, waited time.Duration) time.Duration {
	if maxWait <= 0 {
		return 0
	}
	return max(maxWait-waited, 1)
}

// refuse returns the LimitError for a wait of d from now, or nil when it fits.
func (b budget) refuse(now time.Time, key string, cost int, d time.Duration) *LimitError {
	reason := Reason(0)
	switch {
	case b.maxWait > 0 && d > b.maxWait:
		reason = ReasonMaxWait
	case !b.deadline.IsZero() && now.Add(d).After(b.deadline):
		reason = ReasonDeadline
	default:
		return nil
	}
	return &LimitError{Key: key, Cost: cost, Reason: reason, Wait: d}
}

// sleep waits for d on clk, or until ctx ends, in which case it returns
// ctx.Err().
func sleep(ctx context.Context, clk clock.Clock, d time.Duration) error {
	return sleepOr(ctx, clk, d, nil)
}

// sleepOr is sleep that also returns, with nil, when wake is closed (a nil
// wake never is).
func sleepOr(ctx context.Context, clk clock.Clock, d time.Duration, wake <-chan struct{}) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := clk.NewTimer(d)
	select {
	case <-t.C():
		return nil
	case <-wake:
		t.Stop()
		return nil
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	}
}

// checkCost refuses a negative cost, and a cost above capacity, which no
// wait could ever grant.
func checkCost(key string, cost, capacity int) error {
	if cost < 0 {
		return fmt.Errorf("egress: key %q: cost %d is negative", key, cost)
	}
	if cost > capacity {
		return &LimitError{Key: key, Cost: cost, Reason: ReasonCostTooHigh}
	}
	return nil
}
