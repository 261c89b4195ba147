package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/egress-go/egress"
	"github.com/egress-go/egress/internal/naive"
)

// pods are the simulated instances of one run: each has its own
// http.Client, Transport and connection pool, as separate pods would, and
// they report into the same gauges.
type pods struct {
	clients []*http.Client
	got     gauges         // what came back from the API, as the clients saw it
	inside  atomic.Int64   // requests inside the clients' RoundTrippers
	sending atomic.Int64   // requests on their way to the API
	closers []func() error // run in reverse by close
}

// gauges count what came back through the pods' connection pools, and the
// tokens of the successful calls. Safe for concurrent use.
type gauges struct {
	start   time.Time // set before the workers start
	sent    atomic.Int64
	ok      atomic.Int64 // 200s
	limited atomic.Int64 // 429s
	late    atomic.Int64 // 429s more than a second after start
	tokens  atomic.Int64 // the usage of the successful calls
	retries atomic.Int64 // attempts after the first
	refused atomic.Int64 // requests egress refused without sending
}

// snapshot is the gauges at one moment.
type snapshot struct{ sent, ok, limited, tokens int64 }

func (g *gauges) snapshot() snapshot {
	return snapshot{g.sent.Load(), g.ok.Load(), g.limited.Load(), g.tokens.Load()}
}

// waiting is the number of requests held back by the client: inside it but
// not on their way to the API.
func (p *pods) waiting() int64 { return max(0, p.inside.Load()-p.sending.Load()) }

// close releases the pods' connections.
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
		p.add(naive.Retry{Base: p.base(s), Retries: &p.got.retries})
	}
	return p
}

// newEgressPods returns pods whose clients go through egress, sharing one
// Limits of the provider's two limits, as one process would.
func newEgressPods(s settings) (*pods, error) {
	limits, err := egress.NewLimits(
		egress.WindowOf(egress.Requests, s.rpm, s.minute),
		egress.WindowOf(egress.Tokens, s.tpm, s.minute),
	)
	if err != nil {
		return nil, err
	}
	p := &pods{}
	estimate := egress.LLMCost
	if s.estimateError > 0 {
		estimate = noisyEstimate(s.estimateError)
	}
	for range s.instances {
		tr, err := egress.New(p.base(s),
			egress.WithLimiter(limits),
			egress.WithCosts(estimate),
			egress.WithRetry(egress.RetryPolicy{}),
			egress.WithObserver(egress.Observer{
				OnRetry:  func(string, int, time.Duration, int, error) { p.got.retries.Add(1) },
				OnReject: func(string, error) { p.got.refused.Add(1) },
			}),
		)
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

// reservationKey is the context key of a call's reservation: its true
// input tokens plus its max_tokens, what the provider charges up front.
type reservationKey struct{}

// withReservation returns ctx carrying n, for noisyEstimate.
func withReservation(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, reservationKey{}, n)
}

// noisyEstimate returns an estimate for WithCosts that is off by up to e
// either way: 1 request, and the call's reservation (true input tokens plus
// max_tokens, from its context) times a factor uniform in [1−e, 1+e].
func noisyEstimate(e float64) func(*http.Request) egress.Cost {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(7, 7))
	return func(req *http.Request) egress.Cost {
		n, _ := req.Context().Value(reservationKey{}).(int)
		mu.Lock()
		f := 1 + e*(2*rng.Float64()-1)
		mu.Unlock()
		return egress.Cost{Requests: 1, Tokens: int(math.Round(float64(n) * f))}
	}
}

// describeEstimate says how the egress run estimates a call's tokens.
func describeEstimate(s settings) string {
	if s.estimateError > 0 {
		return fmt.Sprintf("estimate: true input + max_tokens, ×[%.2f, %.2f] at random", 1-s.estimateError, 1+s.estimateError)
	}
	return "estimate: egress.LLMCost, body size / 4 + max_tokens"
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
	g := &pr.p.got
	pr.p.sending.Add(1)
	g.sent.Add(1)
	resp, err := pr.base.RoundTrip(req)
	pr.p.sending.Add(-1)
	switch {
	case err != nil:
	case resp.StatusCode == http.StatusOK:
		g.ok.Add(1)
	case resp.StatusCode == http.StatusTooManyRequests:
		g.limited.Add(1)
		if time.Since(g.start) > time.Second {
			g.late.Add(1)
		}
	}
	return resp, err
}
