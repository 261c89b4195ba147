package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egress-go/egress/bench/internal/benchkit"
	"github.com/egress-go/egress/internal/fakeapi"
	"github.com/egress-go/egress/internal/redistest"
)

const (
	callTimeout       = 5 * time.Second // each call's own deadline, retries and waits included
	maxCallsPerWorker = 50_000          // a worker's loop is bounded in count as well as time
)

// load is how busy each pod of the fleet is.
type load struct {
	name string
	pods []podLoad
}

// podLoad is one pod's workers: each calls back to back, or starts a call
// every `every` when it is not zero.
type podLoad struct {
	workers int
	every   time.Duration
}

var (
	evenLoad = load{name: "even", pods: []podLoad{{workers: 8}, {workers: 8}, {workers: 8}, {workers: 8}}}
	// unevenLoad is one busy pod and three nearly idle ones.
	unevenLoad = load{name: "uneven", pods: []podLoad{
		{workers: 16}, {workers: 1, every: 500 * time.Millisecond},
		{workers: 1, every: 500 * time.Millisecond}, {workers: 1, every: 500 * time.Millisecond},
	}}
)

// scenario is one run: a strategy under a load against a provider.
type scenario struct {
	strategy strategy
	load     load
	provider fakeapi.Config
	limits   limits
	duration time.Duration // workers start no call after it

	rateSteps []rateStep  // changes of the provider's rate during the run
	requests  *requestLog // when set, the provider records every request by its requestIDHeader
}

// rateStep sets the provider's rate to rate at `at` from the start.
type rateStep struct {
	at   time.Duration
	rate float64
}

// outcome is what one scenario measured.
type outcome struct {
	elapsed time.Duration // from the start until the last call returned

	// At the provider.
	accepted     int // answered 200
	upstream     int // every request that reached it, retries included
	maxPerSecond int // most accepted in any 1 s window

	// At the pods' connection pools: every attempt's answer.
	limited          int // 429s received (and 403s, where the provider refuses with them)
	maxLimitedPerSec int // most 429s received in any 1 s window
	maxSentPerSec    int // most attempts sent by the fleet in any 1 s window
	sentPerSec       []int
	sentAt           []time.Time // when each attempt left a pod

	acceptedPerSec, limitedPerSec []int // in each whole second from the start

	start      time.Time   // when the workers started
	acceptedAt []time.Time // at the provider: when each accepted request was decided
	limitedAt  []time.Time // at the pods: when each 429 came back
	succeeded  []time.Time // at the callers: when each successful call returned
	refused    int         // 429s the provider sent because the limit was reached
	storms     int         // 429s the provider's storm sent while within the limit

	// At the callers.
	calls    int // calls made
	failed   int // calls that ended in an error or a final status other than 200
	roomy    int // failed calls whose last answer asked a wait their deadline still had room for
	p50, p99 time.Duration
	endRate  float64 // the lowest rate a pod held the key to at the end; 0 if unknown
	fallback int64   // egress's switches to its local fallback (Redis trouble)
}

// utilisation is the share of the provider's real limit that was used.
func (o outcome) utilisation(providerRate float64) float64 {
	return float64(o.accepted) / (providerRate * o.elapsed.Seconds())
}

// run runs sc in a subtest-owned world: its own provider, its own Redis,
// its own pods, all closed before it returns.
func run(t *testing.T, sc scenario) outcome {
	t.Helper()
	api, err := fakeapi.Start(sc.provider)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(api.Close) // runs last: after the pods' connections are closed
	target := api.URL()
	if sc.requests != nil {
		front := httptest.NewServer(sc.requests.handler(api))
		t.Cleanup(front.Close) // runs just before api.Close
		target = front.URL
	}
	var srv *redistest.Server
	if sc.strategy.redis {
		srv = redistest.Start(t)
	}

	var (
		rec      probeRecord
		fallback atomic.Int64
		pods     []pod
	)
	t.Cleanup(func() { // runs first: pods, then Redis clients and connection pools
		var errs []error
		for _, p := range pods {
			if p.close != nil {
				errs = append(errs, p.close())
			}
		}
		errs = append(errs, rec.Close())
		if err := errors.Join(errs...); err != nil {
			t.Errorf("closing the pods: %v", err)
		}
	})
	for _, pl := range sc.load.pods {
		env := podEnv{
			url: target, pods: len(sc.load.pods), limits: sc.limits,
			base: rec.pool(pl.workers), fallback: &fallback,
		}
		if srv != nil {
			env.rdb = rec.Redis(srv.Addr)
		}
		p, err := sc.strategy.newPod(env)
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, p)
	}

	start := time.Now()
	stopSteps := schedule(t, api, start, sc.rateSteps)
	tl := drive(t.Context(), target, sc.load, pods, start.Add(sc.duration))
	elapsed := time.Since(start)
	stopSteps()

	st := api.Stats(start)
	limited := rec.limitedTimes()
	sent := rec.sentTimes()
	o := outcome{
		maxSentPerSec: fakeapi.MaxInWindow(sent, time.Second), sentPerSec: fakeapi.PerWindow(sent, start, time.Second), sentAt: sent,
		elapsed: elapsed, accepted: st.Accepted, upstream: st.Requests, maxPerSecond: st.MaxPerSecond,
		limited: len(limited), maxLimitedPerSec: fakeapi.MaxInWindow(limited, time.Second),
		acceptedPerSec: st.PerSecond, limitedPerSec: fakeapi.PerWindow(limited, start, time.Second),
		calls: tl.calls, failed: tl.calls - len(tl.latencies), roomy: tl.roomy,
		p50: benchkit.Quantile(tl.latencies, 0.50), p99: benchkit.Quantile(tl.latencies, 0.99),
		endRate: endRate(pods, target), fallback: fallback.Load(),
		start: start, acceptedAt: st.Arrivals, limitedAt: limited, succeeded: tl.succeeded,
		refused: st.Refused, storms: st.Storms,
	}
	if st.Limited+st.Forbidden != o.limited {
		t.Logf("note: the provider answered %d 429s, the pods received %d", st.Limited, o.limited)
	}
	return o
}

// schedule sets the provider's rate at each step's time from start; the
// returned function cancels the steps not yet taken.
func schedule(t *testing.T, api *fakeapi.API, start time.Time, steps []rateStep) (stop func()) {
	var timers []*time.Timer
	for _, s := range steps {
		timers = append(timers, time.AfterFunc(time.Until(start.Add(s.at)), func() {
			if err := api.SetRate(s.rate); err != nil {
				t.Errorf("setting the provider's rate to %v: %v", s.rate, err)
			}
		}))
	}
	return func() {
		for _, tm := range timers {
			tm.Stop()
		}
	}
}

// endRate is the lowest rate a pod holds the provider's key to, or 0 when
// the strategy has no such notion.
func endRate(pods []pod, apiURL string) float64 {
	u, err := url.Parse(apiURL)
	if err != nil {
		return 0
	}
	lowest := 0.0
	for _, p := range pods {
		if p.effectiveRate == nil {
			continue
		}
		if r := p.effectiveRate(u.Host); lowest == 0 || r < lowest {
			lowest = r
		}
	}
	return lowest
}

// tally collects the outcome of every call. Safe for concurrent use.
type tally struct {
	mu        sync.Mutex
	calls     int             // guarded by mu
	roomy     int             // guarded by mu; failed calls that had room left for the wait their last answer asked
	latencies []time.Duration // guarded by mu; of the successful calls
	succeeded []time.Time     // guarded by mu; when each successful call returned
}

// add counts a call that took d and ended with status; a failed call whose
// last answer asked for a wait (its Retry-After) that the call's deadline
// still had room for is counted as roomy: a retry could have been made.
func (t *tally) add(status int, wait, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.calls++
	switch {
	case status == http.StatusOK:
		t.latencies = append(t.latencies, d)
		t.succeeded = append(t.succeeded, time.Now())
	case wait > 0 && d+wait < callTimeout:
		t.roomy++
	}
}

// drive runs every pod's workers until end and returns once the last call
// has returned, with the latencies sorted.
func drive(ctx context.Context, apiURL string, l load, pods []pod, end time.Time) *tally {
	tl := &tally{}
	var wg sync.WaitGroup
	for i, pl := range l.pods {
		for w := range pl.workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				work(ctx, pods[i].do, apiURL, fmt.Sprintf("p%d-w%d", i, w), pl.every, end, tl)
			}()
		}
	}
	wg.Wait()
	slices.Sort(tl.latencies)
	return tl
}

// work is one worker: three charges, then a look at a charge, and again,
// until end; back to back, or one call every `every`.
func work(ctx context.Context, do func(*http.Request) (*http.Response, error), apiURL, tag string, every time.Duration, end time.Time, tl *tally) {
	for i := 0; i < maxCallsPerWorker && ctx.Err() == nil && time.Now().Before(end); i++ {
		t0 := time.Now()
		status, wait, _ := call(ctx, do, apiURL, fmt.Sprintf("%s-%d", tag, i), i%4 == 3)
		tl.add(status, wait, time.Since(t0))
		if every > 0 {
			if next := t0.Add(every); next.Before(end) {
				_ = benchkit.Sleep(ctx, time.Until(next))
			} else {
				return
			}
		}
	}
}

// call makes one payment call with its own deadline: a POST of a charge with
// an Idempotency-Key and a form body that can be sent again, or a GET of a
// charge; either carries key in requestIDHeader, the same on every attempt.
// It returns the final status and the wait its Retry-After asks (0 when it
// has none), or 0 with an error.
func call(ctx context.Context, do func(*http.Request) (*http.Response, error), apiURL, key string, get bool) (int, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	var (
		req *http.Request
		err error
	)
	if get {
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, apiURL+"/v1/charges/ch_"+key, nil)
	} else {
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, apiURL+"/v1/charges",
			strings.NewReader("amount=2000&currency=usd&source=tok_visa"))
		if err == nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Idempotency-Key", key)
		}
	}
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set(requestIDHeader, key)
	resp, err := do(req)
	if err != nil {
		return 0, 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, 0, err
	}
	var wait time.Duration
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		wait = time.Duration(s) * time.Second
	}
	return resp.StatusCode, wait, nil
}

// probeRecord owns the pods' connection pools and Redis clients and records
// the time of every 429 that comes back through the pools. Safe for
// concurrent use.
type probeRecord struct {
	benchkit.Pods

	mu      sync.Mutex
	limited []time.Time // guarded by mu
	sent    []time.Time // guarded by mu; when each attempt left a pod
}

// pool returns a new pod's own connection pool, seen through the probe.
func (r *probeRecord) pool(workers int) http.RoundTripper {
	return probe{base: r.Pool(workers), rec: r}
}

func (r *probeRecord) limitedTimes() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.limited)
}

type probe struct {
	base http.RoundTripper
	rec  *probeRecord
}

func (r *probeRecord) sentTimes() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.sent)
}

func (p probe) RoundTrip(req *http.Request) (*http.Response, error) {
	p.rec.mu.Lock()
	p.rec.sent = append(p.rec.sent, time.Now())
	p.rec.mu.Unlock()
	resp, err := p.base.RoundTrip(req)
	// A 403 is a refusal in the dialects that refuse with it (GitHub's
	// exhausted primary limit); the provider answers nothing else with it.
	if err == nil && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusForbidden) {
		p.rec.mu.Lock()
		p.rec.limited = append(p.rec.limited, time.Now())
		p.rec.mu.Unlock()
	}
	return resp, err
}
