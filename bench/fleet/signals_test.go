package fleet

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/egress-go/egress"
	"github.com/egress-go/egress/bench/internal/benchkit"
	"github.com/egress-go/egress/internal/fakeapi"
	"github.com/egress-go/egress/internal/naive"
)

// The signal scenarios: a provider that advertises its bucket in the IETF
// draft's RateLimit-Limit, -Remaining and -Reset (the seconds until the
// bucket is full again), or advertises nothing; in front of it a fleet
// configured at 100/s, burst 10.
const (
	signalDuration = 10 * time.Second      // workers start calls for this long
	signalLatency  = 2 * time.Millisecond  // the provider's delay on every answer
	signalRate     = 100                   // what the clients are configured with, per second
	signalBurst    = 10                    // and their burst
	signalWorkers  = 32                    // in all: 4 pods × 8, or 1 process × 32
	stormShare     = 0.3                   // of the requests within the limit, in scenario C
	stormWait      = 2 * time.Second       // the storm's Retry-After
	settle         = 3 * time.Second       // 429s after it count against egress
	stormSeed      = 7                     // seeds the provider's storm draws, unless signalsSeedEnv says
	fifoSlack      = 1.3                   // scenario A: p99 at most this × the FIFO ideal
	upTarget       = 0.9                   // scenario B': the raise is followed once 90% of the new rate is accepted in 1 s
	signalsEnv     = "EGRESS_SIGNALS"      // set to run TestSignalScenarios without naming it in -run
	signalsSeedEnv = "EGRESS_SIGNALS_SEED" // another seed for the provider's draws (which requests the storm refuses)
	signalsOutEnv  = "EGRESS_SIGNALS_OUT"  // a path to write the tables to, as markdown
	signalsOnlyEnv = "EGRESS_SIGNALS_ONLY" // scenario ids to run, comma-separated (C,F); every one when empty
	signalsBEnv    = "EGRESS_SIGNALS_B"    // scenario B's provider as "rate/burst", instead of 50/5
	signalsName    = "TestSignalScenarios" // the test's name, for the -run gate
)

// The limit changes of scenario B': 100/s, then 40/s from 2 s to 6 s,
// then 100/s again.
var (
	dropAt, raiseAt = 2 * time.Second, 6 * time.Second
	lowRate         = 40.0
)

// signalScenario is one provider behaviour that every strategy meets.
type signalScenario struct {
	id, title  string
	rate       float64 // the provider's real rate at the start
	burst      int     // the provider's real burst
	steps      []rateStep
	storm      fakeapi.Storm
	columns    []string
	cells      func(m signalMeasure) []string
	intro      string
	providerOf func(headers bool) fakeapi.Config
	headerName string // what the headers column says when they are on; default "RateLimit-*"
	noRetry    bool   // rows of egress without retries too, beside the peer that retries nothing
}

// signalRow is one strategy in one scenario.
type signalRow struct {
	name     string
	strategy strategy
	load     load
	headers  bool   // the provider sends RateLimit-*
	reads    string // what the headers column says
}

var onePod = load{name: "1 × 32", pods: []podLoad{{workers: signalWorkers}}}

// signalMeasure is a row's outcome with what the tables derive from it.
type signalMeasure struct {
	row     signalRow
	sc      signalScenario
	o       outcome
	resends resends
}

// TestSignalScenarios runs the scenarios of "Signals, weighed" — the right
// limit (A), a limit configured at twice the real one (B), a limit that
// changes mid-run (B'), a storm of 429s that are not about the quota (C),
// a fixed window (D), a provider whose burst is one (E), and C and E whose
// 429s say nothing of how long to wait (F, G: see unsaid) — with each
// scenario's provider advertising its bucket and not, for egress's four
// limiters and the peers, and prints one table per scenario. It takes
// about seventeen minutes and runs only when asked: name it in -run, or
// set EGRESS_SIGNALS=1.
//
//	cd bench && go test -run TestSignalScenarios -v ./fleet/ -count=1
//
// EGRESS_SIGNALS_SEED=n draws another storm; EGRESS_SIGNALS_B=30/3 gives
// scenario B another provider (rate/burst), another ratio of the clients'
// 100/s to the real limit.
func TestSignalScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for minutes; skipped under -short")
	}
	if f := flag.Lookup("test.run"); (f == nil || !strings.Contains(f.Value.String(), signalsName)) && os.Getenv(signalsEnv) == "" {
		t.Skipf("runs for minutes; name it in -run or set %s=1", signalsEnv)
	}
	if _, _, err := scenarioB(); err != nil {
		t.Fatal(err)
	}
	goroutines := runtime.NumGoroutine()
	var out strings.Builder
	fmt.Fprintf(&out, "%s\n", benchkit.Machine())
	only := os.Getenv(signalsOnlyEnv)
	for _, sc := range signalScenarios() {
		if only != "" && !slices.Contains(strings.Split(only, ","), sc.id) {
			continue
		}
		table := signalTable(t, sc)
		fmt.Fprintf(&out, "\n### %s. %s\n\n%s\n\n%s", sc.id, sc.title, sc.intro, table)
	}
	fmt.Fprintf(&out, "\nLoad after the run: %s\n", benchkit.LoadAvg())
	t.Logf("\n%s", out.String())
	if path := os.Getenv(signalsOutEnv); path != "" {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Errorf("%s: %v", signalsOutEnv, err)
		}
	}
	benchkit.CheckGoroutines(t, goroutines, goroutineLeakGrace)
}

// signalRows are the rows of every scenario: egress's four limiters with
// the provider's headers on and off, then the peers, which read none of
// them and run once, with the headers on.
func signalRows(sc signalScenario) []signalRow {
	var rows []signalRow
	for _, headers := range []bool{true, false} {
		reads := "RateLimit-*"
		if !headers {
			reads = "none"
		}
		rows = append(rows,
			signalRow{name: "egress SharedTokenBucket", strategy: egressStrategy("egress SharedTokenBucket"), load: evenLoad, headers: headers, reads: reads},
			signalRow{name: "egress SharedLeakyBucket", strategy: sharedLeakyStrategy(), load: evenLoad, headers: headers, reads: reads},
			signalRow{name: "egress TokenBucket, 1 process", strategy: localTokenStrategy(), load: onePod, headers: headers, reads: reads},
			signalRow{name: "egress LeakyBucket, 1 process", strategy: localLeakyStrategy(), load: onePod, headers: headers, reads: reads},
		)
		if sc.noRetry {
			rows = append(rows, signalRow{name: "egress SharedTokenBucket, no retries", strategy: egressNoRetryStrategy(), load: evenLoad, headers: headers, reads: reads})
		}
	}
	return append(rows,
		signalRow{name: "x/time/rate per pod (R/4) + retry after Retry-After", strategy: splitRetryStrategy(), load: evenLoad, headers: true, reads: "on, not read"},
		signalRow{name: "redis_rate (fleet-wide, no retry)", strategy: redisRateStrategy(), load: evenLoad, headers: true, reads: "on, not read"},
		signalRow{name: "go-retryablehttp (defaults)", strategy: retryableStrategy(), load: evenLoad, headers: true, reads: "on, not read"},
	)
}

func signalTable(t *testing.T, sc signalScenario) string {
	var rows [][]string
	for _, r := range signalRows(sc) {
		log := &requestLog{}
		s := scenario{
			strategy: r.strategy, load: r.load, duration: signalDuration,
			provider:  sc.providerOf(r.headers),
			limits:    limits{rate: signalRate, burst: signalBurst, egressBurst: signalBurst, adaptive: true},
			rateSteps: sc.steps, requests: log,
		}
		if r.headers && r.reads == "RateLimit-*" && sc.headerName != "" {
			r.reads = sc.headerName
		}
		name := fmt.Sprintf("%s/%s/%s", sc.id, r.name, r.reads)
		o := runRow(t, name, s)
		if o.calls == 0 {
			continue // left out by -run
		}
		m := signalMeasure{row: r, sc: sc, o: o, resends: log.resends()}
		t.Logf("%s: successes in 10 s %d; 429s at %v; re-sends after a 429 %d, early %d, shortest gap %s",
			name, m.successes(), m.limitedOffsets(), m.resends.after429, m.resends.early, benchkit.Ms(m.resends.minGap))
		rows = append(rows, append([]string{r.name, fleetOf(r), r.reads}, sc.cells(m)...))
	}
	return benchkit.Markdown(append([]string{"strategy", "fleet", "headers"}, sc.columns...), rows)
}

func fleetOf(r signalRow) string {
	if len(r.load.pods) == 1 {
		return "1 × 32"
	}
	return "4 × 8"
}

func signalScenarios() []signalScenario {
	provider := func(r float64, b int, storm fakeapi.Storm) func(bool) fakeapi.Config {
		return func(headers bool) fakeapi.Config {
			c := fakeapi.Config{Rate: r, Burst: b, Latency: signalLatency, Storm: storm, Seed: signalsSeed()}
			if headers {
				c.Dialect = fakeapi.IETFDraft
			} else {
				c.Dialect, c.Advertise = fakeapi.IETF, false
			}
			return c
		}
	}
	window := func(headers bool) fakeapi.Config {
		c := fakeapi.Config{Limits: []fakeapi.Limit{fakeapi.Fixed(windowQuota, windowLength)}, Latency: signalLatency, Seed: signalsSeed()}
		if headers {
			c.Dialect = fakeapi.GitHub
		} else {
			c.Dialect, c.Advertise = fakeapi.IETF, false
		}
		return c
	}
	ideal := time.Duration(float64(signalWorkers) / signalRate * float64(time.Second))
	bRate, bBurst, _ := scenarioB()
	storm := fakeapi.Storm{Share: stormShare, RetryAfter: stormWait}
	scs := []signalScenario{
		{
			id: "A", title: "The right limit: 100/s, burst 10, at the provider and in the clients",
			rate: signalRate, burst: signalBurst, providerOf: provider(signalRate, signalBurst, fakeapi.Storm{}),
			intro: fmt.Sprintf("Targets for egress: at least 99%% of R, no 429, p99 at most %.1f × the FIFO ideal "+
				"W/R = %s (%d workers at %d/s).", fifoSlack, benchkit.Ms(ideal), signalWorkers, signalRate),
			columns: []string{"successes in 10 s", "% of R", "429s", "429s after 3 s", "p50", "p99",
				fmt.Sprintf("p99 / %s", benchkit.Ms(ideal)), "failed / calls"},
			cells: func(m signalMeasure) []string {
				return []string{benchkit.Count(m.successes()), benchkit.Percent(float64(m.successes()) / (signalRate * signalDuration.Seconds())),
					benchkit.Count(m.o.limited), benchkit.Count(m.limitedAfter(settle)), benchkit.Ms(m.o.p50), benchkit.Ms(m.o.p99),
					fmt.Sprintf("%.2f", m.o.p99.Seconds()/ideal.Seconds()), benchkit.Count(m.o.failed) + " / " + benchkit.Count(m.o.calls)}
			},
		},
		{
			id: "B", title: fmt.Sprintf("A limit configured at %.3g times the real one: the provider enforces %g/s, burst %d", signalRate/bRate, bRate, bBurst),
			rate: bRate, burst: bBurst, providerOf: provider(bRate, bBurst, fakeapi.Storm{}),
			intro: "Targets for egress: at least 90% of the real limit over the last 5 s; at most one 429 in any 5 s " +
				"for the whole fleet after the first 3 s; with and without the headers. " +
				"Accepted per second at the provider, second by second from the start.",
			columns: []string{fmt.Sprintf("%% of %g/s, last 5 s", bRate), fmt.Sprintf("%% of %g/s, 10 s", bRate), "429s", "429s after 3 s", "most 429s in 5 s after 3 s",
				"p50", "p99", "failed / calls", "accepted per second"},
			cells: func(m signalMeasure) []string {
				last := m.acceptedBetween(5*time.Second, 10*time.Second)
				all := m.acceptedBetween(0, 10*time.Second)
				return []string{benchkit.Percent(float64(last) / (bRate * 5)), benchkit.Percent(float64(all) / (bRate * 10)),
					benchkit.Count(m.o.limited), benchkit.Count(m.limitedAfter(settle)), benchkit.Count(m.most429sAfter(settle, 5*time.Second)),
					benchkit.Ms(m.o.p50), benchkit.Ms(m.o.p99), benchkit.Count(m.o.failed) + " / " + benchkit.Count(m.o.calls), m.perSecond()}
			},
		},
		{
			id: "B'", title: fmt.Sprintf("A limit that changes: 100/s, %g/s from %v to %v, then 100/s; provider burst 10", lowRate, dropAt, raiseAt),
			rate: signalRate, burst: signalBurst, providerOf: provider(signalRate, signalBurst, fakeapi.Storm{}),
			steps: []rateStep{{at: dropAt, rate: lowRate}, {at: raiseAt, rate: signalRate}},
			intro: fmt.Sprintf("Target for egress: each change followed within 3 s. Down: the 429s stop "+
				"(\"last 429 after the drop\"); the accepted rate over the last 2 s of the %g/s phase. Up: \"reaches %.0f/s\" is "+
				"the time from the raise to the end of the first 1 s window after it with %.0f%% of 100 accepted. "+
				"Clients configured at 100/s, burst 10.", lowRate, upTarget*signalRate, 100*upTarget),
			columns: []string{"429s", "429s in the 40/s phase", "last 429 after the drop", "% of 40/s, its last 2 s",
				"reaches 90/s after the raise", "% of the limit, 10 s", "p50", "p99", "accepted per second"},
			cells: func(m signalMeasure) []string {
				low := m.acceptedBetween(raiseAt-2*time.Second, raiseAt)
				limit := signalRate*dropAt.Seconds() + lowRate*(raiseAt-dropAt).Seconds() + signalRate*(signalDuration-raiseAt).Seconds()
				return []string{benchkit.Count(m.o.limited), benchkit.Count(m.limitedBetween(dropAt, raiseAt)), m.lastLimitedAfter(dropAt, raiseAt),
					benchkit.Percent(float64(low) / (lowRate * 2)), m.reaches(raiseAt, upTarget*signalRate),
					benchkit.Percent(float64(m.acceptedBetween(0, signalDuration)) / limit), benchkit.Ms(m.o.p50), benchkit.Ms(m.o.p99), m.perSecond()}
			},
		},
		{
			id: "C", title: "A storm: 30% of the requests within the limit answered 429 with Retry-After: 2; 100/s, burst 10",
			rate: signalRate, burst: signalBurst, steps: nil, storm: storm, providerOf: provider(signalRate, signalBurst, storm), noRetry: true,
			intro: fmt.Sprintf("The storm spends nothing from the limit; its 429s carry the headers of the limit's real state "+
				"(remaining > 0) when the provider sends them. Targets for egress: with the headers, successes at least 80%% "+
				"of the untouched share (0.7 × R × 10 s = %d) and no request sent again before its own Retry-After; without "+
				"them, at least as many successes as the best peer. Re-sends are measured at the provider, per request "+
				"identity (%s, the same on every attempt): the time from a 429's answer to the same request's next arrival. "+
				"redis_rate retries nothing: its 429s go back to the caller, and each of its 32 callers moves on at once, "+
				"where a client that retries waits out the Retry-After; egress without retries is shown beside it.",
				int((1-stormShare)*signalRate*signalDuration.Seconds()), requestIDHeader),
			columns: []string{"successes in 10 s", "% of 0.7·R", "429s: storm / limit", "re-sent after a 429",
				"re-sent before its Retry-After", "shortest gap", "p50", "p99", "failed / calls", "failed with room for the wait asked"},
			cells: func(m signalMeasure) []string {
				untouched := (1 - stormShare) * signalRate * signalDuration.Seconds()
				return []string{benchkit.Count(m.successes()), benchkit.Percent(float64(m.successes()) / untouched),
					benchkit.Count(m.o.storms) + " / " + benchkit.Count(m.o.refused), benchkit.Count(m.resends.after429), benchkit.Count(m.resends.early),
					benchkit.Ms(m.resends.minGap), benchkit.Ms(m.o.p50), benchkit.Ms(m.o.p99), benchkit.Count(m.o.failed) + " / " + benchkit.Count(m.o.calls),
					benchkit.Count(m.o.roomy)}
			},
		},
		{
			id: "D", title: fmt.Sprintf("A fixed window: the provider accepts %d per %v window (%g/s on average)", windowQuota, windowLength, windowQuota/windowLength.Seconds()),
			rate: windowQuota / windowLength.Seconds(), burst: windowQuota, providerOf: window, headerName: "x-ratelimit-* (GitHub)",
			intro: fmt.Sprintf("The provider counts requests in fixed %v windows aligned on the clock (as GitHub's hour is) and "+
				"refuses the rest of a window, with a 429 whose Retry-After is the time to the window's end. With the headers "+
				"it speaks GitHub's dialect on every response (x-ratelimit-limit, -remaining, -used, -reset in epoch seconds, "+
				"and a 403 with remaining 0 as its refusal); without them it sends only the 429's Retry-After. Clients "+
				"configured at 100/s, burst 10: a window's quota is spent in about %.1f s. The measures are the quota used in "+
				"the windows wholly inside the run, and the refusals (429 or 403) after the first of those began: those at a "+
				"window's end are the requests in flight when \"remaining 0\" comes back.", windowLength, windowQuota/float64(signalRate)),
			columns: []string{"% of the quota, whole windows", "refusals", "refusals after the first whole window began", "p50", "p99", "failed / calls", "accepted per second"},
			cells: func(m signalMeasure) []string {
				from, n := m.wholeWindows(windowLength)
				used := m.acceptedBetween(from, from+time.Duration(n)*windowLength)
				return []string{benchkit.Percent(float64(used) / float64(n*windowQuota)), benchkit.Count(m.o.limited),
					benchkit.Count(m.limitedBetween(from, signalDuration)), benchkit.Ms(m.o.p50), benchkit.Ms(m.o.p99),
					benchkit.Count(m.o.failed) + " / " + benchkit.Count(m.o.calls), m.perSecond()}
			},
		},
		{
			id: "E", title: fmt.Sprintf("A burst of one: the provider enforces %g/s with a burst of 1", oneRate),
			rate: oneRate, burst: 1, providerOf: provider(oneRate, 1, fakeapi.Storm{}),
			intro: fmt.Sprintf("Clients configured at 100/s, burst 10. The provider spaces its requests: sent faster than "+
				"%g/s, the second request after a wait is refused, whatever the wait was. A refusal among the first "+
				"requests after a hold is then no sign that the provider throttles for another reason than its limit "+
				"(a storm). No target was set; the measures are B's.", oneRate),
			columns: []string{fmt.Sprintf("%% of %g/s, last 5 s", oneRate), fmt.Sprintf("%% of %g/s, 10 s", oneRate), "429s",
				"429s after 3 s", "most 429s in 5 s after 3 s", "p50", "p99", "failed / calls", "accepted per second"},
			cells: func(m signalMeasure) []string {
				last := m.acceptedBetween(5*time.Second, 10*time.Second)
				all := m.acceptedBetween(0, 10*time.Second)
				return []string{benchkit.Percent(float64(last) / (oneRate * 5)), benchkit.Percent(float64(all) / (oneRate * 10)),
					benchkit.Count(m.o.limited), benchkit.Count(m.limitedAfter(settle)), benchkit.Count(m.most429sAfter(settle, 5*time.Second)),
					benchkit.Ms(m.o.p50), benchkit.Ms(m.o.p99), benchkit.Count(m.o.failed) + " / " + benchkit.Count(m.o.calls), m.perSecond()}
			},
		},
	}
	return append(scs, unsaid(scs[3], scs[5], provider)...)
}

// unsaid returns the scenarios whose throttles say nothing of how long to
// wait: F, C's storm answered with a bare 429 (no Retry-After); G, E's
// limit behind nginx's limit_req without a burst, whose refusals carry
// no Retry-After either (with the headers on, the provider's RateLimit-*
// still say it). Without the headers nothing tells them apart: a client
// that holds its fleet, or lowers its rate, at every such 429 sends a
// fraction of what one that backs off each refused request sends (F),
// and one that takes them for a storm hammers the provider (G).
func unsaid(c, e signalScenario, provider func(float64, int, fakeapi.Storm) func(bool) fakeapi.Config) []signalScenario {
	quiet := func(of func(bool) fakeapi.Config) func(bool) fakeapi.Config {
		return func(headers bool) fakeapi.Config {
			cfg := of(headers)
			cfg.NoRetryAfter = true
			return cfg
		}
	}
	f, g := c, e
	f.id, f.storm = "F", fakeapi.Storm{Share: stormShare}
	f.title = "C's storm without Retry-After: 30% of the requests within the limit answered a bare 429; 100/s, burst 10"
	f.providerOf = quiet(provider(signalRate, signalBurst, f.storm))
	f.intro = "As C, but the storm's 429s carry no Retry-After (a load balancer shedding load, a lock timeout). " +
		"No target was set; C's measures, beside the peers."
	g.id = "G"
	g.title = fmt.Sprintf("E's provider behind nginx's limit_req: it enforces %g/s with no burst, and its refusals carry no Retry-After", oneRate)
	g.providerOf = quiet(provider(oneRate, 1, fakeapi.Storm{}))
	g.intro = "Clients configured at 100/s, burst 10, as in E. Without the headers the provider's 429s say nothing at all. " +
		"No target was set; E's measures."
	return []signalScenario{f, g}
}

// Scenario E: a provider whose burst is one.
const oneRate = 62.0

// Scenario D: a fixed window of windowQuota requests per windowLength,
// aligned on the clock.
const (
	windowQuota  = 120
	windowLength = 2 * time.Second
)

// wholeWindows returns when, from the start, the first window of length w
// aligned on the clock begins, and how many such windows lie wholly within
// the run's 10 s.
func (m signalMeasure) wholeWindows(w time.Duration) (from time.Duration, n int) {
	first := m.o.start.Truncate(w)
	if first.Before(m.o.start) {
		first = first.Add(w)
	}
	from = first.Sub(m.o.start)
	return from, int((signalDuration - from) / w)
}

// successes is the number of calls that succeeded within the run's 10 s.
func (m signalMeasure) successes() int {
	return countBetween(m.o.succeeded, m.o.start, 0, signalDuration)
}

// acceptedBetween is the number of requests the provider accepted in
// [from, to) from the start.
func (m signalMeasure) acceptedBetween(from, to time.Duration) int {
	return countBetween(m.o.acceptedAt, m.o.start, from, to)
}

func (m signalMeasure) limitedBetween(from, to time.Duration) int {
	return countBetween(m.o.limitedAt, m.o.start, from, to)
}

func (m signalMeasure) limitedAfter(from time.Duration) int {
	return countBetween(m.o.limitedAt, m.o.start, from, 1<<62)
}

// most429sAfter is the most 429s in any window w that starts after from.
func (m signalMeasure) most429sAfter(from, w time.Duration) int {
	var after []time.Time
	for _, at := range m.o.limitedAt {
		if at.Sub(m.o.start) >= from {
			after = append(after, at)
		}
	}
	return fakeapi.MaxInWindow(after, w)
}

// lastLimitedAfter is the time from `from` to the last 429 before `to`.
func (m signalMeasure) lastLimitedAfter(from, to time.Duration) string {
	last := time.Duration(-1)
	for _, at := range m.o.limitedAt {
		if d := at.Sub(m.o.start); d >= from && d < to && d > last {
			last = d
		}
	}
	if last < 0 {
		return "no 429"
	}
	return benchkit.Secs(last - from)
}

// reaches is the time from `from` until the end of the first window of 1 s,
// starting at or after from, in which the provider accepted at least n.
func (m signalMeasure) reaches(from time.Duration, n float64) string {
	var at []time.Duration
	for _, a := range m.o.acceptedAt {
		if d := a.Sub(m.o.start); d >= from {
			at = append(at, d)
		}
	}
	lo := 0
	for hi := range at {
		for at[hi]-at[lo] >= time.Second {
			lo++
		}
		if float64(hi-lo+1) >= n {
			return benchkit.Secs(max(at[hi]-from, time.Second))
		}
	}
	return "not by " + benchkit.Secs(signalDuration)
}

// perSecond is the accepted per second for the run's 10 s.
func (m signalMeasure) perSecond() string {
	ps := m.o.acceptedPerSec
	if len(ps) > int(signalDuration/time.Second) {
		ps = ps[:int(signalDuration/time.Second)]
	}
	s := make([]string, len(ps))
	for i, n := range ps {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, " ")
}

// limitedOffsets is when each 429 came back, from the start, for the log.
func (m signalMeasure) limitedOffsets() []string {
	var s []string
	for _, at := range m.o.limitedAt {
		s = append(s, fmt.Sprintf("%.2fs", at.Sub(m.o.start).Seconds()))
	}
	return s
}

// countBetween counts the times in [start+from, start+to).
func countBetween(times []time.Time, start time.Time, from, to time.Duration) int {
	n := 0
	for _, at := range times {
		if d := at.Sub(start); d >= from && d < to {
			n++
		}
	}
	return n
}

// The strategies of the signal scenarios that the fleet table does not use.

// sharedLeakyStrategy is egress with a SharedLeakyBucket of the fleet's
// rate, a queue as deep as the fleet's workers, and the default retries.
func sharedLeakyStrategy() strategy {
	return strategy{name: "egress SharedLeakyBucket", redis: true, newPod: func(env podEnv) (pod, error) {
		lim, err := egress.NewSharedLeakyBucket(env.rdb, sharedName, egress.PerSecond(env.limits.rate), signalWorkers, sharedOptions(env)...)
		if err != nil {
			return pod{}, err
		}
		return egressPod(env, lim, lim.Close)
	}}
}

// localTokenStrategy is egress with a local TokenBucket at the fleet's
// rate and burst: for a fleet of one process.
func localTokenStrategy() strategy {
	return strategy{name: "egress TokenBucket", newPod: func(env podEnv) (pod, error) {
		lim, err := egress.NewTokenBucket(egress.PerSecond(env.limits.rate), env.limits.burst, localOptions(env)...)
		if err != nil {
			return pod{}, err
		}
		return egressPod(env, lim, nil)
	}}
}

// localLeakyStrategy is egress with a local LeakyBucket at the fleet's
// rate, a queue as deep as the workers: for a fleet of one process.
func localLeakyStrategy() strategy {
	return strategy{name: "egress LeakyBucket", newPod: func(env podEnv) (pod, error) {
		lim, err := egress.NewLeakyBucket(egress.PerSecond(env.limits.rate), signalWorkers, localOptions(env)...)
		if err != nil {
			return pod{}, err
		}
		return egressPod(env, lim, nil)
	}}
}

func localOptions(env podEnv) []egress.LimiterOption {
	if env.limits.adaptive {
		return nil
	}
	return []egress.LimiterOption{egress.WithoutDiscovery()}
}

// splitRetryStrategy is an x/time/rate limiter per pod at the fleet's rate
// and burst divided by the number of pods, and a 429 sent again after its
// Retry-After (through the limiter again), up to four attempts in all.
func splitRetryStrategy() strategy {
	return strategy{name: "x/time/rate per pod (R/4) + retry after Retry-After", newPod: func(env podEnv) (pod, error) {
		r := env.limits.rate / float64(env.pods)
		lim := rate.NewLimiter(rate.Limit(r), max(1, env.limits.burst/env.pods))
		c := &http.Client{Transport: retryAfterRetry{base: env.base, lim: lim, attempts: 4}}
		return pod{do: c.Do}, nil
	}}
}

// retryAfterRetry waits for its limiter before each attempt and, on a 429,
// sleeps the response's Retry-After (whole seconds; 1 s when absent) and
// sends again, up to attempts in all. A 429 whose wait would outlast the
// request's deadline is returned as it is.
type retryAfterRetry struct {
	base     http.RoundTripper
	lim      *rate.Limiter
	attempts int
}

func (rr retryAfterRetry) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	for attempt := 1; ; attempt++ {
		r := req
		if attempt > 1 {
			var err error
			if r, err = naive.Resend(req); err != nil {
				return nil, err
			}
		}
		if err := rr.lim.Wait(ctx); err != nil {
			return nil, errors.Join(err, closeBody(r))
		}
		resp, err := rr.base.RoundTrip(r)
		if err != nil || resp.StatusCode != http.StatusTooManyRequests || attempt == rr.attempts {
			return resp, err
		}
		wait := time.Second
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
			wait = time.Duration(s) * time.Second
		}
		if dl, ok := ctx.Deadline(); ok && time.Now().Add(wait).After(dl) {
			return resp, nil
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err := benchkit.Sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// closeBody closes the body of a request that is not sent.
func closeBody(r *http.Request) error {
	if r.Body == nil {
		return nil
	}
	return r.Body.Close()
}

// scenarioB returns scenario B's provider: 50/s with a burst of 5, or the
// rate and burst signalsBEnv gives ("30/3": another ratio of the clients'
// 100/s to the real limit).
func scenarioB() (float64, int, error) {
	v := os.Getenv(signalsBEnv)
	if v == "" {
		return 50, 5, nil
	}
	r, b, ok := strings.Cut(v, "/")
	rate, err1 := strconv.ParseFloat(r, 64)
	burst, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || !(rate > 0 && rate <= signalRate) || burst < 1 {
		return 0, 0, fmt.Errorf("%s=%q: want \"rate/burst\", a rate in (0, %d] and a burst of 1 or more", signalsBEnv, v, signalRate)
	}
	return rate, burst, nil
}

// signalsSeed is the seed of the providers' draws: stormSeed, or the one
// signalsSeedEnv gives. (With one seed, the storm refuses the same
// requests of every row that sends the same ones: a row's figure in C is
// partly that draw's luck; other seeds show how much.)
func signalsSeed() uint64 {
	if v := os.Getenv(signalsSeedEnv); v != "" {
		if n, err := strconv.ParseUint(v, 10, 64); err == nil {
			return n
		}
	}
	return stormSeed
}
