// Package fleettest runs a fleet of worker processes for the multi-process
// tests of the shared limiters: the test binary re-executes itself, once per
// worker, with the worker's Spec in an environment variable, and each worker
// prints one Summary line to its stdout. It also holds the upstream those
// workers call, a loopback HTTP server that records the arrival of every
// request, and the statistics the tests compute on those arrivals.
//
// The parent test:
//
//	srv := fleettest.StartServer(t)
//	sums := fleettest.Run(t, "^TestFleetWorker$", specs, time.Minute)
//	at := srv.Arrivals()
//
// The worker test, in the same binary:
//
//	spec, ok := fleettest.ReadSpec(t)
//	if !ok {
//		t.Skip("not a worker")
//	}
//	fleettest.Report(t, work(spec))
package fleettest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// EnvSpec is the environment variable that carries a worker's Spec, as JSON.
// A test process without it is not a worker.
const EnvSpec = "EGRESS_FLEET_WORKER"

// WorkerHeader carries the sending worker's index on every request, so the
// server can attribute arrivals.
const WorkerHeader = "X-Fleet-Worker"

// WarmupHeader marks the requests a worker sends, outside its limiter,
// to open its connections before the start: the server answers them 204 and
// does not record them.
const WarmupHeader = "X-Fleet-Warmup"

// summaryPrefix starts the worker's summary line on its stdout, which the
// testing package shares (PASS, goleak reports).
const summaryPrefix = "FLEET-SUMMARY "

// Spec is what one worker process does.
type Spec struct {
	Worker int    // index in the fleet, sent in WorkerHeader
	Redis  string // address of the shared redis-server
	URL    string // the upstream to GET
	Name   string // the shared limiter's name, the same across the fleet

	Shape string  // "token" (NewSharedTokenBucket) or "leaky" (NewSharedLeakyBucket)
	Rate  float64 // per second, fleet-wide
	Burst int     // token bucket: burst; pacer: queue depth

	Goroutines int           // concurrent senders
	Every      time.Duration // each sender's period; 0 sends back to back
	Start      time.Time     // when to begin sending (wall clock, shared by the fleet)
	Duration   time.Duration // how long to start new requests after Start
	Attempts   int           // RetryPolicy.MaxAttempts; 0 means no WithRetry
	Out        string        // a directory for a report of the test's own; empty for none
}

// Summary is what a worker reports when it is done.
type Summary struct {
	Worker     int
	Sent       int           // requests completed by client.Do (retries inside count once)
	OK         int           // of them, answered 200
	Errors     int           // failed, or answered anything but 200
	FirstError string        `json:",omitempty"`
	Statuses   map[int]int   `json:",omitempty"` // final statuses
	Releases   []int64       // UnixNano when each attempt left the Transport for the wire
	Fallbacks  int           // switches to the local fallback
	RoundTrips int64         // SharedStats.RoundTrips
	Admitted   int64         // SharedStats.Admitted
	StartLate  time.Duration // how late the worker was ready for Start (0 if on time)
	Stall      time.Duration // the most a short sleep overslept while it sent (see MeasureStall)
}

// stallTick is the sleep MeasureStall repeats.
const stallTick = 5 * time.Millisecond

// MeasureStall sleeps stallTick over and over until deadline and returns
// the most one sleep overslept: how long this process was kept from
// running, which its timers, and so its releases, share. (A stall of the
// whole machine holds every worker's turns back, and they go at once
// after it: a run ahead of the schedule that no limiter could have
// prevented.)
func MeasureStall(deadline time.Time) time.Duration {
	var most time.Duration
	for time.Now().Before(deadline) {
		t0 := time.Now()
		time.Sleep(stallTick)
		most = max(most, time.Since(t0)-stallTick)
	}
	return most
}

// ReadSpec returns the Spec of this process when it runs as a worker.
func ReadSpec(t testing.TB) (Spec, bool) {
	t.Helper()
	raw, ok := os.LookupEnv(EnvSpec)
	if !ok {
		return Spec{}, false
	}
	var s Spec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		t.Fatalf("fleettest: %s: %v", EnvSpec, err)
	}
	return s, true
}

// Report prints the worker's summary line.
func Report(t testing.TB, s Summary) {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatalf("fleettest: %v", err)
	}
	fmt.Fprintf(os.Stdout, "\n%s%s\n", summaryPrefix, b)
}

// Run starts one worker process per spec — this test binary, running only
// the tests matching run — waits for all of them and returns their
// summaries in the order of specs. It fails the test if a worker fails,
// exits without a summary, or outlives timeout. The workers are killed if
// the test ends first (t.Fatal, panic, timeout).
func Run(t testing.TB, run string, specs []Spec, timeout time.Duration) []Summary {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	type proc struct {
		cmd         *exec.Cmd
		out, stderr bytes.Buffer
		err         error
		done        chan struct{}
	}
	procs := make([]*proc, 0, len(specs))
	t.Cleanup(func() {
		cancel() // kills whatever still runs
		for _, p := range procs {
			<-p.done
		}
	})
	for _, s := range specs {
		raw, err := json.Marshal(s)
		if err != nil {
			t.Fatalf("fleettest: %v", err)
		}
		p := &proc{done: make(chan struct{})}
		p.cmd = exec.CommandContext(ctx, os.Args[0],
			"-test.run="+run, "-test.count=1", "-test.timeout="+(timeout+10*time.Second).String())
		p.cmd.Env = append(os.Environ(), EnvSpec+"="+string(raw))
		p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.stderr
		p.cmd.WaitDelay = 2 * time.Second // after a kill, for the output pipes
		if err := p.cmd.Start(); err != nil {
			t.Fatalf("fleettest: start worker %d: %v", s.Worker, err)
		}
		procs = append(procs, p)
		go func() {
			p.err = p.cmd.Wait()
			close(p.done)
		}()
	}
	sums := make([]Summary, len(procs))
	var errs []error
	for i, p := range procs {
		<-p.done
		sum, err := parseSummary(p.out.String())
		if p.err != nil || err != nil {
			errs = append(errs, fmt.Errorf("worker %d: exit %v, %v (context: %v)\nstdout:\n%s\nstderr:\n%s",
				specs[i].Worker, p.err, err, ctx.Err(), tail(p.out.String()), tail(p.stderr.String())))
		}
		sums[i] = sum
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("fleettest: %v", err)
	}
	return sums
}

func parseSummary(out string) (Summary, error) {
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), summaryPrefix); ok {
			var s Summary
			err := json.Unmarshal([]byte(line), &s)
			return s, err
		}
	}
	if err := sc.Err(); err != nil {
		return Summary{}, err
	}
	return Summary{}, errors.New("no summary line")
}

func tail(s string) string {
	const n = 4096
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// Arrival is one request as the server saw it.
type Arrival struct {
	At     time.Time
	Worker int // from WorkerHeader; -1 when absent
	Status int // the status the server answered
}

// Server is a loopback HTTP upstream that answers 200 and records the
// arrival time of every request. It can be told to answer one request with
// 429. It is safe for concurrent use.
type Server struct {
	URL string
	srv *httptest.Server

	mu          sync.Mutex
	arrivals    []Arrival // guarded by mu
	rejectAfter time.Time // guarded by mu; zero: never reject
	retryAfter  string    // guarded by mu
	rejected    bool      // guarded by mu
}

// StartServer starts a Server on 127.0.0.1; t.Cleanup closes it.
func StartServer(t testing.TB) *Server {
	t.Helper()
	s := &Server{}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.srv.URL
	t.Cleanup(s.srv.Close)
	return s
}

// RejectOnceAfter makes the server answer the first request that arrives at
// or after at with 429 Too Many Requests and the given Retry-After, and
// every other request with 200.
func (s *Server) RejectOnceAfter(at time.Time, retryAfter string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rejectAfter, s.retryAfter, s.rejected = at, retryAfter, false
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(WarmupHeader) != "" {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	worker, err := strconv.Atoi(r.Header.Get(WorkerHeader))
	if err != nil {
		worker = -1
	}
	s.mu.Lock()
	now := time.Now() // under mu: arrivals are recorded in order
	status := http.StatusOK
	if !s.rejectAfter.IsZero() && !s.rejected && !now.Before(s.rejectAfter) {
		s.rejected = true
		status = http.StatusTooManyRequests
		w.Header().Set("Retry-After", s.retryAfter)
	}
	s.arrivals = append(s.arrivals, Arrival{At: now, Worker: worker, Status: status})
	s.mu.Unlock()
	w.WriteHeader(status)
	fmt.Fprintln(w, `{"ok":true}`)
}

// Arrivals returns a copy of the arrivals so far, in order of arrival.
func (s *Server) Arrivals() []Arrival {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.arrivals)
}

// Times returns the arrival times of a, in order.
func Times(a []Arrival) []time.Time {
	at := make([]time.Time, len(a))
	for i, x := range a {
		at[i] = x.At
	}
	slices.SortFunc(at, time.Time.Compare)
	return at
}

// Unix converts UnixNano stamps to times, in order.
func Unix(ns []int64) []time.Time {
	at := make([]time.Time, len(ns))
	for i, n := range ns {
		at[i] = time.Unix(0, n)
	}
	slices.SortFunc(at, time.Time.Compare)
	return at
}

// GapStats describes the gaps between consecutive sorted times.
type GapStats struct {
	N                      int // gaps
	Min, P1, P10, P50, Max time.Duration
	Mean                   time.Duration
}

func (g GapStats) String() string {
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	return fmt.Sprintf("%d gaps: min %v, p1 %v, p10 %v, median %v, max %v, mean %v",
		g.N, r(g.Min), r(g.P1), r(g.P10), r(g.P50), r(g.Max), r(g.Mean))
}

// Gaps returns the statistics of the gaps between consecutive sorted times;
// it needs at least two.
func Gaps(at []time.Time) GapStats {
	if len(at) < 2 {
		return GapStats{}
	}
	gaps := make([]time.Duration, len(at)-1)
	for i := range gaps {
		gaps[i] = at[i+1].Sub(at[i])
	}
	slices.Sort(gaps)
	return GapStats{
		N:    len(gaps),
		Min:  gaps[0],
		P1:   gaps[len(gaps)/100],
		P10:  gaps[len(gaps)/10],
		P50:  gaps[len(gaps)/2],
		Max:  gaps[len(gaps)-1],
		Mean: at[len(at)-1].Sub(at[0]) / time.Duration(len(gaps)),
	}
}

// AheadOfSchedule returns how far the sorted times at run ahead of a
// schedule of one per interval: the most that any at[j] comes earlier than
// at[i] + (j-i)·interval, for i < j (0 when never). A pacer's releases,
// each no earlier than its slot, are never ahead of it; what arrives ahead
// was held up less on its way than an earlier one.
func AheadOfSchedule(at []time.Time, interval time.Duration) time.Duration {
	var ahead time.Duration
	if len(at) == 0 {
		return 0
	}
	// With v(k) = k·interval - (at[k]-at[0]), the lead of j over i is v(j) - v(i).
	minV := time.Duration(0)
	for k := 1; k < len(at); k++ {
		v := time.Duration(k)*interval - at[k].Sub(at[0])
		ahead = max(ahead, v-minV)
		minV = min(minV, v)
	}
	return ahead
}
