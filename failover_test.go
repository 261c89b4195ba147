package egress_test

// Failover tests: a fleet of worker processes shares one limit through a
// Redis deployment that survives the loss of its master, Redis Sentinel or
// a Redis Cluster with replicas, and the master is killed (SIGKILL) while
// the fleet is busy. The fleet must fail no request, stay within its limit
// plus what the fallback allows while instances are in it, and return to
// shared mode after the promotion. The figures (requests failed, the worst
// one-second window, the time spent in fallback) are logged; BENCHMARKS.md
// quotes them.
//
// The workers are this test binary (TestFailoverWorker), run by
// fleettest.Run; each writes the fallback switches it saw to a file in the
// directory its spec names (Spec.Out).

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
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
	failoverRate       = 50 // per second, fleet-wide
	failoverBurst      = 10
	failoverProcs      = 4
	failoverGoroutines = 4
	// failoverKillAt is when the master is killed, after the start.
	failoverKillAt = 2 * time.Second
	// failoverStartDelay leaves the -race worker processes time to start.
	failoverStartDelay = 1500 * time.Millisecond
	// failoverCommandTimeout bounds each Redis command of a worker: long
	// enough for a loaded -race process, short enough that a dead master
	// sends a request to the fallback at once.
	failoverCommandTimeout = 500 * time.Millisecond
	// failoverShared is how long before the end of the run every worker
	// must be admitting through Redis again.
	failoverShared = time.Second
)

// failoverReport is what a worker writes besides its fleettest.Summary.
type failoverReport struct {
	Worker      int
	Switches    []fallbackSwitch
	Fallback    bool  // in fallback at the end
	AdmittedEnd int64 // admitted through Redis in the last failoverShared of the run
}

// fallbackSwitch is one call of the fallback observer.
type fallbackSwitch struct {
	At     int64 // UnixNano
	Active bool
	Err    string `json:",omitempty"`
}

// TestFailoverWorker is one worker process of the failover tests; it runs
// only when a TestFailover* test starts this binary with fleettest.EnvSpec.
func TestFailoverWorker(t *testing.T) {
	spec, ok := fleettest.ReadSpec(t)
	if !ok {
		t.Skip("a failover worker process: the TestFailover* tests start it")
	}
	var dl redialWait
	rdb, err := failoverClient(spec.Redis, dl.dial)
	require.NoError(t, err)
	defer dl.wait()
	defer rdb.Close()

	var mu sync.Mutex
	var switches []fallbackSwitch
	lim, err := egress.NewSharedTokenBucket(rdb, spec.Name, egress.PerSecond(spec.Rate), spec.Burst,
		egress.WithCommandTimeout(failoverCommandTimeout),
		egress.WithFallbackObserver(func(_ string, active bool, err error) {
			s := fallbackSwitch{At: time.Now().UnixNano(), Active: active}
			if err != nil {
				s.Err = err.Error()
			}
			mu.Lock()
			switches = append(switches, s)
			mu.Unlock()
		}))
	require.NoError(t, err)

	wire := &http.Transport{MaxIdleConnsPerHost: 64}
	stamp := &stamper{next: wire}
	tr, err := egress.New(stamp, egress.WithLimiter(lim))
	require.NoError(t, err)
	client := &http.Client{Transport: tr}
	require.NoError(t, fleetWarmup(wire, spec))

	sum := fleettest.Summary{Worker: spec.Worker, Statuses: map[int]int{}}
	if d := time.Until(spec.Start); d > 0 {
		time.Sleep(d)
	} else {
		sum.StartLate = -d
	}
	end := spec.Start.Add(spec.Duration)
	var admittedLate atomic.Int64 // Admitted at end - failoverShared
	lateTimer := time.AfterFunc(time.Until(end.Add(-failoverShared)), func() {
		admittedLate.Store(lim.Stats().Admitted)
	})
	defer lateTimer.Stop()

	var smu sync.Mutex // guards sum
	var wg sync.WaitGroup
	for range spec.Goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				status, err := fleetGet(client, spec)
				smu.Lock()
				sum.Sent++
				switch {
				case err != nil || status != http.StatusOK:
					sum.Errors++
					if sum.FirstError == "" {
						sum.FirstError = fmt.Sprintf("status %d, error %v", status, err)
					}
				default:
					sum.OK++
				}
				sum.Statuses[status]++
				smu.Unlock()
			}
		}()
	}
	wg.Wait()

	st := lim.Stats()
	sum.RoundTrips, sum.Admitted = st.RoundTrips, st.Admitted
	sum.Releases = stamp.times()
	mu.Lock()
	rep := failoverReport{
		Worker: spec.Worker, Switches: slices.Clone(switches),
		Fallback: st.Fallback, AdmittedEnd: st.Admitted - admittedLate.Load(),
	}
	for _, s := range switches {
		if s.Active {
			sum.Fallbacks++
		}
	}
	mu.Unlock()
	raw, err := json.Marshal(rep)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(spec.Out, fmt.Sprintf("worker-%d.json", spec.Worker)), raw, 0o644))
	assert.NoError(t, lim.Close())
	tr.CloseIdleConnections()
	fleettest.Report(t, sum)
}

// failoverClient makes the worker's client from its spec's Redis field:
// "sentinel:<master name>@<sentinel>,<sentinel>,..." or
// "cluster:<node>,<node>,...", both through redis.NewUniversalClient.
func failoverClient(desc string, dial func(context.Context, string, string) (net.Conn, error)) (redis.UniversalClient, error) {
	opts := &redis.UniversalOptions{
		Dialer:                   dial,
		DialTimeout:              time.Second,
		ReadTimeout:              time.Second,
		WriteTimeout:             time.Second,
		ContextTimeoutEnabled:    true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
	kind, rest, _ := strings.Cut(desc, ":")
	switch kind {
	case "sentinel":
		name, addrs, ok := strings.Cut(rest, "@")
		if !ok {
			return nil, fmt.Errorf("sentinel spec %q: want name@addrs", desc)
		}
		opts.MasterName, opts.Addrs = name, strings.Split(addrs, ",")
	case "cluster":
		opts.Addrs, opts.IsClusterMode = strings.Split(rest, ","), true
	default:
		return nil, fmt.Errorf("unknown Redis deployment %q", desc)
	}
	return redis.NewUniversalClient(opts), nil
}

// redialWait dials for go-redis and remembers the last failed dial: after
// failed dials go-redis may run a goroutine that redials once a second and
// notices only after its sleep that the client was closed. Safe for
// concurrent use.
type redialWait struct {
	mu     sync.Mutex
	failed time.Time // guarded by mu
}

func (r *redialWait) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, network, addr)
	if err != nil {
		r.mu.Lock()
		r.failed = time.Now()
		r.mu.Unlock()
	}
	return conn, err
}

// wait outwaits that redialer, after the client is closed.
func (r *redialWait) wait() {
	r.mu.Lock()
	last := r.failed
	r.mu.Unlock()
	if !last.IsZero() {
		time.Sleep(time.Until(last.Add(1100 * time.Millisecond)))
	}
}

// failoverEvent is when the parent killed the master and when the
// deployment had promoted its replica.
type failoverEvent struct {
	killed, promoted time.Time
	old, next        string
	err              error
}

// runFailover runs the fleet against the deployment desc for run, calling
// kill at start+failoverKillAt, and checks and logs the outcome.
func runFailover(t *testing.T, desc, name string, run time.Duration, kill func(start time.Time) failoverEvent) {
	t.Helper()
	srv := fleettest.StartServer(t)
	dir := t.TempDir()
	start := time.Now().Add(failoverStartDelay)
	var specs []fleettest.Spec
	for i := range failoverProcs {
		specs = append(specs, fleettest.Spec{
			Worker: i, Redis: desc, URL: srv.URL, Name: name,
			Shape: "token", Rate: failoverRate, Burst: failoverBurst,
			Goroutines: failoverGoroutines, Start: start, Duration: run, Out: dir,
		})
	}
	events := make(chan failoverEvent, 1)
	go func() {
		time.Sleep(time.Until(start.Add(failoverKillAt)))
		events <- kill(start)
	}()
	sums := fleettest.Run(t, "^TestFailoverWorker$", specs, run+failoverStartDelay+30*time.Second)
	ev := <-events
	require.NoError(t, ev.err, "failover of the deployment")

	reps := make([]failoverReport, len(sums))
	for i := range sums {
		raw, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("worker-%d.json", i)))
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(raw, &reps[i]))
	}
	end := start.Add(run)
	failed, entries := 0, 0
	var ivs []fallbackInterval
	var lastBack time.Time
	for i, s := range sums {
		r := reps[i]
		wiv := fallbackIntervals(r.Switches, end)
		var inFallback time.Duration
		for _, iv := range wiv {
			inFallback += iv.to.Sub(iv.from)
		}
		ivs = append(ivs, wiv...)
		entries += len(wiv)
		failed += s.Errors
		if len(wiv) > 0 {
			lastBack = maxTime(lastBack, wiv[len(wiv)-1].to)
		}
		t.Logf("worker %d: sent %d, ok %d, errors %d, round trips %d, admitted %d (%d in the last %v); fallback: %d times, %v in all",
			s.Worker, s.Sent, s.OK, s.Errors, s.RoundTrips, s.Admitted, r.AdmittedEnd, failoverShared, len(wiv), inFallback.Round(time.Millisecond))
		for _, sw := range r.Switches {
			t.Logf("  start%+v active=%v %s", time.Unix(0, sw.At).Sub(start).Round(time.Millisecond), sw.Active, sw.Err)
		}
		assert.Zero(t, s.Errors, "worker %d: requests failed; first: %s", s.Worker, s.FirstError)
		assert.False(t, r.Fallback, "worker %d still in fallback at the end", s.Worker)
		assert.Positive(t, r.AdmittedEnd, "worker %d admitted nothing through Redis in the last %v", s.Worker, failoverShared)
	}
	assert.Positive(t, entries, "no worker entered fallback: the kill tested nothing")

	arr := srv.Arrivals()
	assert.Equal(t, totalSent(sums), len(arr), "requests the workers completed vs arrivals at the server")
	rel, at := releasesOf(sums), fleettest.Times(arr)
	worstRel, worstRelBound := worstAgainst(rel, ivs, 0)
	worstAt, worstAtBound := worstAgainst(at, ivs, failoverRate*fleetStall.Seconds())
	relWin, atWin := fakeapi.MaxInWindow(rel, time.Second), fakeapi.MaxInWindow(at, time.Second)
	t.Logf("master %s killed at start+%v; %s promoted at start+%v (%v after the kill); last worker back in shared mode at start+%v (%v after the promotion)",
		ev.old, ev.killed.Sub(start).Round(time.Millisecond), ev.next, ev.promoted.Sub(start).Round(time.Millisecond),
		ev.promoted.Sub(ev.killed).Round(time.Millisecond), lastBack.Sub(start).Round(time.Millisecond), lastBack.Sub(ev.promoted).Round(time.Millisecond))
	t.Logf("FIGURES requests %d, failed %d; worst 1 s window: releases %d, arrivals %d (limit R+B = %d; the fallback allowance %d); worst against its own bound: releases %d of %d, arrivals %d of %d; fallback entries %d",
		len(arr), failed, relWin, atWin, failoverRate+failoverBurst, failoverAllowance(failoverProcs),
		worstRel, worstRelBound, worstAt, worstAtBound, entries)
	assert.LessOrEqual(t, worstRel, worstRelBound, "releases in a one-second window beyond the limit and the fallback's allowance")
	assert.LessOrEqual(t, worstAt, worstAtBound, "arrivals in a one-second window beyond the limit, the fallback's allowance and a stall")
}

// fallbackInterval is a time one worker spent in fallback.
type fallbackInterval struct{ from, to time.Time }

// fallbackTail is how long after a worker leaves fallback its fallback
// may still release requests: each of its goroutines may hold a turn its
// local limiter gave, the last one goroutines/share away.
const fallbackTail = time.Duration(failoverGoroutines * failoverProcs * float64(time.Second) / failoverRate)

// fallbackIntervals pairs a worker's switches into intervals; one still
// open at the end runs to end.
func fallbackIntervals(sw []fallbackSwitch, end time.Time) []fallbackInterval {
	var out []fallbackInterval
	var open *time.Time
	for _, s := range sw {
		at := time.Unix(0, s.At)
		switch {
		case s.Active && open == nil:
			open = &at
		case !s.Active && open != nil:
			out = append(out, fallbackInterval{*open, at})
			open = nil
		}
	}
	if open != nil {
		out = append(out, fallbackInterval{*open, maxTime(end, *open)})
	}
	return out
}

// failoverBound is the most the fleet may send in a one-second window w
// that meets k fallback intervals: rate+burst when k is 0; otherwise the
// shared bucket (rate+burst), the bucket Redis refilled while unused
// (burst), every fallback at its share (together rate) with a full burst
// each time one is made (k·burst).
func failoverBound(k int) int {
	if k == 0 {
		return failoverRate + failoverBurst
	}
	return 2*failoverRate + (k+2)*failoverBurst
}

// failoverAllowance is failoverBound with each of procs in fallback once.
func failoverAllowance(procs int) int { return failoverBound(procs) }

// worstAgainst returns the one-second window of the sorted times at that
// comes nearest to (or goes furthest beyond) its bound, failoverBound of
// the fallback intervals it meets (each with its fallbackTail) plus slack,
// as its count and its bound.
func worstAgainst(at []time.Time, ivs []fallbackInterval, slack float64) (count, bound int) {
	best := -1 << 30
	hi := 0
	for lo := range at {
		for hi < len(at) && at[hi].Sub(at[lo]) < time.Second {
			hi++
		}
		from, to := at[lo], at[lo].Add(time.Second)
		k := 0
		for _, iv := range ivs {
			if iv.from.Before(to) && iv.to.Add(fallbackTail).After(from) {
				k++
			}
		}
		n, b := hi-lo, failoverBound(k)+int(slack)
		if n-b > best {
			best, count, bound = n-b, n, b
		}
	}
	return count, bound
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// TestFailoverSentinel: 4 processes × 4 goroutines share 50/s (burst 10)
// through a Sentinel deployment; the master is killed at start+2s and a
// sentinel promotes the replica.
func TestFailoverSentinel(t *testing.T) {
	t.Parallel() // a loose wall-clock suite: see wallclock in the Makefile
	if testing.Short() {
		t.Skip("failover tests run several processes for several seconds; skipped with -short")
	}
	d := redistest.StartSentinel(t)
	desc := "sentinel:" + d.MasterName + "@" + strings.Join(d.SentinelAddrs, ",")
	runFailover(t, desc, "failover-sentinel", 8*time.Second, func(time.Time) failoverEvent {
		var ev failoverEvent
		ev.old, ev.err = d.KillMaster()
		ev.killed = time.Now()
		if ev.err == nil {
			ev.next, ev.err = d.WaitFailover(ev.old, 20*time.Second)
		}
		ev.promoted = time.Now()
		return ev
	})
}

// TestFailoverCluster: the same fleet through a Redis Cluster of three
// masters with a replica each; the master of the limiter's key is killed at
// start+2s and its replica takes over. go-redis's cluster client keeps
// sending a slot's commands to the master it knew until it reloads the
// cluster's layout, at the latest 10 s after the last reload: the run is
// long enough for that.
func TestFailoverCluster(t *testing.T) {
	t.Parallel() // a loose wall-clock suite: see wallclock in the Makefile
	if testing.Short() {
		t.Skip("failover tests run several processes for several seconds; skipped with -short")
	}
	c := redistest.StartReplicatedCluster(t)
	cc := c.Client(t)
	const name = "failover-cluster"
	runFailover(t, "cluster:"+strings.Join(c.Addrs, ","), name, 14*time.Second, func(time.Time) failoverEvent {
		var ev failoverEvent
		ev.old, ev.err = masterOfLimiter(cc, name)
		if ev.err == nil {
			ev.err = c.Kill(ev.old)
		}
		ev.killed = time.Now()
		if ev.err == nil {
			ev.err = c.WaitHealed(20*time.Second, ev.old)
		}
		ev.promoted = time.Now()
		ev.next = fmt.Sprint(c.Masters())
		return ev
	})
}

// masterOfLimiter returns the address of the master holding the token
// bucket keys of the limiter name.
func masterOfLimiter(cc *redis.ClusterClient, name string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var mu sync.Mutex
	var found []string
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		keys, err := c.Keys(ctx, "egress:{"+name+":*}:tb").Result()
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			mu.Lock()
			found = append(found, c.Options().Addr)
			mu.Unlock()
		}
		return nil
	})
	if err == nil && len(found) != 1 {
		err = fmt.Errorf("the limiter's keys are on masters %v, want exactly one", found)
	}
	if err != nil {
		return "", err
	}
	return found[0], nil
}
