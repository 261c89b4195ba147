package egress_test

// Fleet tests: several OS processes share one limit through one real
// redis-server, as the pods of a service do. Each test starts Redis and a
// loopback upstream that records every arrival, then re-executes this test
// binary as worker processes (TestFleetWorker, configured through the
// environment); each worker builds its own Redis client, shared limiter and
// Transport, sends GETs from several goroutines for a fixed time and prints
// a summary. The checks are made where the provider would make them: on the
// arrivals at the upstream.
//
// Arrival times carry the machine's noise: a request released on its turn
// can be held up on its way (tens of ms on a loaded 2-core machine under
// -race) and arrive bunched with the next. The bounds below leave room for
// that and no more; the measured figures are logged.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress"
	"github.com/egress-go/egress/internal/fakeapi"
	"github.com/egress-go/egress/internal/fleettest"
	"github.com/egress-go/egress/internal/redistest"
)

const (
	// fleetStartDelay leaves the worker processes time to start (a -race
	// test binary) before the common start time.
	fleetStartDelay = time.Second
	// fleetRun is how long each worker starts new requests.
	fleetRun = 5 * time.Second
	// fleetTimeout bounds a whole fleet run; the workers are killed after.
	fleetTimeout = 40 * time.Second
	// fleetRequestTimeout bounds one request, waits and retries included.
	fleetRequestTimeout = 20 * time.Second
	// fleetCommandTimeout bounds each Redis command of a worker's limiter.
	fleetCommandTimeout = time.Second
	// fleetStall is how much longer one request may be held up between its
	// release and its arrival than another, on a loaded 2-core machine under
	// -race (60 ms has been seen with the CPUs oversubscribed): requests
	// released apart can arrive that much closer together.
	fleetStall = 75 * time.Millisecond
	// minUtilisation is the share of the fleet rate the fleet must use while
	// its callers want more.
	minUtilisation = 0.95
)

// TestFleetWorker is one worker process of the fleet tests; it runs only
// when a TestFleet* test starts this binary with fleettest.EnvSpec set.
func TestFleetWorker(t *testing.T) {
	spec, ok := fleettest.ReadSpec(t)
	if !ok {
		t.Skip("a fleet worker process: the TestFleet* tests start it")
	}
	fleettest.Report(t, fleetWork(t, spec))
}

// fleetWork is what a worker does: its own Redis client, shared limiter and
// Transport, spec.Goroutines senders from spec.Start for spec.Duration.
func fleetWork(t *testing.T, spec fleettest.Spec) fleettest.Summary {
	rdb := redis.NewClient(&redis.Options{
		Addr:                     spec.Redis,
		DialTimeout:              time.Second,
		ReadTimeout:              time.Second,
		WriteTimeout:             time.Second,
		ContextTimeoutEnabled:    true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	defer rdb.Close()

	var fallbacks atomic.Int64
	opts := []egress.LimiterOption{
		// The default 50 ms per command is tight for a -race process on a
		// shared 2-core machine: a slow reply would switch a worker to its
		// local fallback, which these tests are not about.
		egress.WithCommandTimeout(fleetCommandTimeout),
		egress.WithFallbackObserver(func(_ string, active bool, err error) {
			if active {
				fallbacks.Add(1)
				t.Logf("fallback: %v", err)
			}
		}),
	}
	var lim interface {
		egress.Limiter
		Stats() egress.SharedStats
		Close() error
	}
	var err error
	switch spec.Shape {
	case "token":
		lim, err = egress.NewSharedTokenBucket(rdb, spec.Name, egress.PerSecond(spec.Rate), spec.Burst, opts...)
	case "leaky":
		lim, err = egress.NewSharedLeakyBucket(rdb, spec.Name, egress.PerSecond(spec.Rate), spec.Burst, opts...)
	default:
		t.Fatalf("unknown shape %q", spec.Shape)
	}
	require.NoError(t, err)

	wire := &http.Transport{MaxIdleConnsPerHost: 64}
	stamp := &stamper{next: wire}
	topts := []egress.Option{egress.WithLimiter(lim)}
	if spec.Attempts > 0 {
		topts = append(topts, egress.WithRetry(egress.RetryPolicy{MaxAttempts: spec.Attempts}))
	}
	tr, err := egress.New(stamp, topts...)
	require.NoError(t, err)
	client := &http.Client{Transport: tr}

	require.NoError(t, fleetWarmup(wire, spec))
	sum := fleettest.Summary{Worker: spec.Worker, Statuses: map[int]int{}}
	if d := time.Until(spec.Start); d > 0 {
		time.Sleep(d)
	} else {
		sum.StartLate = -d
	}
	deadline := spec.Start.Add(spec.Duration)
	var mu sync.Mutex // guards sum
	var wg sync.WaitGroup
	stall := make(chan time.Duration, 1)
	go func() { stall <- fleettest.MeasureStall(deadline) }()
	for range spec.Goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := time.Now()
			for time.Now().Before(deadline) {
				if spec.Every > 0 {
					time.Sleep(time.Until(next))
					next = next.Add(spec.Every)
					if !time.Now().Before(deadline) {
						return
					}
				}
				status, err := fleetGet(client, spec)
				mu.Lock()
				sum.Sent++
				switch {
				case err != nil:
					sum.Errors++
					if sum.FirstError == "" {
						sum.FirstError = err.Error()
					}
				case status != http.StatusOK:
					sum.Errors++
					if sum.FirstError == "" {
						sum.FirstError = fmt.Sprintf("status %d", status)
					}
				default:
					sum.OK++
				}
				if err == nil {
					sum.Statuses[status]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	sum.Stall = <-stall

	st := lim.Stats()
	sum.RoundTrips, sum.Admitted, sum.Fallbacks = st.RoundTrips, st.Admitted, int(fallbacks.Load())
	sum.Releases = stamp.times()
	assert.NoError(t, lim.Close())
	tr.CloseIdleConnections()
	return sum
}

// fleetWarmup opens a connection per sender before the start, outside the
// limiter, so that the first turns do not wait for a dial.
func fleetWarmup(wire *http.Transport, spec fleettest.Spec) error {
	client := &http.Client{Transport: wire, Timeout: fleetRequestTimeout}
	errs := make(chan error, spec.Goroutines)
	for range spec.Goroutines {
		go func() {
			req, err := http.NewRequest(http.MethodGet, spec.URL, nil)
			if err != nil {
				errs <- err
				return
			}
			req.Header.Set(fleettest.WarmupHeader, "1")
			resp, err := client.Do(req)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			errs <- err
		}()
	}
	var first error
	for range spec.Goroutines {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// fleetGet sends one GET through client and returns the final status.
func fleetGet(client *http.Client, spec fleettest.Spec) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), fleetRequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, spec.URL, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set(fleettest.WorkerHeader, fmt.Sprint(spec.Worker))
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

// stamper records when each attempt leaves the Transport for the wire.
type stamper struct {
	next http.RoundTripper
	mu   sync.Mutex
	at   []int64 // guarded by mu; UnixNano
}

func (s *stamper) RoundTrip(req *http.Request) (*http.Response, error) {
	s.mu.Lock()
	s.at = append(s.at, time.Now().UnixNano())
	s.mu.Unlock()
	return s.next.RoundTrip(req)
}

func (s *stamper) times() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.at)
}

func (s *stamper) CloseIdleConnections() {
	if c, ok := s.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// fleet is the shared part of a fleet test: Redis and the upstream.
type fleet struct {
	redis string
	srv   *fleettest.Server
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	if testing.Short() {
		t.Skip("fleet tests run several processes for several seconds; skipped with -short")
	}
	return &fleet{redis: redistest.Start(t).Addr, srv: fleettest.StartServer(t)}
}

// worker returns the spec of worker i of a fleet sharing limiter name.
func (f *fleet) worker(i int, name, shape string, rate float64, burst, goroutines int) fleettest.Spec {
	return fleettest.Spec{
		Worker: i, Redis: f.redis, URL: f.srv.URL, Name: name,
		Shape: shape, Rate: rate, Burst: burst,
		Goroutines: goroutines, Duration: fleetRun,
	}
}

// run starts the workers with the common start time start, waits for
// them, and checks that every request succeeded, through Redis all along.
func (f *fleet) run(t *testing.T, specs []fleettest.Spec, start time.Time) []fleettest.Summary {
	t.Helper()
	for i := range specs {
		specs[i].Start = start
	}
	sums := fleettest.Run(t, "^TestFleetWorker$", specs, fleetTimeout)
	for _, s := range sums {
		t.Logf("worker %d: sent %d, ok %d, errors %d, statuses %v, round trips %d, admitted %d, fallbacks %d, started late %v, stalled up to %v",
			s.Worker, s.Sent, s.OK, s.Errors, s.Statuses, s.RoundTrips, s.Admitted, s.Fallbacks, s.StartLate.Round(time.Millisecond), s.Stall.Round(100*time.Microsecond))
		assert.Zero(t, s.Errors, "worker %d: request errors; first: %s", s.Worker, s.FirstError)
		assert.Zero(t, s.Fallbacks, "worker %d left shared mode: the fleet bound does not hold in fallback", s.Worker)
	}
	return sums
}

func totalSent(sums []fleettest.Summary) int {
	n := 0
	for _, s := range sums {
		n += s.Sent
	}
	return n
}

// releasesOf returns when the workers' attempts left their Transports, in
// order.
func releasesOf(sums []fleettest.Summary) []time.Time {
	var ns []int64
	for _, s := range sums {
		ns = append(ns, s.Releases...)
	}
	return fleettest.Unix(ns)
}

// checkTokenBucket checks a fleet sharing a token bucket of rate and burst
// whose callers wanted more than rate all along. The releases (the
// limiter's promise) hold at most rate+burst in any one-second window; the
// arrivals at the server as well, give or take what a stall on the way can
// bunch (rate·fleetStall); and from the first arrival to the last the fleet
// used at least minUtilisation of rate (the burst the full bucket lets
// through at once is not counted as rate). It returns the span and the
// utilisation.
func checkTokenBucket(t *testing.T, at, rel []time.Time, rate float64, burst int) (time.Duration, float64) {
	t.Helper()
	require.GreaterOrEqual(t, len(at), 2)
	bound := int(rate) + burst
	stallBound := int(rate*(1+fleetStall.Seconds())) + burst
	maxWin, relWin := fakeapi.MaxInWindow(at, time.Second), fakeapi.MaxInWindow(rel, time.Second)
	span := at[len(at)-1].Sub(at[0])
	util := float64(len(at)-burst) / (rate * span.Seconds())
	t.Logf("accepted %d in %v (%.1f/s); max in any 1 s window %d at the server, %d of the releases (bound %d); utilisation %.3f of %v/s beyond the burst of %d",
		len(at), span.Round(time.Millisecond), float64(len(at))/span.Seconds(), maxWin, relWin, bound, util, rate, burst)
	assert.LessOrEqual(t, relWin, bound, "the fleet released more than rate+burst in a one-second window")
	assert.LessOrEqual(t, maxWin, stallBound, "more than rate+burst arrived in a one-second window, beyond what a %v stall explains", fleetStall)
	assert.GreaterOrEqual(t, util, minUtilisation, "the fleet left capacity unused while its callers waited")
	return span, util
}

// TestFleetEvenLoad: 4 processes × 8 goroutines, all busy, share 50/s with
// a burst of 10.
func TestFleetEvenLoad(t *testing.T) {
	f := newFleet(t)
	const rate, burst, procs, goroutines = 50, 10, 4, 8
	var specs []fleettest.Spec
	for i := range procs {
		specs = append(specs, f.worker(i, "fleet-even", "token", rate, burst, goroutines))
	}
	sums := f.run(t, specs, time.Now().Add(fleetStartDelay))

	arr := f.srv.Arrivals()
	assert.Equal(t, totalSent(sums), len(arr), "requests the workers completed vs arrivals at the server")
	checkTokenBucket(t, fleettest.Times(arr), releasesOf(sums), rate, burst)
	per := make(map[int]int)
	for _, a := range arr {
		per[a.Worker]++
	}
	t.Logf("accepted per process: %v", per)
}

// TestFleetUnevenLoad: one busy process (16 goroutines) and three nearly
// idle ones (one request every 500 ms each). The busy one must get the
// capacity the idle ones leave, which a per-pod split (rate/4 each) wastes.
func TestFleetUnevenLoad(t *testing.T) {
	f := newFleet(t)
	const rate, burst, idle = 50, 10, 3
	const every = 500 * time.Millisecond
	specs := []fleettest.Spec{f.worker(0, "fleet-uneven", "token", rate, burst, 16)}
	for i := 1; i <= idle; i++ {
		s := f.worker(i, "fleet-uneven", "token", rate, burst, 1)
		s.Every = every
		specs = append(specs, s)
	}
	sums := f.run(t, specs, time.Now().Add(fleetStartDelay))

	arr := f.srv.Arrivals()
	assert.Equal(t, totalSent(sums), len(arr), "requests the workers completed vs arrivals at the server")
	span, _ := checkTokenBucket(t, fleettest.Times(arr), releasesOf(sums), rate, burst)
	busy, trickle := 0, 0
	for _, a := range arr {
		if a.Worker == 0 {
			busy++
		} else {
			trickle++
		}
	}
	// What a per-pod split would have let through over the same span: the
	// busy pod held to rate/4 (plus its share of the burst), the idle pods
	// sending what they sent.
	split := int(rate/4.0*span.Seconds()) + burst/4
	t.Logf("busy process: %d accepted (%.1f/s); idle processes: %d; a per-pod split of %v/s would give the busy one about %d, the fleet %d (%.0f%% of the rate)",
		busy, float64(busy)/span.Seconds(), trickle, rate/4.0, split, split+trickle, 100*float64(split+trickle)/(rate*span.Seconds()))
	assert.GreaterOrEqual(t, float64(busy), minUtilisation*rate*span.Seconds()-float64(trickle),
		"the busy process did not get the capacity the idle ones left")
}

// TestFleetCooldown: 4 processes × 4 goroutines at 40/s; the upstream
// answers one request, the first after start+1s, with 429 and
// Retry-After: 2. No process may send during the pause, and the 429'd
// request must be retried and succeed.
func TestFleetCooldown(t *testing.T) {
	f := newFleet(t)
	const rate, burst, procs, goroutines = 40, 4, 4, 4
	const pause = 2 * time.Second
	const (
		// inFlight: requests already released when the 429 was sent may
		// still arrive just after it.
		inFlight = 50 * time.Millisecond
		// early: the pause runs from when the worker read the 429, after
		// the server sent it; the end of the window is checked a little
		// early only for the clocks' read order.
		early = 20 * time.Millisecond
	)
	start := time.Now().Add(fleetStartDelay)
	f.srv.RejectOnceAfter(start.Add(time.Second), "2")
	var specs []fleettest.Spec
	for i := range procs {
		s := f.worker(i, "fleet-cooldown", "token", rate, burst, goroutines)
		s.Attempts = 5
		specs = append(specs, s)
	}
	sums := f.run(t, specs, start)

	arr := f.srv.Arrivals()
	var t429 time.Time
	rejected, who := 0, -1
	for _, a := range arr {
		if a.Status == http.StatusTooManyRequests {
			rejected++
			t429, who = a.At, a.Worker
		}
	}
	require.Equal(t, 1, rejected, "429s sent by the upstream")
	assert.Equal(t, totalSent(sums)+1, len(arr), "arrivals: one per request, plus the retry of the 429")
	for _, s := range sums {
		assert.Equal(t, s.Sent, s.Statuses[http.StatusOK], "worker %d: every request must end in 200", s.Worker)
	}

	var during, after []time.Duration // offsets from t429
	for _, a := range arr {
		d := a.At.Sub(t429)
		switch {
		case d <= 0:
		case d <= inFlight:
			after = append(after, d)
		case d < pause-early:
			during = append(during, d)
		}
	}
	first := time.Duration(0)
	for _, a := range arr {
		if d := a.At.Sub(t429); d > inFlight {
			first = d
			break
		}
	}
	t.Logf("429 sent to worker %d at start+%v; %d arrivals in the next %v (in flight): %v; first arrival after that: t429+%v (pause %v)",
		who, t429.Sub(start).Round(time.Millisecond), len(after), inFlight, roundAll(after), first.Round(time.Millisecond), pause)
	assert.Empty(t, roundAll(during), "arrivals during the fleet pause [t429+%v, t429+%v), as offsets from t429", inFlight, pause-early)
	assert.GreaterOrEqual(t, first, pause-early, "first arrival after the pause")
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(100 * time.Microsecond)
	}
	return out
}

// TestFleetPacer: 4 processes × 4 goroutines through one shared leaky
// bucket at 40/s: the arrivals are spaced 1/rate apart, fleet-wide.
//
// A single gap can be shortened by the noise alone: a request released late
// (its timer fired late, its process was descheduled) arrives closer to the
// next one, which was on time. So the spacing is checked three ways that
// noise does not break but a pacer that releases early or in bunches does:
// no run of arrivals is ahead of the 1/rate schedule by more than a stall;
// the 10th percentile of the gaps is within a third of 1/rate; the mean is
// 1/rate. The minimum and the 1st percentile are logged.
func TestFleetPacer(t *testing.T) {
	f := newFleet(t)
	const rate, depth, procs, goroutines = 40, 1000, 4, 4
	const interval = time.Second / rate
	// p10Slack: how much closer than 1/rate the 10th percentile of the
	// gaps may be (22 ms has been seen with three CPU hogs on 2 cores; a
	// pacer that releases in pairs puts it near 0).
	const p10Slack = 8 * time.Millisecond
	var specs []fleettest.Spec
	for i := range procs {
		specs = append(specs, f.worker(i, "fleet-pacer", "leaky", rate, depth, goroutines))
	}
	sums := f.run(t, specs, time.Now().Add(fleetStartDelay))

	arr := f.srv.Arrivals()
	assert.Equal(t, totalSent(sums), len(arr), "requests the workers completed vs arrivals at the server")
	at := fleettest.Times(arr)
	rel := releasesOf(sums)
	g, rg := fleettest.Gaps(at), fleettest.Gaps(rel)
	ahead, relAhead := fleettest.AheadOfSchedule(at, interval), fleettest.AheadOfSchedule(rel, interval)
	t.Logf("1/rate %v; arrivals at the server: %v, ahead of schedule by at most %v; releases from the workers: %v, ahead by at most %v",
		interval, g, ahead.Round(10*time.Microsecond), rg, relAhead.Round(10*time.Microsecond))
	require.Greater(t, g.N, 100)
	// A stall of the whole machine longer than fleetStall (92 ms has been
	// seen under -race) holds every worker's turns back, and they go at
	// once after it; the workers' own sleeps overslept as much. So the
	// bound grows with the longest of those, and a turn's length more at
	// the server (a request released after the stall can be held up on its
	// way too). A pacer that bunches its releases does so with no stall.
	var stalled time.Duration
	for _, s := range sums {
		stalled = max(stalled, s.Stall)
	}
	relBound, arrBound := max(fleetStall, stalled+interval), max(fleetStall, stalled+2*interval)
	t.Logf("the workers stalled up to %v: ahead by at most %v at the workers, %v at the server", stalled.Round(100*time.Microsecond), relBound, arrBound)
	assert.LessOrEqual(t, relAhead, relBound, "releases ran ahead of one per 1/rate")
	assert.LessOrEqual(t, ahead, arrBound, "arrivals ran ahead of one per 1/rate")
	assert.GreaterOrEqual(t, g.P10, interval-p10Slack, "10th percentile of the gaps between arrivals")
	assert.InDelta(t, float64(interval), float64(g.Mean), float64(interval)/20, "mean gap between arrivals")
}
