package main

import (
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/egress-go/egress"
	"github.com/egress-go/egress/internal/fakeapi"
	"github.com/egress-go/egress/internal/naive"
)

// sharedName is the name of the fleet's limiter in Redis: every instance,
// in every process, uses it.
const sharedName = "stripe-like"

// pods are the simulated instances of one run: each has its own
// http.Client and Transport, as separate pods would, and they report into
// the same gauges.
type pods struct {
	clients []*http.Client
	got     fakeapi.Counter // what came back from the API, as the clients saw it
	inside  atomic.Int64    // requests inside the clients' RoundTrippers
	sending atomic.Int64    // requests on their way to the API
	retries atomic.Int64    // attempts after the first
	pauses  atomic.Int64    // pauses egress learnt from the provider
	refused atomic.Int64    // requests egress refused without sending
	closers []func() error  // run in reverse by close
}

// waiting is the number of requests held back by the client: inside it but
// not on their way to the API.
func (p *pods) waiting() int64 { return max(0, p.inside.Load()-p.sending.Load()) }

// close releases what the pods hold: connections, limiters, Redis clients.
func (p *pods) close() error {
	var errs []error
	for i := len(p.closers) - 1; i >= 0; i-- {
		errs = append(errs, p.closers[i]())
	}
	return errors.Join(errs...)
}

// newNaivePods returns pods with a plain client that retries a 429 at once.
func newNaivePods(s settings) *pods {
	p := &pods{}
	for range s.instances {
		base := p.base(s)
		p.add(naive.Retry{Base: base, Retries: &p.retries})
	}
	return p
}

// newEgressPods returns pods whose clients go through egress: in one
// process they share one limiter; with Redis each pod has its own shared
// limiter, of the same name, as separate processes would.
func newEgressPods(s settings, log func(string, ...any)) (*pods, error) {
	p := &pods{}
	var local egress.Limiter
	for range s.instances {
		lim := local
		var err error
		switch {
		case s.redisURL != "":
			lim, err = p.sharedLimiter(s, log)
		case local == nil:
			lim, err = localLimiter(s)
			local = lim
		}
		if err != nil {
			return nil, errors.Join(err, p.close())
		}
		opts := []egress.Option{
			egress.WithLimiter(lim),
			egress.WithRetry(egress.RetryPolicy{MaxAttempts: 4}),
			egress.WithObserver(p.observer()),
		}
		tr, err := egress.New(p.base(s), opts...)
		if err != nil {
			return nil, errors.Join(err, p.close())
		}
		p.add(tr)
	}
	return p, nil
}

// base returns a new pod's own connection pool, seen through the probe.
func (p *pods) base(s settings) http.RoundTripper {
	tr := &http.Transport{MaxIdleConnsPerHost: s.workers}
	p.closers = append(p.closers, func() error { tr.CloseIdleConnections(); return nil })
	return probe{base: tr, p: p}
}

// add makes a pod's client on rt.
func (p *pods) add(rt http.RoundTripper) {
	p.clients = append(p.clients, &http.Client{Transport: held{base: rt, p: p}})
}

func localLimiter(s settings) (egress.Limiter, error) {
	var opts []egress.LimiterOption
	if !s.adaptive {
		opts = append(opts, egress.WithoutDiscovery())
	}
	if s.mode == "leaky" {
		return egress.NewLeakyBucket(egress.PerSecond(s.rate), s.queueDepth(), opts...)
	}
	return egress.NewTokenBucket(egress.PerSecond(s.rate), s.egressBurst(), opts...)
}

// sharedLimiter returns a pod's own Redis client and fleet-wide limiter.
func (p *pods) sharedLimiter(s settings, log func(string, ...any)) (egress.Limiter, error) {
	opts, err := redis.ParseURL(s.redisURL)
	if err != nil {
		return nil, err
	}
	rdb := redis.NewClient(opts)
	p.closers = append(p.closers, rdb.Close)
	onFallback := egress.WithFallbackObserver(func(name string, active bool, err error) {
		if active {
			log("  ! Redis unreachable (%v): limiter %s falls back to this pod's share of the rate", err, name)
		} else {
			log("  ! Redis is back: limiter %s is fleet-wide again", name)
		}
	})
	var lim interface {
		egress.Limiter
		Close() error
	}
	limOpts := []egress.LimiterOption{onFallback}
	if !s.adaptive {
		limOpts = append(limOpts, egress.WithoutDiscovery())
	}
	if s.mode == "leaky" {
		lim, err = egress.NewSharedLeakyBucket(rdb, sharedName, egress.PerSecond(s.rate), s.queueDepth(), limOpts...)
	} else {
		lim, err = egress.NewSharedTokenBucket(rdb, sharedName, egress.PerSecond(s.rate), s.egressBurst(), limOpts...)
	}
	if err != nil {
		return nil, err
	}
	p.closers = append(p.closers, lim.Close)
	return lim, nil
}

func (p *pods) observer() egress.Observer {
	return egress.Observer{
		OnRetry:    func(string, int, time.Duration, int, error) { p.retries.Add(1) },
		OnCooldown: func(string, time.Time, error) { p.pauses.Add(1) },
		OnReject:   func(string, error) { p.refused.Add(1) },
	}
}

// held counts the requests inside a pod's RoundTripper.
type held struct {
	base http.RoundTripper
	p    *pods
}

func (h held) RoundTrip(req *http.Request) (*http.Response, error) {
	h.p.inside.Add(1)
	defer h.p.inside.Add(-1)
	return h.base.RoundTrip(req)
}

// probe counts the requests on their way to the API and what comes back.
type probe struct {
	base http.RoundTripper
	p    *pods
}

func (pr probe) RoundTrip(req *http.Request) (*http.Response, error) {
	pr.p.sending.Add(1)
	resp, err := pr.base.RoundTrip(req)
	pr.p.sending.Add(-1)
	status := 0
	if err == nil {
		status = resp.StatusCode
	}
	pr.p.got.Add(time.Now(), status)
	return resp, err
}
