// Package fakeapi is a Stripe-like payments API on 127.0.0.1 that enforces
// its own rate limit over all its callers, the way a provider does. Tests
// and the stripe-like example use it as the upstream.
//
// The limit is a token bucket of Config.Rate per second and Config.Burst,
// shared by every caller; SetRate changes the rate while the API runs. A
// request over the limit is answered 429 Too Many Requests with Retry-After
// (whole seconds until a token is back, at least 1). With Config.Advertise,
// every response also advertises the limit in the IETF and X- headers:
//
//	RateLimit-Policy: "default";q=50;w=1
//	RateLimit: "default";r=7;t=1        (remaining; seconds until the bucket is full)
//	X-RateLimit-Limit: 50
//	X-RateLimit-Remaining: 7
//
// A request within the limit can still be answered 503 (a share of them,
// Config.Unavailable, drawn from a seeded generator) and every response is
// delayed by Config.Latency. A POST must carry a form with an "amount", as
// a charge does; one without is answered 400. The API counts what it
// answered and when it accepted each request: see Stats.
//
//	api, err := fakeapi.Start(fakeapi.Config{Rate: 50, Burst: 10, Advertise: true})
//	if err != nil { ... }
//	defer api.Close()
//	... send to api.URL() + "/v1/charges" ...
//	st := api.Stats(start) // st.MaxPerSecond <= 50 + 10
package fakeapi

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"
)

// Config is the provider's behaviour. Start validates it.
type Config struct {
	// Rate is the number of requests accepted per second over all callers.
	// It must be positive.
	Rate float64
	// Burst is the bucket's capacity: how many requests are accepted at
	// once after a quiet spell. It must be at least 1.
	Burst int
	// Advertise makes every response carry the limit in RateLimit-Policy,
	// RateLimit, X-RateLimit-Limit and X-RateLimit-Remaining. When false,
	// a 429 still carries Retry-After, but nothing advertises the limit.
	Advertise bool
	// Unavailable is the share, in [0, 1], of the requests within the limit
	// that are answered 503 Service Unavailable (without Retry-After).
	Unavailable float64
	// Seed seeds the draws of those 503s: the same seed and the same order
	// of requests give the same draws.
	Seed uint64
	// Latency delays every response, whatever its status. It must not be
	// negative.
	Latency time.Duration
	// Addr is the address to listen on. Default "127.0.0.1:0": a free
	// loopback port.
	Addr string
}

// validate returns every invalid setting, each named with its value.
func (c Config) validate() error {
	var errs []error
	if err := checkRate(c.Rate); err != nil {
		errs = append(errs, err)
	}
	if c.Burst < 1 {
		errs = append(errs, fmt.Errorf("fakeapi: Burst %d: must be at least 1", c.Burst))
	}
	if !(c.Unavailable >= 0 && c.Unavailable <= 1) {
		errs = append(errs, fmt.Errorf("fakeapi: Unavailable %v: must be a share in [0, 1]", c.Unavailable))
	}
	if c.Latency < 0 {
		errs = append(errs, fmt.Errorf("fakeapi: Latency %v: must not be negative", c.Latency))
	}
	return errors.Join(errs...)
}

func checkRate(r float64) error {
	if !(r > 0) || math.IsInf(r, 0) {
		return fmt.Errorf("fakeapi: Rate %v: must be a positive number of requests per second", r)
	}
	return nil
}

// API is a running fake provider. Its methods are safe for concurrent use.
type API struct {
	cfg    Config
	srv    *httptest.Server
	counts Counter

	mu     sync.Mutex
	bucket bucket     // guarded by mu
	rng    *rand.Rand // guarded by mu; draws the injected 503s
}

// Start validates cfg and runs the API on cfg.Addr. Close it when done.
func Start(cfg Config) (*API, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("fakeapi: %w", err)
	}
	a := &API{
		cfg:    cfg,
		bucket: newBucket(cfg.Rate, cfg.Burst, time.Now()),
		rng:    rand.New(rand.NewPCG(cfg.Seed, cfg.Seed)),
	}
	a.srv = &httptest.Server{Listener: ln, Config: &http.Server{Handler: a}}
	a.srv.Start()
	return a, nil
}

// URL is the API's base URL, such as http://127.0.0.1:41234.
func (a *API) URL() string { return a.srv.URL }

// Close stops the server and waits for the requests in progress.
func (a *API) Close() { a.srv.Close() }

// SetRate changes the enforced rate from now on; the burst stays. It fails,
// changing nothing, when r is not a positive number.
func (a *API) SetRate(r float64) error {
	if err := checkRate(r); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.bucket.setRate(r, time.Now())
	return nil
}

// Rate returns the rate enforced now.
func (a *API) Rate() float64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.bucket.rate
}

// Stats returns what the API answered so far, with Stats.PerSecond measured
// from start. A request is counted when it is decided, before Latency.
func (a *API) Stats(start time.Time) Stats { return a.counts.Stats(start) }
