package fleet

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egress-go/egress"
	"github.com/egress-go/egress/bench/internal/benchkit"
)

// The environment of a process of TestFleetProcesses' fleet, set by the
// parent test when it starts the process.
const (
	procFleetEnv     = "EGRESS_FLEETPROC_FLEET"     // the layout's id (procFleets); set only in a child
	procKindEnv      = "EGRESS_FLEETPROC_KIND"      // the strategy, one of fleetSizeKinds
	procIndexEnv     = "EGRESS_FLEETPROC_INDEX"     // the process's index in the fleet, from 0
	procInstancesEnv = "EGRESS_FLEETPROC_INSTANCES" // instances in the process
	procRedisEnv     = "EGRESS_FLEETPROC_REDIS"     // Redis's address, host:port
	procURLEnv       = "EGRESS_FLEETPROC_URL"       // the provider's base URL
	procStartEnv     = "EGRESS_FLEETPROC_START"     // when the load starts, in Unix nanoseconds
	procDurationEnv  = "EGRESS_FLEETPROC_DURATION"  // how long workers start calls, as time.ParseDuration reads it

	procChildName    = "TestFleetProcChild" // the test a child runs
	procReportPrefix = "fleetproc-report: " // starts the line of a child's report on its stdout
)

// procChildConfig is what a process of the fleet runs.
type procChildConfig struct {
	fleet     procFleet
	kind      string
	index     int
	instances int
	redis     string
	url       string
	start     time.Time // wall clock only: the same instant in every process
	duration  time.Duration
}

// env is c as the child's environment variables.
func (c procChildConfig) env() []string {
	return []string{
		procFleetEnv + "=" + c.fleet.id,
		procKindEnv + "=" + c.kind,
		procIndexEnv + "=" + strconv.Itoa(c.index),
		procInstancesEnv + "=" + strconv.Itoa(c.instances),
		procRedisEnv + "=" + c.redis,
		procURLEnv + "=" + c.url,
		procStartEnv + "=" + strconv.FormatInt(c.start.UnixNano(), 10),
		procDurationEnv + "=" + c.duration.String(),
	}
}

// procChildConfigFrom reads a child's configuration with getenv.
func procChildConfigFrom(getenv func(string) string) (procChildConfig, error) {
	c := procChildConfig{kind: getenv(procKindEnv), redis: getenv(procRedisEnv), url: getenv(procURLEnv)}
	id := getenv(procFleetEnv)
	for _, f := range procFleets() {
		if f.id == id {
			c.fleet = f
		}
	}
	var errs []error
	if c.fleet.pods == 0 {
		errs = append(errs, fmt.Errorf("%s: no layout %q", procFleetEnv, id))
	}
	var err error
	if c.index, err = strconv.Atoi(getenv(procIndexEnv)); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", procIndexEnv, err))
	}
	if c.instances, err = strconv.Atoi(getenv(procInstancesEnv)); err != nil || c.instances < 1 {
		errs = append(errs, fmt.Errorf("%s: %q is not a positive count", procInstancesEnv, getenv(procInstancesEnv)))
	}
	ns, err := strconv.ParseInt(getenv(procStartEnv), 10, 64)
	if err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", procStartEnv, err))
	}
	c.start = time.Unix(0, ns)
	if c.duration, err = time.ParseDuration(getenv(procDurationEnv)); err != nil || c.duration <= 0 {
		errs = append(errs, fmt.Errorf("%s: %q is not a positive duration", procDurationEnv, getenv(procDurationEnv)))
	}
	if c.redis == "" || c.url == "" {
		errs = append(errs, fmt.Errorf("%s and %s are required", procRedisEnv, procURLEnv))
	}
	return c, errors.Join(errs...)
}

// procReport is what a process of the fleet measured, written as one line
// of JSON. Times are from the agreed start, by the wall clock every process
// of the machine shares.
type procReport struct {
	Index      int
	Ready      time.Duration        // from the instances being built to the start; negative when late
	Woke       time.Duration        // from the start to the process's waking for it: how late its load started
	Calls      int                  // calls made
	Latencies  []time.Duration      // of the successful calls, sorted
	Succeeded  []time.Duration      // when each successful call returned
	Sent       []time.Duration      // when each attempt left an instance
	Limited    int                  // 429s (and 403s) the instances received
	Commands   map[string]int       // Redis commands by name, as fleetDiag counts them
	Total      int64                // Redis round trips
	Own        int64                // of them, the instances' own (see fleetDiag)
	EarlyTotal int64                // Redis round trips before the process's load started: heartbeats while idle, and connection set-up
	EarlySetup int64                // of them, connection set-up
	Fallbacks  int64                // egress's switches to its local fallback
	Early      int64                // of them, before the process's load started
	Failures   map[string]int       // failed calls by cause: the refusal's reason, the error, or the final status
	Changes    []string             // egress's rate changes
	Falls      []string             // the errors of the switches to the fallback
	Stats      []egress.SharedStats // each instance's shared limiter at the end; none for redis_rate
	GCs        uint32               // garbage collections in the process
	GOMAXPROCS int
	PeakRSSKiB int // the process's peak resident set (VmHWM); 0 where unknown
}

// TestFleetProcChild is one process of TestFleetProcesses' fleet: it runs
// the instances its environment describes, from the agreed start for the
// agreed duration, and writes its procReport on stdout. Its stdin is a pipe
// from the parent: its end (the parent gone) ends the run. Skipped unless
// TestFleetProcesses started it.
func TestFleetProcChild(t *testing.T) {
	if os.Getenv(procFleetEnv) == "" {
		t.Skipf("a process of %s's fleet; runs only when started by it", fleetProcsName)
	}
	c, err := procChildConfigFrom(os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin) // returns when the parent's end closes
		cancel()
	}()
	rep, err := runProcChild(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("%s%s\n", procReportPrefix, b)
}

// runProcChild builds c's instances as the process starts up, each with
// its own Redis client, HTTP client and limiter; waits for the start;
// drives them until the start plus the duration; closes them; and
// reports. Redis commands are counted until the instances are closed, as
// TestFleetSize counts them.
func runProcChild(ctx context.Context, c procChildConfig) (procReport, error) {
	f := c.fleet.fleetSize
	d := &fleetDiag{commands: map[string]int{}, start: c.start}
	st := fleetSizeStrategy(c.kind, f, d)
	var (
		rec      probeRecord
		fallback atomic.Int64
		pods     []pod
		closed   bool
		failures = &causes{n: map[string]int{}}
	)
	closeAll := func() error {
		if closed {
			return nil
		}
		closed = true
		var errs []error
		for _, p := range pods {
			if p.close != nil {
				errs = append(errs, p.close())
			}
		}
		return errors.Join(errors.Join(errs...), rec.Close())
	}
	defer func() { _ = closeAll() }() // on an early return; after the run, closeAll is called and checked
	for range c.instances {
		env := podEnv{
			url: c.url, pods: f.pods, limits: f.limits(),
			base: rec.pool(f.workers), fallback: &fallback, rdb: rec.Redis(c.redis),
		}
		p, err := st.newPod(env)
		if err != nil {
			return procReport{}, err
		}
		p.do = failures.counting(p.do)
		pods = append(pods, p)
	}

	rep := procReport{Index: c.index, Ready: time.Until(c.start), GOMAXPROCS: runtime.GOMAXPROCS(0)}
	if err := benchkit.Sleep(ctx, time.Until(c.start)); err != nil {
		return rep, err
	}
	rep.Woke = time.Since(c.start)
	rep.Early, rep.EarlyTotal, rep.EarlySetup = fallback.Load(), d.total.Load(), d.setup.Load()
	l := load{name: f.id, pods: make([]podLoad, c.instances)}
	for i := range l.pods {
		l.pods[i] = podLoad{workers: f.workers}
	}
	tl := drive(ctx, c.url, l, pods, c.start.Add(c.duration))
	if err := closeAll(); err != nil {
		return rep, fmt.Errorf("closing the instances: %w", err)
	}

	rep.Calls, rep.Latencies, rep.Fallbacks = tl.calls, tl.latencies, fallback.Load()
	rep.Succeeded = since(c.start, tl.succeeded)
	rep.Sent = since(c.start, rec.sentTimes())
	rep.Limited = len(rec.limitedTimes())
	d.mu.Lock()
	rep.Commands, rep.Changes, rep.Falls = maps.Clone(d.commands), slices.Clone(d.changes), slices.Clone(d.falls)
	for _, s := range d.stats {
		rep.Stats = append(rep.Stats, s())
	}
	d.mu.Unlock()
	rep.Total, rep.Own = d.total.Load(), d.own.Load()
	rep.Failures = failures.counts()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rep.GCs, rep.PeakRSSKiB = ms.NumGC, peakRSSKiB()
	return rep, nil
}

// causes counts failed calls by cause. Safe for concurrent use.
type causes struct {
	mu sync.Mutex
	n  map[string]int // guarded by mu
}

// counting is do with each failed call counted: by the reason of egress's
// refusal, as a context's end, by the error's text, or by the final status.
func (c *causes) counting(do func(*http.Request) (*http.Response, error)) func(*http.Request) (*http.Response, error) {
	return func(req *http.Request) (*http.Response, error) {
		resp, err := do(req)
		var (
			le    *egress.LimitError
			cause string
		)
		switch {
		case errors.As(err, &le):
			cause = "refused: " + le.Reason.String()
		case errors.Is(err, context.DeadlineExceeded):
			cause = "deadline exceeded"
		case err != nil:
			cause = err.Error()[:min(80, len(err.Error()))]
		case resp.StatusCode != http.StatusOK:
			cause = "status " + strconv.Itoa(resp.StatusCode)
		default:
			return resp, err
		}
		c.mu.Lock()
		c.n[cause]++
		c.mu.Unlock()
		return resp, err
	}
}

func (c *causes) counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

// since returns each of ts as the time from start.
func since(start time.Time, ts []time.Time) []time.Duration {
	out := make([]time.Duration, len(ts))
	for i, t := range ts {
		out[i] = t.Sub(start)
	}
	return out
}

// peakRSSKiB is the process's peak resident set in KiB, from
// /proc/self/status; 0 where that is not to be had.
func peakRSSKiB() int {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return 0
}
