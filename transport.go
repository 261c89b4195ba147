package egress

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Transport is an http.RoundTripper that holds outbound requests to the rate
// its Limiter allows, key by key.
//
// For each request it computes the key (KeyFunc, the host by default) and the
// cost (CostFunc, 1 by default), waits for the limiter to grant that cost,
// then sends the request through the base RoundTripper. A request the limiter
// refuses (its wait would outlast the context's deadline or the maximum
// wait, its queue is full, its cost is too high) is not sent: RoundTrip
// returns a *LimitError that matches ErrRateLimited, and closes the request
// body. A request whose context ends while it waits returns the context's
// error.
//
// A Transport without a limiter (no WithLimiter option) passes every request
// straight through, unthrottled.
//
// Transport keeps the http.RoundTripper contract: it does not modify the
// request, it returns either a response or an error, and it closes the
// request body on every path where it does not send it. It is safe for
// simultaneous use by multiple goroutines.
type Transport struct {
	base     http.RoundTripper
	limiter  Limiter
	keyFunc  func(*http.Request) string
	costFunc func(*http.Request) int
	maxWait  time.Duration
	obs      Observer
}

// Option configures a Transport in New.
type Option interface {
	apply(*config)
}

// config gathers the options; New validates it once. The defaults live in
// New.
type config struct {
	limiter  Limiter
	keyFunc  func(*http.Request) string
	costFunc func(*http.Request) int
	maxWait  time.Duration
	observer Observer
	errs     []error
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithLimiter sets the limiter that every request passes. Default: none, the
// Transport does not throttle. A nil limiter is an error.
func WithLimiter(l Limiter) Option {
	return optionFunc(func(c *config) {
		if l == nil {
			c.errs = append(c.errs, configError("WithLimiter", "nil", "the limiter must not be nil"))
		}
		c.limiter = l
	})
}

// WithKeyFunc sets the function that names the bucket a request draws from.
// Default: the request's host (req.URL.Host). Key by host, account or API
// key, never by the raw URL path: an ID in the path would make one key per
// request. A nil function is an error.
func WithKeyFunc(f func(*http.Request) string) Option {
	return optionFunc(func(c *config) {
		if f == nil {
			c.errs = append(c.errs, configError("WithKeyFunc", "nil", "the key function must not be nil"))
		}
		c.keyFunc = f
	})
}

// WithCostFunc sets the function that says how many units a request costs.
// Default: 1 for every request. A cost of 0 passes without waiting; a
// negative cost fails the request. A nil function is an error.
func WithCostFunc(f func(*http.Request) int) Option {
	return optionFunc(func(c *config) {
		if f == nil {
			c.errs = append(c.errs, configError("WithCostFunc", "nil", "the cost function must not be nil"))
		}
		c.costFunc = f
	})
}

// WithMaxWait sets the longest a request may wait for capacity; a request
// that would need longer fails at once with ErrRateLimited. Default: no
// limit but the request's context. It must be positive.
func WithMaxWait(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d <= 0 {
			c.errs = append(c.errs, configError("WithMaxWait", d, "must be positive"))
		}
		c.maxWait = d
	})
}

// WithObserver sets hooks that the Transport calls as requests wait, are
// refused and are sent. Default: none. Hooks run on the request's goroutine
// and must be quick and safe for concurrent use.
func WithObserver(o Observer) Option {
	return optionFunc(func(c *config) { c.observer = o })
}

// Observer holds hooks for metrics and logs. A nil hook is skipped at no
// cost; the Transport allocates nothing to call them.
type Observer struct {
	// OnWait is called after a request waited for capacity, with how long.
	// Requests granted at once do not call it.
	OnWait func(key string, waited time.Duration)
	// OnReject is called when a request is refused without being sent; err
	// is the *LimitError (or other error) that RoundTrip returns.
	OnReject func(key string, err error)
	// OnSent is called when the base RoundTripper returns, with the attempt
	// number (1 for the first), the response status (0 when err != nil) and
	// the error.
	OnSent func(key string, attempt, status int, err error)
}

// New returns a Transport that sends requests through base, which defaults
// to http.DefaultTransport when nil. It fails, naming the option and the
// value, when an option is invalid.
func New(base http.RoundTripper, opts ...Option) (*Transport, error) {
	c := config{
		keyFunc:  hostKey,
		costFunc: unitCost,
	}
	for _, o := range opts {
		if o == nil {
			c.errs = append(c.errs, configError("New: option", "nil", "options must not be nil"))
			continue
		}
		o.apply(&c)
	}
	if err := errors.Join(c.errs...); err != nil {
		return nil, err
	}
	if base == nil {
		base = http.DefaultTransport
	}
	return &Transport{
		base:     base,
		limiter:  c.limiter,
		keyFunc:  c.keyFunc,
		costFunc: c.costFunc,
		maxWait:  c.maxWait,
		obs:      c.observer,
	}, nil
}

func hostKey(req *http.Request) string { return req.URL.Host }

func unitCost(*http.Request) int { return 1 }

// RoundTrip implements http.RoundTripper: it waits for the limiter, then
// sends req through the base RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.limiter == nil {
		return t.base.RoundTrip(req)
	}
	key := t.keyFunc(req)
	if err := t.admit(req, key); err != nil {
		closeBody(req)
		if t.obs.OnReject != nil {
			t.obs.OnReject(key, err)
		}
		return nil, err
	}
	resp, err := t.base.RoundTrip(req)
	if t.obs.OnSent != nil {
		t.obs.OnSent(key, 1, statusOf(resp, err), err)
	}
	return resp, err
}

// admit waits until the limiter grants req's cost on key.
func (t *Transport) admit(req *http.Request, key string) error {
	cost := t.costFunc(req)
	if cost < 0 {
		return fmt.Errorf("egress: CostFunc returned %d for key %q: a cost must not be negative", cost, key)
	}
	waited, err := t.limiter.Wait(req.Context(), key, cost, t.maxWait)
	if err == nil && waited > 0 && t.obs.OnWait != nil {
		t.obs.OnWait(key, waited)
	}
	return err
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

// closeBody closes the body of a request that will not be sent, as the
// http.RoundTripper contract requires.
func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}
