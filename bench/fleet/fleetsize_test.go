package fleet

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/egress-go/egress"
	"github.com/egress-go/egress/bench/internal/benchkit"
)

// The fleet-size scenario: many instances of one worker each, every one
// with its own Redis client, HTTP client and limiter, in front of a
// provider that advertises its bucket (RateLimit-*) on every response and
// answers after 2 ms.
const (
	fleetSizeName    = "TestFleetSize"         // the test's name, for the -run gate
	fleetSizeEnv     = "EGRESS_FLEETSIZE"      // set to run TestFleetSize without naming it in -run
	fleetSizeOnlyEnv = "EGRESS_FLEETSIZE_ONLY" // fleets to run, comma-separated ("64x1,256x1"); all when empty
	fleetSizeOutEnv  = "EGRESS_FLEETSIZE_OUT"  // a path to write the table to, as markdown
)

// fleetSize is one fleet: pods × workers at a provider of rate and burst.
type fleetSize struct {
	id            string
	pods, workers int
	rate          float64
	burst         int
}

func fleetSizes() []fleetSize {
	return []fleetSize{
		{id: "4x8", pods: 4, workers: 8, rate: 100, burst: 10},
		{id: "64x1", pods: 64, workers: 1, rate: 100, burst: 10},
		{id: "256x1", pods: 256, workers: 1, rate: 200, burst: 20},
	}
}

func (f fleetSize) load() load {
	pl := make([]podLoad, f.pods)
	for i := range pl {
		pl[i] = podLoad{workers: f.workers}
	}
	return load{name: f.id, pods: pl}
}

// fifoIdeal is the latency of a first come, first served queue of every
// worker at the rate.
func (f fleetSize) fifoIdeal() time.Duration {
	return time.Duration(float64(f.pods*f.workers) / f.rate * float64(time.Second))
}

// fleetDiag is what the pods of one row tell beside the provider's counts:
// Redis commands by name, fallbacks, rate changes with their reasons, and
// the limiters' own counters. Safe for concurrent use.
type fleetDiag struct {
	mu       sync.Mutex
	commands map[string]int // guarded by mu; by command (EVALSHA by script)
	changes  []string       // guarded by mu; "+1.23s 100->61 why"
	falls    []string       // guarded by mu; "+1.23s error" of each switch to the fallback
	stats    []func() egress.SharedStats
	start    time.Time

	total atomic.Int64 // Redis commands (a pipeline counts as one round trip)
	setup atomic.Int64 // of which a new connection's (HELLO, CLIENT SETINFO)
	own   atomic.Int64 // of which an instance's own: set-up, and heartbeats sent alone (joining, idle, leaving)
}

// roundTrips returns the Redis round trips per success of the load (every
// command but an instance's own) and an instance's own.
func (d *fleetDiag) roundTrips(successes, pods int) (load, own float64) {
	return float64(d.total.Load()-d.own.Load()) / float64(max(1, successes)), float64(d.own.Load()) / float64(max(1, pods))
}

// heartbeat reports whether cmd is a heartbeat: a script on the fleet's
// members key.
func heartbeat(cmd redis.Cmder) bool {
	args := cmd.Args()
	if n := cmd.Name(); (n != "evalsha" && n != "eval") || len(args) < 4 {
		return false
	}
	k, _ := args[3].(string)
	return strings.HasSuffix(k, ":members")
}

func (d *fleetDiag) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := cmd.Name()
		if args := cmd.Args(); (name == "evalsha" || name == "eval") && len(args) > 1 {
			s := fmt.Sprint(args[1])
			name += ":" + s[:min(8, len(s))]
		}
		d.total.Add(1)
		if name == "hello" {
			d.setup.Add(1)
		}
		if name == "hello" || heartbeat(cmd) {
			d.own.Add(1)
		}
		d.mu.Lock()
		d.commands[name]++
		d.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (d *fleetDiag) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		d.total.Add(1)
		name := "pipeline"
		if len(cmds) > 0 {
			name += ":" + cmds[0].Name()
			if cmds[0].Name() == "client" {
				d.setup.Add(1)
				d.own.Add(1)
			}
		}
		d.mu.Lock()
		d.commands[name]++
		d.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (d *fleetDiag) DialHook(next redis.DialHook) redis.DialHook { return next }

func (d *fleetDiag) rateChanged(key string, old, new egress.Rate, why string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.changes = append(d.changes, fmt.Sprintf("+%.2fs %.4g->%.4g %s", time.Since(d.start).Seconds(), old.PerSecond(), new.PerSecond(), why))
}

// options are the shared limiters' options of the row: discovery on, each
// switch to the fallback counted and its error noted.
func (d *fleetDiag) options(env podEnv) []egress.LimiterOption {
	return []egress.LimiterOption{egress.WithFallbackObserver(func(_ string, active bool, err error) {
		if !active {
			return
		}
		env.fallback.Add(1)
		d.mu.Lock()
		defer d.mu.Unlock()
		d.falls = append(d.falls, fmt.Sprintf("+%.2fs %v", time.Since(d.start).Seconds(), err))
	})}
}

func (d *fleetDiag) summary() (cmds string, changes []string, st egress.SharedStats) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var names []string
	for n := range d.commands {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "%s %d; ", n, d.commands[n])
	}
	for _, f := range d.stats {
		s := f()
		st.RoundTrips += s.RoundTrips
		st.Admitted += s.Admitted
		if s.Fallback {
			st.LiveInstances++ // (here: pods in fallback at the end)
		}
	}
	return b.String(), slices.Clone(d.changes), st
}

// sharedSizeStrategy is egress with a shared limiter made by mk, the
// default retries, and the row's diagnostics.
func sharedSizeStrategy(name string, d *fleetDiag, mk func(env podEnv) (sharedSizeLimiter, error)) strategy {
	return strategy{name: name, redis: true, newPod: func(env podEnv) (pod, error) {
		env.rdb.AddHook(d)
		lim, err := mk(env)
		if err != nil {
			return pod{}, err
		}
		d.mu.Lock()
		d.stats = append(d.stats, lim.Stats)
		d.mu.Unlock()
		tr, err := egress.New(env.base, egress.WithLimiter(lim), egress.WithRetry(egress.RetryPolicy{}),
			egress.WithObserver(egress.Observer{OnRateChange: d.rateChanged}))
		if err != nil {
			return pod{}, err
		}
		c := &http.Client{Transport: tr}
		return pod{do: c.Do, effectiveRate: func(key string) float64 { return lim.EffectiveRate(key).PerSecond() }, close: lim.Close}, nil
	}}
}

type sharedSizeLimiter interface {
	egressLimiter
	Stats() egress.SharedStats
	Close() error
}

// redisRateSizeStrategy is redisRateStrategy with its Redis commands counted.
func redisRateSizeStrategy(d *fleetDiag) strategy {
	st := redisRateStrategy()
	inner := st.newPod
	st.newPod = func(env podEnv) (pod, error) {
		env.rdb.AddHook(d)
		return inner(env)
	}
	return st
}

// TestFleetSize runs the fleet-size scenario: 4 × 8, 64 × 1 and 256 × 1
// instances × workers, egress's shared limiters beside redis_rate, and
// reports % of R, 429s, the most requests the fleet sent in any second
// against R + B, p50 and p99 against the FIFO ideal, and Redis round trips
// per success. About a minute and a half; runs only when named in -run or
// with EGRESS_FLEETSIZE=1.
//
//	cd bench && go test -run TestFleetSize -v ./fleet/ -count=1
//	cd bench && EGRESS_FLEETSIZE_ONLY=64x1 go test -run 'TestFleetSize/64x1/egress_SharedTokenBucket' -v ./fleet/ -count=1
func TestFleetSize(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for minutes; skipped under -short")
	}
	if f := flag.Lookup("test.run"); (f == nil || !strings.Contains(f.Value.String(), fleetSizeName)) && os.Getenv(fleetSizeEnv) == "" {
		t.Skipf("runs for minutes; name it in -run or set %s=1", fleetSizeEnv)
	}
	var out strings.Builder
	fmt.Fprintf(&out, "%s\n\n", benchkit.Machine())
	header := fleetSizeHeader()
	var rows [][]string
	only := os.Getenv(fleetSizeOnlyEnv)
	for _, f := range fleetSizes() {
		if only != "" && !slices.Contains(strings.Split(only, ","), f.id) {
			continue
		}
		for _, kind := range fleetSizeKinds() {
			d := &fleetDiag{commands: map[string]int{}}
			sc := scenario{
				strategy: fleetSizeStrategy(kind, f, d), load: f.load(), duration: signalDuration,
				provider: f.provider(), limits: f.limits(),
			}
			d.start = time.Now()
			name := f.id + "/" + kind
			o := runRow(t, name, sc)
			if o.calls == 0 {
				continue // left out by -run
			}
			m := signalMeasure{o: o}
			succ := m.successes()
			cmds, changes, ls := d.summary()
			rt, rtPod := d.roundTrips(o.accepted, f.pods)
			t.Logf("%s: sent per second %v (max %d, R+B %d); Redis commands %d: %s", name, o.sentPerSec, o.maxSentPerSec,
				int(f.rate)+f.burst, d.total.Load(), cmds)
			t.Logf("%s: reservations %d, admitted %d, sent %d, pods in fallback at the end %d; rate changes %d: %v",
				name, ls.RoundTrips, ls.Admitted, o.upstream, ls.LiveInstances, len(changes), head(changes, 20))
			t.Logf("%s: 429s at %v; first sends at %v", name, m.limitedOffsets(), offsets(o.start, head(o.sentAt, 40)))
			d.mu.Lock()
			t.Logf("%s: switches to the fallback %d: %v", name, len(d.falls), head(d.falls, 10))
			d.mu.Unlock()
			rows = append(rows, f.row(kind, succ, o, rt, rtPod))
		}
	}
	fmt.Fprintf(&out, "%s\nLoad after the run: %s\n", benchkit.Markdown(header, rows), benchkit.LoadAvg())
	t.Logf("\n%s", out.String())
	if path := os.Getenv(fleetSizeOutEnv); path != "" {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Errorf("%s: %v", fleetSizeOutEnv, err)
		}
	}
}

// head returns the first n of s, or all of it.
func head[T any](s []T, n int) []T { return s[:min(n, len(s))] }

// offsets returns ts as milliseconds from start.
func offsets(start time.Time, ts []time.Time) []string {
	var out []string
	for _, t := range ts {
		out = append(out, fmt.Sprintf("%.0f", t.Sub(start).Seconds()*1000))
	}
	return out
}
