package fleet

import (
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/egress-go/egress"
	"github.com/egress-go/egress/bench/internal/benchkit"
	"github.com/egress-go/egress/internal/fakeapi"
	"github.com/egress-go/egress/internal/redistest"
)

// What TestFleetProcesses makes of its processes' reports: the fleet's
// outcome, and the logs of what the processes and the machine showed.

// logProcRow logs what the provider received, the Redis commands, the
// rate changes, the 429s, the switches to the fallback and the failed
// calls of f's fleet, as TestFleetSize logs them.
func logProcRow(t *testing.T, name string, f procFleet, o outcome, d *fleetDiag, reps []procReport) {
	cmds, changes, ls := d.summary()
	t.Logf("%s: received per second %v (max %d, R+B %d); sent per second by the instances %v (max %d); Redis commands %d: %s",
		name, o.sentPerSec, o.maxSentPerSec, int(f.rate)+f.burst, procSentPerSec(o.start, reps), procMaxSent(o.start, reps), d.total.Load(), cmds)
	t.Logf("%s: calls %d, failed %d, reservations %d, admitted %d, received %d, instances in fallback at the end %d; rate changes %d: %v",
		name, o.calls, o.failed, ls.RoundTrips, ls.Admitted, o.upstream, ls.LiveInstances, len(changes), head(changes, 20))
	t.Logf("%s: 429s at %v", name, signalMeasure{o: o}.limitedOffsets())
	if got := procLimited(reps); got != o.limited {
		t.Logf("note: the provider answered %d 429s, the instances received %d", o.limited, got)
	}
	d.mu.Lock()
	t.Logf("%s: switches to the fallback %d, by process %v: %v", name, len(d.falls), procFallbacks(reps), head(d.falls, 20))
	d.mu.Unlock()
	if o.failed > 0 {
		t.Logf("%s: failed calls by cause: %v", name, procFailures(reps))
	}
}

// procMachine is what the processes showed of themselves: how early the
// last was ready and how late the last woke for the start, the switches
// to the fallback and the Redis round trips before their load started,
// their CPU times cpu, collections and memory.
func procMachine(reps []procReport, cpu []time.Duration) string {
	var (
		ready = reps[0].Ready
		woke  time.Duration
		gcs   uint32
		rss   int
		early int64
		trips int64
		setup int64
		all   time.Duration
	)
	for _, r := range reps {
		ready = min(ready, r.Ready)
		woke = max(woke, r.Woke)
		gcs += r.GCs
		rss = max(rss, r.PeakRSSKiB)
		early += r.Early
		trips += r.EarlyTotal
		setup += r.EarlySetup
	}
	for _, c := range cpu {
		all += c
	}
	return fmt.Sprintf("%d processes, GOMAXPROCS %d each, the last ready %s before the start and awake %s after it; "+
		"before their load, switches to the fallback %d and Redis round trips %d (connection set-up %d); "+
		"their CPU %s in all (most %s), GCs %d, peak RSS up to %d MiB",
		len(reps), reps[0].GOMAXPROCS, benchkit.Ms(ready), benchkit.Ms(woke), early, trips, setup,
		benchkit.Secs(all), benchkit.Ms(slices.Max(cpu)), gcs, rss/1024)
}

// procOutcome is the fleet's outcome: 429s and what was received per
// second as the provider counted them, the calls and their latencies from
// the processes' reports; and the processes' diagnostics merged into one
// fleetDiag.
func procOutcome(start time.Time, api *fakeapi.API, reqs *requestLog, reps []procReport) (outcome, *fleetDiag) {
	st := api.Stats(start)
	received, refused := reqs.times()
	o := outcome{
		start: start, elapsed: time.Since(start),
		accepted: st.Accepted, upstream: st.Requests, maxPerSecond: st.MaxPerSecond,
		acceptedPerSec: st.PerSecond, acceptedAt: st.Arrivals, refused: st.Refused, storms: st.Storms,
		limited: len(refused), limitedAt: refused,
		limitedPerSec: fakeapi.PerWindow(refused, start, time.Second), maxLimitedPerSec: fakeapi.MaxInWindow(refused, time.Second),
		sentAt: received, sentPerSec: fakeapi.PerWindow(received, start, time.Second), maxSentPerSec: fakeapi.MaxInWindow(received, time.Second),
	}
	d := &fleetDiag{commands: map[string]int{}, start: start}
	var latencies []time.Duration
	for _, r := range reps {
		o.calls += r.Calls
		o.failed += r.Calls - len(r.Latencies)
		o.fallback += r.Fallbacks
		latencies = append(latencies, r.Latencies...)
		for _, at := range r.Succeeded {
			o.succeeded = append(o.succeeded, start.Add(at))
		}
		for n, c := range r.Commands {
			d.commands[n] += c
		}
		d.total.Add(r.Total)
		d.own.Add(r.Own)
		for _, c := range r.Changes {
			d.changes = append(d.changes, fmt.Sprintf("p%d %s", r.Index, c))
		}
		for _, c := range r.Falls {
			d.falls = append(d.falls, fmt.Sprintf("p%d %s", r.Index, c))
		}
		for _, s := range r.Stats {
			d.stats = append(d.stats, func() egress.SharedStats { return s })
		}
	}
	slices.Sort(latencies)
	o.p50, o.p99 = benchkit.Quantile(latencies, 0.50), benchkit.Quantile(latencies, 0.99)
	return o, d
}

// times returns when each request arrived at the provider and when each
// refusal (429, or 403) was answered, sorted.
func (l *requestLog) times() (arrived, refused []time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, exs := range l.byID {
		for _, ex := range exs {
			arrived = append(arrived, ex.arrived)
			if ex.status == http.StatusTooManyRequests || ex.status == http.StatusForbidden {
				refused = append(refused, ex.answered)
			}
		}
	}
	slices.SortFunc(arrived, time.Time.Compare)
	slices.SortFunc(refused, time.Time.Compare)
	return arrived, refused
}

// procSent is when each attempt left an instance, over every process.
func procSent(start time.Time, reps []procReport) []time.Time {
	var sent []time.Time
	for _, r := range reps {
		for _, at := range r.Sent {
			sent = append(sent, start.Add(at))
		}
	}
	return sent
}

// procSentPerSec is what the instances sent in each second from start.
func procSentPerSec(start time.Time, reps []procReport) []int {
	return fakeapi.PerWindow(procSent(start, reps), start, time.Second)
}

// procMaxSent is the most the instances sent in any second.
func procMaxSent(start time.Time, reps []procReport) int {
	return fakeapi.MaxInWindow(procSent(start, reps), time.Second)
}

// procFallbacks is the switches to the fallback of each process that had
// any, as "p3 12".
func procFallbacks(reps []procReport) []string {
	var s []string
	for _, r := range reps {
		if r.Fallbacks > 0 {
			s = append(s, fmt.Sprintf("p%d %d", r.Index, r.Fallbacks))
		}
	}
	return s
}

// procFailures is the failed calls of every process by cause.
func procFailures(reps []procReport) map[string]int {
	n := map[string]int{}
	for _, r := range reps {
		for c, k := range r.Failures {
			n[c] += k
		}
	}
	return n
}

// procLimited is the 429s (and 403s) the instances received.
func procLimited(reps []procReport) int {
	n := 0
	for _, r := range reps {
		n += r.Limited
	}
	return n
}

// cpuSpan is the machine's CPU time at its start.
type cpuSpan struct {
	busyAt, totalAt uint64
	ok              bool
}

func startCPUSpan() cpuSpan {
	busy, total, ok := hostCPU()
	return cpuSpan{busy, total, ok}
}

// busy is the share of the machine's CPU time spent busy since the span's
// start, or "n/a".
func (c cpuSpan) busy() string {
	busy, total, ok := hostCPU()
	if !c.ok || !ok || total <= c.totalAt {
		return "n/a"
	}
	return benchkit.Percent(float64(busy-c.busyAt) / float64(total-c.totalAt))
}

// hostCPU is the machine's busy and total CPU time so far, in clock
// ticks, from /proc/stat; ok is false where that is not to be had.
func hostCPU() (busy, total uint64, ok bool) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, false
	}
	var v [8]uint64 // user nice system idle iowait irq softirq steal
	for i := range v {
		if v[i], err = strconv.ParseUint(f[i+1], 10, 64); err != nil {
			return 0, 0, false
		}
		total += v[i]
	}
	return total - v[3] - v[4], total, true
}

// redisCPU is the CPU time srv has used, user and system, from INFO cpu;
// "n/a" when it does not say.
func redisCPU(t *testing.T, srv *redistest.Server) string {
	info, err := srv.Client(t).Info(t.Context(), "cpu").Result()
	if err != nil {
		return "n/a"
	}
	var sum float64
	found := 0
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			if x, err := strconv.ParseFloat(v, 64); err == nil {
				sum += x
				found++
			}
		}
	}
	if found != 2 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f s", sum)
}
