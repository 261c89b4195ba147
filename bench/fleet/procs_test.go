package fleet

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/egress-go/egress/bench/internal/benchkit"
	"github.com/egress-go/egress/internal/fakeapi"
	"github.com/egress-go/egress/internal/redistest"
)

// The fleet-size scenario with its instances in separate processes, each
// with its own Go runtime, scheduler and garbage collector, as a real
// fleet's are. Redis and the provider run beside the parent test.
const (
	fleetProcsName    = "TestFleetProcesses"     // the test's name, for the -run gate
	fleetProcsEnv     = "EGRESS_FLEETPROCS"      // set to run TestFleetProcesses without naming it in -run
	fleetProcsOnlyEnv = "EGRESS_FLEETPROCS_ONLY" // layouts to run, comma-separated ("8x8x1,64x1x1"); the default ones when empty
	fleetProcsOutEnv  = "EGRESS_FLEETPROCS_OUT"  // a path to write the table to, as markdown

	procLeadBase    = 1500 * time.Millisecond // from starting the first process to the load's start
	procLeadEach    = 150 * time.Millisecond  // and more for each process
	procLaunchGap   = 100 * time.Millisecond  // between starting one process and the next, so that their start-ups do not pile up on the CPUs
	procGrace       = 10 * time.Second        // after the last call's deadline, for the processes to report and exit
	procWaitDelay   = 2 * time.Second         // for a killed process's output to close
	procTimeoutMore = 5 * time.Second         // a process's own -test.timeout beyond the parent's deadline
	procOutputTail  = 2048                    // bytes of a failed process's output, quoted
)

// procFleet is a fleet of fleetSize run as procs processes of
// pods/procs instances each. Its id is processes x instances x workers.
type procFleet struct {
	fleetSize
	procs     int
	byDefault bool // run when fleetProcsOnlyEnv is empty
}

// procFleets are the layouts: 64 × 1 as 8 processes of 8 instances and
// 256 × 1 as 16 of 16 by default; 64 × 1 as 64 processes of one instance
// when named in fleetProcsOnlyEnv.
func procFleets() []procFleet {
	return []procFleet{
		procFleetOf("64x1", 8, true),
		procFleetOf("256x1", 16, true),
		procFleetOf("64x1", 64, false),
	}
}

// procFleetOf is the fleet of fleetSizes with id size in procs processes;
// its pods are 0 when there is no such fleet.
func procFleetOf(size string, procs int, byDefault bool) procFleet {
	for _, f := range fleetSizes() {
		if f.id == size && procs > 0 && f.pods%procs == 0 {
			f.id = fmt.Sprintf("%dx%dx%d", procs, f.pods/procs, f.workers)
			return procFleet{fleetSize: f, procs: procs, byDefault: byDefault}
		}
	}
	return procFleet{}
}

// TestFleetProcesses runs the fleet-size scenario with the instances in
// separate processes of this test binary (TestFleetProcChild): 8
// processes × 8 instances × 1 worker at R 100 B 10, and 16 × 16 × 1 at
// R 200 B 20, egress's shared limiters beside redis_rate, each row with a
// Redis and a provider of its own. The processes start procLaunchGap
// apart, build their instances as they start up, and start their load at
// one agreed instant. It prints TestFleetSize's table; 429s and the most
// sent in any second are counted where the provider received them, the
// rest is the processes' own, merged. About a minute and a half; runs only
// when named in -run or with EGRESS_FLEETPROCS=1.
//
//	cd bench && go test -run TestFleetProcesses -v ./fleet/ -count=1
//	cd bench && EGRESS_FLEETPROCS_ONLY=64x1x1 go test -run TestFleetProcesses -v ./fleet/ -count=1
func TestFleetProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for minutes; skipped under -short")
	}
	if f := flag.Lookup("test.run"); (f == nil || !strings.Contains(f.Value.String(), fleetProcsName)) && os.Getenv(fleetProcsEnv) == "" {
		t.Skipf("runs for minutes; name it in -run or set %s=1", fleetProcsEnv)
	}
	goroutines := runtime.NumGoroutine()
	var out strings.Builder
	fmt.Fprintf(&out, "%s\n\n", benchkit.Machine())
	fmt.Fprintf(&out, "Fleets as processes x instances x workers, each instance with its own Redis client, HTTP client and limiter; "+
		"429s and max sent / 1 s counted where the provider received them.\n\n")
	var rows [][]string
	only := os.Getenv(fleetProcsOnlyEnv)
	for _, f := range procFleets() {
		if (only == "" && !f.byDefault) || (only != "" && !slices.Contains(strings.Split(only, ","), f.id)) {
			continue
		}
		if f.pods == 0 {
			t.Fatal("a layout of procFleets has no fleet of fleetSizes")
		}
		for _, kind := range fleetSizeKinds() {
			var row []string
			if !t.Run(f.id+"/"+kind, func(t *testing.T) { row = runProcRow(t, f, kind) }) {
				t.FailNow()
			}
			if row != nil { // nil when left out by -run
				rows = append(rows, row)
			}
		}
	}
	fmt.Fprintf(&out, "%s\nLoad after the run: %s\n", benchkit.Markdown(fleetSizeHeader(), rows), benchkit.LoadAvg())
	t.Logf("\n%s", out.String())
	if path := os.Getenv(fleetProcsOutEnv); path != "" {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Errorf("%s: %v", fleetProcsOutEnv, err)
		}
	}
	benchkit.CheckGoroutines(t, goroutines, goroutineLeakGrace)
}

// runProcRow runs f's fleet with strategy kind against a Redis and a
// provider of its own, logs what the processes and the machine showed,
// and returns the row of the table.
func runProcRow(t *testing.T, f procFleet, kind string) []string {
	loadBefore := benchkit.LoadAvg()
	srv := redistest.Start(t)
	api, err := fakeapi.Start(f.provider())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(api.Close) // runs last
	var reqs requestLog
	front := httptest.NewServer(reqs.handler(api))
	t.Cleanup(front.Close)

	start := time.Unix(0, time.Now().Add(procLeadBase+time.Duration(f.procs)*procLeadEach).UnixNano())
	ctx, cancel := context.WithDeadline(t.Context(), start.Add(signalDuration+callTimeout+procGrace))
	defer cancel()
	base := procChildConfig{
		fleet: f, kind: kind, instances: f.pods / f.procs,
		redis: srv.Addr, url: front.URL, start: start, duration: signalDuration,
	}
	span := startCPUSpan()
	reps, cpu, err := runProcs(ctx, base, f.procs)
	busy := span.busy()
	if err != nil {
		t.Fatal(err)
	}
	front.Close() // the provider has answered its last request

	o, d := procOutcome(start, api, &reqs, reps)
	name := f.id + "/" + kind
	succ := signalMeasure{o: o}.successes()
	rt, rtPod := d.roundTrips(o.accepted, f.pods)
	logProcRow(t, name, f, o, d, reps)
	t.Logf("%s: %s; Redis CPU %s; the machine's CPUs busy %s from the first launch to the last exit; load before %s, after %s",
		name, procMachine(reps, cpu), redisCPU(t, srv), busy, loadBefore, benchkit.LoadAvg())
	if ready := slices.MinFunc(reps, func(a, b procReport) int { return cmp.Compare(a.Ready, b.Ready) }).Ready; ready < 0 {
		t.Errorf("a process was ready %s after the start: the fleet did not start together; raise procLeadBase", benchkit.Ms(-ready))
	}
	return f.row(kind, succ, o, rt, rtPod)
}

// runProcs runs base's fleet as procs processes of this test binary, each
// running procChildName with base and its index in its environment, and
// returns their reports and CPU times in index order. The end of ctx kills
// them, and so does this process's end: their stdin is a pipe whose other
// end only this process holds. Every process started has exited when it
// returns.
func runProcs(ctx context.Context, base procChildConfig, procs int) ([]procReport, []time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stdin, held, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	defer held.Close()
	defer stdin.Close()
	timeout := 2 * procGrace
	if deadline, ok := ctx.Deadline(); ok {
		timeout = time.Until(deadline) + procTimeoutMore // a backstop should the parent vanish
	}
	var (
		wg   sync.WaitGroup
		cmds = make([]*exec.Cmd, procs)
		outs = make([]bytes.Buffer, procs)
		errs = make([]error, procs)
	)
	for i := range procs {
		c := base
		c.index = i
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+procChildName+"$", "-test.count=1", "-test.timeout="+timeout.String())
		cmd.Env = append(os.Environ(), c.env()...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, &outs[i], &outs[i]
		cmd.WaitDelay = procWaitDelay
		if err := cmd.Start(); err != nil {
			errs[i] = err
			cancel() // the fleet is not whole: end the processes started
			break
		}
		cmds[i] = cmd
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = cmd.Wait()
		}()
		if benchkit.Sleep(ctx, procLaunchGap) != nil {
			break
		}
	}
	wg.Wait()
	for i, cmd := range cmds {
		if cmd == nil && errs[i] == nil {
			errs[i] = errors.New("not started: the run ended first")
		}
	}

	reps := make([]procReport, procs)
	cpu := make([]time.Duration, procs)
	for i, cmd := range cmds {
		if cmd != nil && cmd.ProcessState != nil {
			cpu[i] = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		}
		if errs[i] == nil {
			reps[i], errs[i] = procReportIn(outs[i].String())
		}
		if errs[i] != nil {
			out := outs[i].String()
			errs[i] = fmt.Errorf("process %d: %w; its output ends:\n%s", i, errs[i], out[max(0, len(out)-procOutputTail):])
		}
	}
	return reps, cpu, errors.Join(errs...)
}

// procReportIn is the report in a process's output.
func procReportIn(out string) (procReport, error) {
	for line := range strings.Lines(out) {
		if s, ok := strings.CutPrefix(line, procReportPrefix); ok {
			var rep procReport
			err := json.Unmarshal([]byte(s), &rep)
			return rep, err
		}
	}
	return procReport{}, errors.New("no report")
}
