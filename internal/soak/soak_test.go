// Package soak holds the chaos soak of the shared limiters: a fleet of
// worker processes sends to the fake provider through one SharedTokenBucket
// on one redis-server while, at random moments, Redis is killed and
// restarted, paused (CLIENT PAUSE), its scripts flushed (SCRIPT FLUSH), its
// data flushed (FLUSHALL), and one worker is killed with SIGKILL and
// replaced. It runs for about two minutes, outside the default test run:
//
//	EGRESS_SOAK=1 go test -race -count=1 -timeout 5m -run TestChaosSoak -v ./internal/soak/
//
// or make soak. EGRESS_SOAK_SEED picks the chaos schedule (default: the
// clock); EGRESS_SOAK_DURATION the run (default 100s). The test logs a
// table of the figures: requests failed, the worst one-second window
// against the limit and against what the fallback allows during outages,
// the 429s the provider sent, and each worker's goroutines and heap at the
// end.
package soak

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/egress-go/egress"
	"github.com/egress-go/egress/internal/fakeapi"
	"github.com/egress-go/egress/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	envSoak     = "EGRESS_SOAK"          // 1: run the soak
	envSeed     = "EGRESS_SOAK_SEED"     // the chaos schedule's seed
	envDuration = "EGRESS_SOAK_DURATION" // the run, as a time.Duration
	envWorker   = "EGRESS_SOAK_WORKER"   // a worker's spec, as JSON

	rate       = 50 // per second: the provider's limit and the fleet's
	burst      = 10
	procs      = 4
	goroutines = 8

	defaultRun     = 100 * time.Second
	startDelay     = 2 * time.Second        // for the -race workers to start
	commandTimeout = 200 * time.Millisecond // per Redis command of a worker
	requestTimeout = time.Minute            // per request, retries included
	attempts       = 10                     // RetryPolicy.MaxAttempts
	// stall: how much closer together a loaded 2-core machine under -race
	// can bunch arrivals released apart (see fleet_test.go).
	stall = 75 * time.Millisecond
	// fallbackTail: how long after leaving fallback a worker may still
	// release turns its local limiter gave (goroutines at its share).
	fallbackTail = time.Duration(goroutines * procs * float64(time.Second) / rate)

	reportPrefix = "SOAK-REPORT "
)

// spec is what a worker does.
type spec struct {
	Worker int
	Redis  string
	URL    string
	Start  time.Time
	Until  time.Time
}

// report is what a worker says at the end.
type report struct {
	Worker     int
	Sent, OK   int
	Errors     int
	FirstError string `json:",omitempty"`
	Statuses   map[int]int
	Switches   []switchAt
	Goroutines int    // after Close, once the client and connections are closed
	HeapAlloc  uint64 // after a GC, at the same moment
}

type switchAt struct {
	At     int64 // UnixNano
	Active bool
}

// TestSoakWorker is one worker process; TestChaosSoak starts it.
func TestSoakWorker(t *testing.T) {
	raw, ok := os.LookupEnv(envWorker)
	if !ok {
		t.Skip("a soak worker process: TestChaosSoak starts it")
	}
	var s spec
	require.NoError(t, json.Unmarshal([]byte(raw), &s))
	rep := work(t, s)
	b, err := json.Marshal(rep)
	require.NoError(t, err)
	fmt.Fprintf(os.Stdout, "\n%s%s\n", reportPrefix, b)
}

func work(t *testing.T, s spec) report {
	var dl redialWait
	rdb := redis.NewClient(&redis.Options{
		Addr:                     s.Redis,
		Dialer:                   dl.dial,
		DialTimeout:              time.Second,
		ReadTimeout:              time.Second,
		WriteTimeout:             time.Second,
		ContextTimeoutEnabled:    true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	var mu sync.Mutex
	rep := report{Worker: s.Worker, Statuses: map[int]int{}}
	lim, err := egress.NewSharedTokenBucket(rdb, "soak", egress.PerSecond(rate), burst,
		egress.WithCommandTimeout(commandTimeout),
		egress.WithFallbackObserver(func(_ string, active bool, _ error) {
			mu.Lock()
			rep.Switches = append(rep.Switches, switchAt{At: time.Now().UnixNano(), Active: active})
			mu.Unlock()
		}))
	require.NoError(t, err)
	wire := &http.Transport{MaxIdleConnsPerHost: 2 * goroutines}
	tr, err := egress.New(wire, egress.WithLimiter(lim), egress.WithRetry(egress.RetryPolicy{MaxAttempts: attempts}))
	require.NoError(t, err)
	client := &http.Client{Transport: tr}

	time.Sleep(time.Until(s.Start))
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(s.Until) {
				status, err := get(client, s.URL)
				mu.Lock()
				rep.Sent++
				if err != nil || status != http.StatusOK {
					rep.Errors++
					if rep.FirstError == "" {
						rep.FirstError = fmt.Sprintf("status %d, error %v", status, err)
					}
				} else {
					rep.OK++
				}
				rep.Statuses[status]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()

	assert.NoError(t, lim.Close())
	tr.CloseIdleConnections()
	assert.NoError(t, rdb.Close())
	dl.wait()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	mu.Lock()
	defer mu.Unlock()
	rep.Goroutines, rep.HeapAlloc = runtime.NumGoroutine(), ms.HeapAlloc
	rep.Switches = slices.Clone(rep.Switches)
	return rep
}

func get(client *http.Client, u string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u+"/v1/charges", nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

// redialWait dials for go-redis and remembers the last failed dial, so
// that the worker can outwait the goroutine go-redis runs to redial once a
// second after failed dials, which notices the client is closed only
// after its sleep.
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

func (r *redialWait) wait() {
	r.mu.Lock()
	last := r.failed
	r.mu.Unlock()
	if !last.IsZero() {
		time.Sleep(time.Until(last.Add(1100 * time.Millisecond)))
	}
}

// worker is a running worker process.
type worker struct {
	spec spec
	cmd  *exec.Cmd
	out  bytes.Buffer
	errb bytes.Buffer
	err  error
	done chan struct{}
}

func startWorker(t *testing.T, s spec) *worker {
	t.Helper()
	raw, err := json.Marshal(s)
	require.NoError(t, err)
	w := &worker{spec: s, done: make(chan struct{})}
	w.cmd = exec.Command(os.Args[0], "-test.run=^TestSoakWorker$", "-test.count=1", "-test.timeout=10m")
	w.cmd.Env = append(os.Environ(), envWorker+"="+string(raw))
	w.cmd.Stdout, w.cmd.Stderr = &w.out, &w.errb
	w.cmd.WaitDelay = 2 * time.Second
	require.NoError(t, w.cmd.Start())
	go func() {
		w.err = w.cmd.Wait()
		close(w.done)
	}()
	t.Cleanup(func() {
		_ = w.cmd.Process.Kill()
		<-w.done
	})
	return w
}

func (w *worker) report() (report, error) {
	<-w.done
	sc := bufio.NewScanner(strings.NewReader(w.out.String()))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), reportPrefix); ok {
			var r report
			err := json.Unmarshal([]byte(line), &r)
			if err == nil && w.err != nil {
				err = fmt.Errorf("exit %v", w.err)
			}
			return r, err
		}
	}
	return report{}, fmt.Errorf("worker %d: exit %v, no report\nstdout:\n%s\nstderr:\n%s", w.spec.Worker, w.err, tail(w.out.String()), tail(w.errb.String()))
}

func tail(s string) string {
	if len(s) > 4096 {
		return "..." + s[len(s)-4096:]
	}
	return s
}

// recorder is the provider's front door: it records when every attempt
// arrived and passes it on.
type recorder struct {
	mu sync.Mutex
	at []time.Time // guarded by mu
}

func (r *recorder) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.at = append(r.at, time.Now())
		r.mu.Unlock()
		next.ServeHTTP(w, req)
	})
}

func (r *recorder) times() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	at := slices.Clone(r.at)
	slices.SortFunc(at, time.Time.Compare)
	return at
}

// event is one act of chaos, from At to End (equal when instantaneous).
type event struct {
	Kind    string
	At, End time.Time
	Detail  string
}

// The kinds of chaos.
const (
	kindRestart     = "kill+restart Redis"
	kindPause       = "CLIENT PAUSE"
	kindScriptFlush = "SCRIPT FLUSH"
	kindFlushAll    = "FLUSHALL"
	kindKillWorker  = "SIGKILL a worker"
)

// TestChaosSoak is the soak; see the package doc.
func TestChaosSoak(t *testing.T) {
	if os.Getenv(envSoak) != "1" {
		t.Skip("the chaos soak runs for about two minutes: EGRESS_SOAK=1 (make soak)")
	}
	run := defaultRun
	if v := os.Getenv(envDuration); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err)
		run = d
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(envSeed); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err)
		seed = n
	}
	t.Logf("seed %d (%s=%d repeats this schedule), run %v", seed, envSeed, seed, run)
	rng := rand.New(rand.NewPCG(seed, seed))

	srv := redistest.Start(t)
	rdb := srv.Client(t)
	api, err := fakeapi.Start(fakeapi.Config{Rate: rate, Burst: burst})
	require.NoError(t, err)
	t.Cleanup(api.Close)
	target, err := url.Parse(api.URL())
	require.NoError(t, err)
	var rec recorder
	front := httptest.NewServer(rec.wrap(httputil.NewSingleHostReverseProxy(target)))
	t.Cleanup(front.Close)

	start := time.Now().Add(startDelay)
	until := start.Add(run)
	workers := make([]*worker, 0, procs+1)
	for i := range procs {
		workers = append(workers, startWorker(t, spec{Worker: i, Redis: srv.Addr, URL: front.URL, Start: start, Until: until}))
	}

	events := chaos(t, rng, srv, rdb, start, until, func() string {
		// Kill a worker and start its replacement, as an orchestrator
		// would restart a pod.
		i := rng.IntN(procs)
		_ = workers[i].cmd.Process.Signal(syscall.SIGKILL)
		<-workers[i].done
		n := len(workers)
		workers = append(workers, startWorker(t, spec{Worker: n, Redis: srv.Addr, URL: front.URL, Start: time.Now(), Until: until}))
		return fmt.Sprintf("worker %d killed, worker %d started", i, n)
	})

	var reps []report
	killed := 0
	for _, w := range workers {
		r, err := w.report()
		if w.cmd.ProcessState != nil && !w.cmd.ProcessState.Success() && strings.Contains(w.err.Error(), "killed") {
			killed++
			continue
		}
		require.NoError(t, err)
		reps = append(reps, r)
	}
	summarize(t, start, until, events, reps, killed, rec.times(), api.Stats(start))
}

// chaos runs the schedule until until: each kind of event twice and one
// worker killed, in a random order, at random moments spread over the
// run. It returns what it did.
func chaos(t *testing.T, rng *rand.Rand, srv *redistest.Server, rdb *redis.Client, start, until time.Time, killWorker func() string) []event {
	t.Helper()
	kinds := []string{kindRestart, kindRestart, kindPause, kindPause, kindScriptFlush, kindScriptFlush,
		kindFlushAll, kindFlushAll, kindKillWorker}
	rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	// Slots of equal length after a quiet first tenth; each event at a
	// random moment in the first half of its slot.
	quiet := until.Sub(start) / 10
	slot := (until.Sub(start) - 2*quiet) / time.Duration(len(kinds))
	var evs []event
	for i, k := range kinds {
		at := start.Add(quiet + time.Duration(i)*slot + time.Duration(rng.Int64N(int64(slot/2))))
		time.Sleep(time.Until(at))
		ev := event{Kind: k, At: time.Now()}
		switch k {
		case kindRestart:
			down := time.Duration(1000+rng.IntN(2000)) * time.Millisecond
			srv.Stop()
			time.Sleep(down)
			srv.Restart(t)
			ev.Detail = fmt.Sprintf("down %v", time.Since(ev.At).Round(time.Millisecond))
		case kindPause:
			ms := 1000 + rng.IntN(2000)
			ev.Detail = fmt.Sprintf("%d ms: %v", ms, redisDo(rdb, "CLIENT", "PAUSE", ms, "ALL"))
			time.Sleep(time.Duration(ms) * time.Millisecond)
		case kindScriptFlush:
			ev.Detail = fmt.Sprint(redisDo(rdb, "SCRIPT", "FLUSH"))
		case kindFlushAll:
			ev.Detail = fmt.Sprint(redisDo(rdb, "FLUSHALL"))
		case kindKillWorker:
			ev.Detail = killWorker()
		}
		ev.End = time.Now()
		t.Logf("start%+v %s (%s)", ev.At.Sub(start).Round(time.Millisecond), k, ev.Detail)
		evs = append(evs, ev)
	}
	return evs
}

// redisDo runs a command, trying again for up to 3 s: after a restart the
// client may take a second to reconnect.
func redisDo(rdb *redis.Client, args ...any) error {
	deadline := time.Now().Add(3 * time.Second)
	for {
		err := rdb.Do(context.Background(), args...).Err()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// interval is a span of time.
type interval struct{ from, to time.Time }

func (iv interval) meets(from, to time.Time) bool { return iv.from.Before(to) && iv.to.After(from) }

// summarize checks and logs the figures.
func summarize(t *testing.T, start, until time.Time, evs []event, reps []report, killed int, at []time.Time, st fakeapi.Stats) {
	t.Helper()
	var fallbacks []interval
	var sent, ok, failed int
	var inFallback time.Duration
	for _, r := range reps {
		sent, ok, failed = sent+r.Sent, ok+r.OK, failed+r.Errors
		var open *time.Time
		for _, s := range r.Switches {
			x := time.Unix(0, s.At)
			switch {
			case s.Active && open == nil:
				open = &x
			case !s.Active && open != nil:
				fallbacks = append(fallbacks, interval{*open, x})
				inFallback += x.Sub(*open)
				open = nil
			}
		}
		if open != nil {
			fallbacks = append(fallbacks, interval{*open, until})
			inFallback += until.Sub(*open)
		}
		t.Logf("worker %d: sent %d, ok %d, errors %d (first: %s), statuses %v, fallback %d times; at the end %d goroutines, heap %.1f MiB",
			r.Worker, r.Sent, r.OK, r.Errors, r.FirstError, r.Statuses, len(r.Switches)/2, r.Goroutines, float64(r.HeapAlloc)/(1<<20))
		assert.Zero(t, r.Errors, "worker %d: requests failed; first: %s", r.Worker, r.FirstError)
	}
	var outages, refills []interval
	for _, e := range evs {
		switch e.Kind {
		case kindRestart, kindPause:
			outages = append(outages, interval{e.At, e.End})
		}
		if e.Kind == kindRestart || e.Kind == kindFlushAll {
			// The bucket starts full again: one more burst within the
			// second after the data is back.
			refills = append(refills, interval{e.End, e.End.Add(time.Second)})
		}
	}

	// Each one-second window from an arrival, against its bound: rate +
	// burst, a burst more for each refill it meets, and while fallbacks
	// meet it, the fallbacks' rates (rate in all) and a burst per fallback
	// (each starts full) and the shared bucket refilled meanwhile.
	slack := int(rate * stall.Seconds())
	var worstCalm, worstChaos, worstChaosBound, worstOutage, worstOutageBound, over int
	hi := 0
	for lo := range at {
		for hi < len(at) && at[hi].Sub(at[lo]) < time.Second {
			hi++
		}
		from, to := at[lo], at[lo].Add(time.Second)
		n, bound, k := hi-lo, rate+burst, 0
		for _, iv := range refills {
			if iv.meets(from, to) {
				bound += burst
			}
		}
		for _, iv := range fallbacks {
			if (interval{iv.from, iv.to.Add(fallbackTail)}).meets(from, to) {
				k++
			}
		}
		if k > 0 {
			bound += rate + (k+1)*burst
			if n > worstOutage {
				worstOutage, worstOutageBound = n, bound
			}
		}
		if k == 0 && bound == rate+burst {
			worstCalm = max(worstCalm, n)
		} else if n-bound > worstChaos-worstChaosBound || worstChaosBound == 0 {
			worstChaos, worstChaosBound = n, bound
		}
		if n > bound+slack {
			over++
		}
	}
	maxWin := fakeapi.MaxInWindow(at, time.Second)
	span := until.Sub(start)
	var gsMax int
	var heapMax uint64
	for _, r := range reps {
		gsMax, heapMax = max(gsMax, r.Goroutines), max(heapMax, r.HeapAlloc)
	}
	counts := map[string]int{}
	for _, e := range evs {
		counts[e.Kind]++
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n| figure | value |\n| --- | ---: |\n")
	fmt.Fprintf(&b, "| run | %v, %d processes × %d goroutines, %v/s burst %d |\n", span, procs, goroutines, rate, burst)
	fmt.Fprintf(&b, "| chaos | %d restarts, %d pauses, %d SCRIPT FLUSH, %d FLUSHALL, %d worker killed |\n",
		counts[kindRestart], counts[kindPause], counts[kindScriptFlush], counts[kindFlushAll], counts[kindKillWorker])
	fmt.Fprintf(&b, "| requests completed (surviving workers) | %d (%d ok) |\n", sent, ok)
	fmt.Fprintf(&b, "| requests failed | **%d** |\n", failed)
	fmt.Fprintf(&b, "| attempts at the provider | %d (%.1f/s) |\n", len(at), float64(len(at))/span.Seconds())
	fmt.Fprintf(&b, "| 429s received | %d (%.2f%% of attempts) |\n", st.Limited, 100*float64(st.Limited)/float64(max(1, len(at))))
	fmt.Fprintf(&b, "| worst 1 s window, calm (vs R+B = %d) | %d |\n", rate+burst, worstCalm)
	fmt.Fprintf(&b, "| 1 s window nearest its bound, during chaos | %d of %d |\n", worstChaos, worstChaosBound)
	fmt.Fprintf(&b, "| worst 1 s window while workers were in fallback (vs the fallback's allowance) | %d of %d |\n", worstOutage, worstOutageBound)
	fmt.Fprintf(&b, "| worst 1 s window, anywhere | %d |\n", maxWin)
	fmt.Fprintf(&b, "| windows beyond their bound (+%d for stalls) | %d |\n", slack, over)
	fmt.Fprintf(&b, "| fallback entries, time in fallback (sum over workers) | %d, %v |\n", len(fallbacks), inFallback.Round(time.Millisecond))
	fmt.Fprintf(&b, "| goroutines at the end, most of any worker | %d |\n", gsMax)
	fmt.Fprintf(&b, "| heap at the end, most of any worker | %.1f MiB |\n", float64(heapMax)/(1<<20))
	t.Logf("figures:%s", b.String())

	assert.Zero(t, failed, "requests failed")
	assert.Equal(t, 1, killed, "workers killed")
	assert.LessOrEqual(t, worstCalm, rate+burst+slack, "a calm second beyond rate+burst")
	assert.Zero(t, over, "seconds beyond their bound")
	assert.Less(t, gsMax, 20, "goroutines left in a worker after Close")
}
