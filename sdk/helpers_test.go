package sdk

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/egress-go/egress"
	"github.com/egress-go/egress/internal/fakellm"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// callHeader tags every attempt of one SDK call with the call's name, so
// that the provider can count what each call cost. An SDK sends the same
// headers again when it resends a call.
const callHeader = "X-Egress-Test-Call"

// The headers by which an SDK's resend can be told from a new call.
const (
	retryCountHeader  = "X-Stainless-Retry-Count" // openai-go, anthropic-sdk-go: 0, then n on the nth resend
	idempotencyHeader = "Idempotency-Key"         // stripe-go: one per call, the same on every resend
)

// sdkCall makes one call of an SDK, tagged tag, to the provider at url
// through hc, and returns the SDK's error. A streaming call reads the
// stream to its end.
type sdkCall func(ctx context.Context, url string, hc *http.Client, tag string) error

// typedStatus returns the provider's status carried by the SDK's own
// typed error in err (*openai.Error, *anthropic.Error, *stripe.Error),
// and whether err has one.
type typedStatus func(err error) (int, bool)

// provider is a fake provider served over HTTP on 127.0.0.1 that records
// every attempt reaching it.
type provider struct {
	url   string
	start time.Time

	mu   sync.Mutex
	hits []hit // guarded by mu
}

// hit is one attempt that reached the provider.
type hit struct {
	call       string        // callHeader
	at         time.Duration // its arrival, since the provider started
	status     int           // the status answered
	retryCount string        // retryCountHeader
	idemKey    string        // idempotencyHeader
}

// serve runs h for the test, recording each attempt. Call it before
// egressClient, so that the client's connections are closed first.
func serve(t *testing.T, h http.Handler) *provider {
	t.Helper()
	p := &provider{start: time.Now()}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		x := hit{
			call:       r.Header.Get(callHeader),
			at:         time.Since(p.start),
			retryCount: r.Header.Get(retryCountHeader),
			idemKey:    r.Header.Get(idempotencyHeader),
		}
		sw := &statusWriter{ResponseWriter: w, answered: func(status int) {
			x.status = status
			p.mu.Lock()
			p.hits = append(p.hits, x)
			p.mu.Unlock()
		}}
		h.ServeHTTP(sw, r)
		sw.answer(http.StatusOK) // a handler that wrote nothing answered 200
	}))
	t.Cleanup(srv.Close)
	p.url = srv.URL
	return p
}

// recorded returns the attempts answered so far, in the order they were
// answered (a stream's when its header was written).
func (p *provider) recorded() []hit {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.hits)
}

// of returns the attempts of call.
func (p *provider) of(call string) []hit {
	var hs []hit
	for _, h := range p.recorded() {
		if h.call == call {
			hs = append(hs, h)
		}
	}
	return hs
}

// statusWriter tells answered the status a handler writes, once; it
// passes flushes on, so that streams stream.
type statusWriter struct {
	http.ResponseWriter
	answered func(status int)
	done     bool
}

func (w *statusWriter) answer(status int) {
	if !w.done {
		w.done = true
		w.answered(status)
	}
}

func (w *statusWriter) WriteHeader(status int) {
	w.answer(status)
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	w.answer(http.StatusOK)
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// newBase returns the base transport under egress, whose idle
// connections are closed when the test ends.
func newBase(t *testing.T) *http.Transport {
	t.Helper()
	base := &http.Transport{MaxIdleConnsPerHost: 16}
	t.Cleanup(base.CloseIdleConnections)
	return base
}

// egressClient returns the client a user gives the SDK: an *http.Client
// whose Transport is egress with opts.
func egressClient(t *testing.T, opts ...egress.Option) *http.Client {
	t.Helper()
	tr, err := egress.New(newBase(t), opts...)
	require.NoError(t, err)
	return &http.Client{Transport: tr}
}

// describe lists the attempts of a call: their statuses, and the header
// that tells a resend.
func describe(hs []hit) string {
	var parts []string
	for _, h := range hs {
		s := fmt.Sprintf("%d@%v", h.status, h.at.Round(10*time.Millisecond))
		if h.retryCount != "" {
			s += " retry-count=" + h.retryCount
		}
		if h.idemKey != "" {
			s += " idem=…" + h.idemKey[max(0, len(h.idemKey)-6):]
		}
		parts = append(parts, s)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// maxAttempts is the RetryPolicy.MaxAttempts of the attempts-per-call
// tests, and the most attempts a call may cost at the provider.
const maxAttempts = 3

// checkAttemptsPerCall makes a few concurrent calls of an SDK, with its
// default retries, through egress with WithRetry(RetryPolicy{MaxAttempts:
// 3}), to a provider that answers every attempt with status. Egress is the
// retry authority: each call reaches the provider at most 3 times, the
// SDK's resends included. The provider's response is the last word, so
// the caller gets the SDK's typed error with the provider's status, and
// not egress's.
func checkAttemptsPerCall(t *testing.T, call sdkCall, typed typedStatus, h http.Handler, status int) {
	t.Helper()
	p := serve(t, h)
	hc := egressClient(t, egress.WithRetry(egress.RetryPolicy{MaxAttempts: maxAttempts}))
	const calls = 3
	errs := make([]error, calls)
	took := make([]time.Duration, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			errs[i] = call(ctx, p.url, hc, fmt.Sprintf("call-%d", i))
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	for i, err := range errs {
		tag := fmt.Sprintf("call-%d", i)
		hs := p.of(tag)
		t.Logf("%s: %d attempts at the provider in %v: %s; error: %v", tag, len(hs), took[i].Round(10*time.Millisecond), describe(hs), err)
		assert.NotEmpty(t, hs, "%s never reached the provider", tag)
		assert.LessOrEqual(t, len(hs), maxAttempts, "%s: attempts at the provider: %s", tag, describe(hs))
		if !assert.Error(t, err, tag) {
			continue
		}
		got, ok := typed(err)
		assert.True(t, ok, "%s: the SDK's typed error is not reachable with errors.As: %v", tag, err)
		assert.Equal(t, status, got, "%s: the typed error's status", tag)
		assert.NotErrorIs(t, err, egress.ErrRateLimited, "%s: the provider's answer, not egress's", tag)
	}
}

// checkRefusalNotSent makes a call that egress refuses, with the SDK's
// default retries: egress's token bucket gives one call every 2 s, and a
// call may wait at most 1 s. The first call takes the token; the second
// would wait 2 s and is refused. The SDK sends it again after its
// backoff, and again, by when its wait would fit in the 1 s: egress,
// which ended the call with an error, must refuse the resends too. So the
// call reaches the provider 0 times, and the SDK's error is egress's.
func checkRefusalNotSent(t *testing.T, call sdkCall, h http.Handler) {
	t.Helper()
	p := serve(t, h)
	tb, err := egress.NewTokenBucket(egress.Every(2*time.Second), 1)
	require.NoError(t, err)
	var mu sync.Mutex
	var refusals []error
	hc := egressClient(t,
		egress.WithLimiter(tb),
		egress.WithMaxWait(time.Second),
		egress.WithRetry(egress.RetryPolicy{}),
		egress.WithObserver(egress.Observer{OnReject: func(_ string, err error) {
			mu.Lock()
			refusals = append(refusals, err)
			mu.Unlock()
		}}),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	require.NoError(t, call(ctx, p.url, hc, "first"), "the first call takes the bucket's token")
	cancel()

	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	err = call(ctx, p.url, hc, "refused")
	took := time.Since(start)
	hs := p.of("refused")
	mu.Lock()
	t.Logf("refused call: %d attempts at the provider %s, %d refusals by egress (%v), returned after %v: %v",
		len(hs), describe(hs), len(refusals), refusals, took.Round(10*time.Millisecond), err)
	mu.Unlock()
	assert.Empty(t, hs, "the refused call reached the provider")
	assert.ErrorIs(t, err, egress.ErrRateLimited)
	var le *egress.LimitError
	if assert.ErrorAs(t, err, &le) {
		assert.Equal(t, egress.ReasonMaxWait, le.Reason)
		assert.Greater(t, le.Wait, time.Second)
	}
}

// The stream scenario: 8 workers stream completions with max_tokens 1000
// and a 6 s deadline each, for 10 s, under a provider's tokens limit of
// 4300 per 5 s; each call uses about 30 tokens (about 10 in, 15 to 25
// out), and takes about half a second to stream.
const (
	streamWorkers   = 8
	streamDeadline  = 6 * time.Second
	streamRun       = 10 * time.Second
	streamTPM       = 4300
	streamWindow    = 5 * time.Second
	streamMaxTokens = 1000
)

// The targets of the stream scenario.
const (
	targetDone       = 0.90                   // share of calls done within their deadline
	targetWaitError  = 0.25                   // a refusal's stated wait vs. the real one
	waitErrorFloor   = 100 * time.Millisecond // below which a wait's error is noise
	throttleGrace    = time.Second            // 429s before this are forgiven
	maxLoggedRefused = 12
)

// streamProvider is the fake LLM of the stream scenario.
func streamProvider(t *testing.T) *fakellm.Server {
	t.Helper()
	llm, err := fakellm.New(fakellm.Config{
		TPM:      streamTPM,
		Minute:   streamWindow,
		Output:   fakellm.Uniform(0.015, 0.025), // 15 to 25 of max_tokens 1000
		Latency:  50 * time.Millisecond,
		PerToken: 20 * time.Millisecond,
		Seed:     1,
	})
	require.NoError(t, err)
	return llm
}

// roundTripFunc is a RoundTripper of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// tripKey is the context key of a round trip's number, from the
// recorder's outer RoundTripper to its inner one.
type tripKey struct{}

// trip is one RoundTrip of egress: a call's first attempt or an SDK's
// resend.
type trip struct {
	call    string
	enter   time.Duration // since the origin
	exit    time.Duration
	sent    time.Duration // the first attempt egress let through; -1 when none
	err     error         // egress's error, when it returned one
	resend  bool          // the SDK's resend (X-Stainless-Retry-Count ≥ 1)
	refused bool          // err is a *LimitError
	stated  time.Duration // refused: the wait it stated
}

// recorder times each RoundTrip of egress from outside (when the SDK
// asked, what egress returned) and from inside (when egress let its first
// attempt through).
type recorder struct {
	origin time.Time

	mu    sync.Mutex
	trips []trip // guarded by mu
}

// outer wraps egress: it numbers each RoundTrip and notes its outcome.
func (r *recorder) outer(next http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		r.mu.Lock()
		id := len(r.trips)
		rc := req.Header.Get(retryCountHeader)
		r.trips = append(r.trips, trip{
			call: req.Header.Get(callHeader), enter: time.Since(r.origin), sent: -1,
			resend: rc != "" && rc != "0",
		})
		r.mu.Unlock()
		resp, err := next.RoundTrip(req.WithContext(context.WithValue(req.Context(), tripKey{}, id)))
		r.mu.Lock()
		tr := &r.trips[id]
		tr.exit, tr.err = time.Since(r.origin), err
		var le *egress.LimitError
		if errors.As(err, &le) {
			tr.refused, tr.stated = true, le.Wait
		}
		r.mu.Unlock()
		return resp, err
	})
}

// inner is egress's base: it notes when a RoundTrip's first attempt went.
func (r *recorder) inner(next http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if id, ok := req.Context().Value(tripKey{}).(int); ok {
			r.mu.Lock()
			if r.trips[id].sent < 0 {
				r.trips[id].sent = time.Since(r.origin)
			}
			r.mu.Unlock()
		}
		return next.RoundTrip(req)
	})
}

func (r *recorder) recorded() []trip {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.trips)
}

// outcome is one SDK call of the stream scenario.
type outcome struct {
	call string
	err  error
}

// refusalCheck compares a refusal's stated wait with the time until the
// call could in fact have gone: until the first RoundTrip that asked
// after the refusal was let through. (Egress grants in the order of
// asking: the refused call, had it waited, would have gone no later.) An
// SDK's resend of a refused call gets the first refusal's error again,
// its wait stated then: only the first refusal of a call is compared.
type refusalCheck struct {
	call         string
	at           time.Duration
	stated, real time.Duration
	known        bool // some later RoundTrip was let through
}

func (c refusalCheck) ok() bool {
	d := c.stated - c.real
	return max(d, -d) <= max(time.Duration(targetWaitError*float64(c.real)), waitErrorFloor)
}

func checkRefusals(trips []trip) []refusalCheck {
	var cs []refusalCheck
	for _, tr := range trips {
		if !tr.refused || tr.resend {
			continue
		}
		c := refusalCheck{call: tr.call, at: tr.exit, stated: tr.stated}
		for _, later := range trips {
			if later.enter >= tr.exit && later.sent >= 0 && (!c.known || later.sent-tr.exit < c.real) {
				c.real, c.known = later.sent-tr.exit, true
			}
		}
		cs = append(cs, c)
	}
	return cs
}

// runStreams runs the stream scenario with call, a streaming call of an
// SDK with its default retries, through egress configured as the README
// says for an LLM provider: one Limits with the provider's tokens limit,
// WithCosts(LLMCost) and WithRetry. It logs the figures and checks the
// targets: at least 90% of the calls done within their deadline, no 429
// after the first second, and each refusal's stated wait within 25% of
// the time until the call could have gone.
func runStreams(t *testing.T, call sdkCall) {
	p := serve(t, streamProvider(t))
	limits, err := egress.NewLimits(egress.WindowOf(egress.Tokens, streamTPM, streamWindow))
	require.NoError(t, err)
	rec := &recorder{origin: p.start}
	tr, err := egress.New(rec.inner(newBase(t)),
		egress.WithLimiter(limits),
		egress.WithCosts(egress.LLMCost),
		egress.WithRetry(egress.RetryPolicy{}),
	)
	require.NoError(t, err)
	hc := &http.Client{Transport: rec.outer(tr)}

	var mu sync.Mutex
	var outcomes []outcome
	var wg sync.WaitGroup
	for w := range streamWorkers {
		wg.Go(func() {
			for i := 0; time.Since(p.start) < streamRun; i++ {
				tag := fmt.Sprintf("w%d-%d", w, i)
				ctx, cancel := context.WithTimeout(context.Background(), streamDeadline)
				err := call(ctx, p.url, hc, tag)
				cancel()
				mu.Lock()
				outcomes = append(outcomes, outcome{call: tag, err: err})
				mu.Unlock()
			}
		})
	}
	wg.Wait()

	done, refusedCalls, other := 0, 0, map[string]int{}
	for _, o := range outcomes {
		switch {
		case o.err == nil:
			done++
		case errors.Is(o.err, egress.ErrRateLimited):
			refusedCalls++
		default:
			other[errorKind(o.err)]++
		}
	}
	throttled, late := 0, 0
	for _, h := range p.recorded() {
		if h.status == http.StatusTooManyRequests {
			throttled++
			if h.at >= throttleGrace {
				late++
			}
		}
	}
	trips := rec.recorded()
	resends, resentRefused := 0, 0
	var waits []time.Duration
	for _, tr := range trips {
		if tr.resend {
			resends++
			if tr.refused {
				resentRefused++
			}
		}
		if tr.sent >= 0 {
			waits = append(waits, tr.sent-tr.enter)
		}
	}
	slices.Sort(waits)
	checks := checkRefusals(trips)
	share := float64(done) / float64(max(1, len(outcomes)))
	t.Logf("calls %d, done within the deadline %d (%.1f%%), failed as refused by egress %d, other failures %v",
		len(outcomes), done, 100*share, refusedCalls, other)
	t.Logf("provider: %d attempts, %d answered 429 (%d after the first second); egress: %d RoundTrips, %d of them SDK resends (%d of those refused)",
		len(p.recorded()), throttled, late, len(trips), resends, resentRefused)
	if len(waits) > 0 {
		t.Logf("egress's wait before a RoundTrip's first attempt: median %v, 90th percentile %v, max %v",
			waits[len(waits)/2].Round(time.Millisecond), waits[len(waits)*9/10].Round(time.Millisecond), waits[len(waits)-1].Round(time.Millisecond))
	}
	logRefusals(t, checks)

	assert.NotEmpty(t, outcomes)
	assert.GreaterOrEqual(t, share, targetDone, "share of calls done within their deadline")
	assert.Zero(t, late, "429s after the first second")
	bad := 0
	for _, c := range checks {
		if c.known && !c.ok() {
			bad++
		}
	}
	assert.Zero(t, bad, "refusals whose stated wait is off by more than %.0f%% of the real one (of %d refusals)", 100*targetWaitError, len(checks))
}

// logRefusals logs a summary of the refusals' stated and real waits, and
// the first few of them.
func logRefusals(t *testing.T, checks []refusalCheck) {
	t.Helper()
	var ratios []float64
	known, within := 0, 0
	for _, c := range checks {
		if !c.known {
			continue
		}
		known++
		if c.ok() {
			within++
		}
		ratios = append(ratios, c.stated.Seconds()/max(c.real.Seconds(), 1e-3))
	}
	sort.Float64s(ratios)
	t.Logf("refusals by egress of a call's first send: %d (%d with a later call let through); stated wait within %.0f%% of the real one: %d",
		len(checks), known, 100*targetWaitError, within)
	if len(ratios) > 0 {
		t.Logf("stated/real wait: min %.2f, median %.2f, max %.2f", ratios[0], ratios[len(ratios)/2], ratios[len(ratios)-1])
	}
	for i, c := range checks {
		if i == maxLoggedRefused {
			t.Logf("... %d more", len(checks)-i)
			break
		}
		real := "none let through later"
		if c.known {
			real = c.real.Round(time.Millisecond).String()
		}
		t.Logf("  refusal of %s at %v: stated wait %v, real %s", c.call, c.at.Round(time.Millisecond), c.stated.Round(time.Millisecond), real)
	}
}

// errorKind names an error for the tally of failures.
func errorKind(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, egress.ErrRateLimited):
		return "refused"
	}
	s := err.Error()
	if len(s) > 60 {
		s = s[:60]
	}
	return s
}
