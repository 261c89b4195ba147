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
// a charge does, or a JSON object, as a completion does; one without is
// answered 400. The API counts what it
// answered and when it accepted each request: see Stats.
//
//	api, err := fakeapi.Start(fakeapi.Config{Rate: 50, Burst: 10, Advertise: true})
//	if err != nil { ... }
//	defer api.Close()
//	... send to api.URL() + "/v1/charges" ...
//	st := api.Stats(start) // st.MaxPerSecond <= 50 + 10
//
// Real providers vary, and so can the API. Config.Limits replaces the one
// bucket with any number of limits enforced together: token buckets, fixed
// windows and sliding windows, on requests or on tokens (read from
// InputTokensHeader, OutputTokensHeader or a JSON body's max_tokens).
// Config.Dialect writes the limits in a provider's headers (GitHub,
// OpenAI, Anthropic, Discord, Shopify, ...), with its refusal status and
// error bodies, and Config.BucketReset says what a bucket's reset means.
// Config.Storm throttles a share of the requests the limits would accept
// (a lock timeout, load shedding), and Config.InsufficientQuota answers a
// share with OpenAI's billing error. Stats tells quota refusals, storms
// and billing errors apart:
//
//	api, err := fakeapi.Start(fakeapi.Config{
//		Limits:  []fakeapi.Limit{fakeapi.Bucket(10, 10), fakeapi.Fixed(300, time.Minute)},
//		Dialect: fakeapi.GitHub,
//		Storm:   fakeapi.Storm{Share: 0.3, RetryAfter: 2 * time.Second},
//	})
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

// Config is the provider's behaviour. Start validates it. The zero value
// of each field added after Rate, Burst, Advertise, Unavailable, Seed,
// Latency and Addr keeps the API as it was: one bucket, the IETF headers,
// no storm.
type Config struct {
	// Rate is the number of requests accepted per second over all callers.
	// It must be positive, unless Limits is set; then it must be zero.
	Rate float64
	// Burst is the bucket's capacity: how many requests are accepted at
	// once after a quiet spell. It must be at least 1, unless Limits is
	// set; then it must be zero.
	Burst int
	// Limits are the API's limits, enforced together: a request is
	// accepted only when every limit has room for it, and then counts
	// against all of them; a refused request counts against none. Empty:
	// one TokenBucket of Rate per second and Burst, named "default". When
	// set, SetRate and Rate act on Limits[0].
	Limits []Limit
	// BucketReset is what the reset in the headers means for a TokenBucket
	// or SlidingWindow limit; a FixedWindow's reset is its window's end.
	// Zero: ResetFull, until the quota is whole again.
	BucketReset ResetMode
	// Dialect is the provider whose headers, refusal status and error
	// bodies the API imitates. Zero: IETF, the headers Advertise names.
	// Every other dialect advertises its limits whatever Advertise says.
	Dialect Dialect
	// Advertise makes every response carry the limit in RateLimit-Policy,
	// RateLimit, X-RateLimit-Limit and X-RateLimit-Remaining. When false,
	// a 429 still carries Retry-After, but nothing advertises the limit.
	// Only the IETF dialect reads it.
	Advertise bool
	// Storm throttles a share of the requests within the limits, with a
	// fixed Retry-After and without spending from the limits. Zero: none.
	Storm Storm
	// InsufficientQuota is the share, in [0, 1], of the requests answered
	// 429 with OpenAI's insufficient_quota billing error (no Retry-After),
	// before the limits are consulted; they spend nothing. Zero: none; 1:
	// every request.
	InsufficientQuota float64
	// Unavailable is the share, in [0, 1], of the requests within the limit
	// that are answered 503 Service Unavailable (without Retry-After).
	Unavailable float64
	// NoRetryAfter sends the limits' refusals without Retry-After or its
	// kin, as nginx's limit_req does (with Advertise false and the IETF
	// dialect, they carry nothing at all). A storm's 429s are as Storm
	// says.
	NoRetryAfter bool
	// Seed seeds the draws of those 503s, of the storm and of the billing
	// errors: the same seed and the same order of requests give the same
	// draws.
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
	if len(c.Limits) == 0 {
		if err := checkRate(c.Rate); err != nil {
			errs = append(errs, err)
		}
		if c.Burst < 1 {
			errs = append(errs, fmt.Errorf("fakeapi: Burst %d: must be at least 1", c.Burst))
		}
	} else if c.Rate != 0 || c.Burst != 0 {
		errs = append(errs, fmt.Errorf("fakeapi: Rate %v and Burst %d: must be zero when Limits are set", c.Rate, c.Burst))
	}
	names := map[string]bool{}
	for i, l := range resolveNames(c.Limits) {
		if err := l.check(i); err != nil {
			errs = append(errs, err)
		}
		if names[l.Name] {
			errs = append(errs, fmt.Errorf("fakeapi: Limits[%d]: Name %q: used twice", i, l.Name))
		}
		names[l.Name] = true
	}
	if c.BucketReset != ResetFull && c.BucketReset != ResetNext {
		errs = append(errs, fmt.Errorf("fakeapi: BucketReset %d: unknown", int(c.BucketReset)))
	}
	if !c.Dialect.known() {
		errs = append(errs, fmt.Errorf("fakeapi: Dialect %d: unknown", int(c.Dialect)))
	}
	for _, s := range []struct {
		name  string
		share float64
	}{{"Unavailable", c.Unavailable}, {"InsufficientQuota", c.InsufficientQuota}} {
		if !(s.share >= 0 && s.share <= 1) {
			errs = append(errs, fmt.Errorf("fakeapi: %s %v: must be a share in [0, 1]", s.name, s.share))
		}
	}
	if err := c.Storm.validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Latency < 0 {
		errs = append(errs, fmt.Errorf("fakeapi: Latency %v: must not be negative", c.Latency))
	}
	return errors.Join(errs...)
}

// limits returns the limits the API enforces, their names resolved.
func (c Config) limits() []Limit {
	if len(c.Limits) == 0 {
		return resolveNames([]Limit{Bucket(c.Rate, c.Burst)})
	}
	return resolveNames(c.Limits)
}

// tokens reports whether a limit counts tokens: then the API reads each
// request's token cost.
func (c Config) tokens() bool {
	for _, l := range c.Limits {
		if l.Unit != Requests {
			return true
		}
	}
	return false
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
	tokens bool // a limit counts tokens: read each request's token cost
	srv    *httptest.Server
	counts Counter

	mu     sync.Mutex
	limits limitSet   // guarded by mu
	rng    *rand.Rand // guarded by mu; draws the injected 503s, storms and billing errors
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
		tokens: cfg.tokens(),
		limits: newLimitSet(cfg.limits(), time.Now()),
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

// SetRate changes the enforced rate from now on; the burst stays. With
// Config.Limits, it changes the first limit: a bucket's refill, or a
// window's quota to r per second over its window (at least 1). It fails,
// changing nothing, when r is not a positive number.
func (a *API) SetRate(r float64) error {
	if err := checkRate(r); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.limits.setRate(r, time.Now())
	return nil
}

// Rate returns the rate enforced now: the first limit's, in units per
// second (a window's quota over its window).
func (a *API) Rate() float64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.limits.limits[0].perSecond()
}

// Stats returns what the API answered so far, with Stats.PerSecond measured
// from start. A request is counted when it is decided, before Latency.
func (a *API) Stats(start time.Time) Stats { return a.counts.Stats(start) }
