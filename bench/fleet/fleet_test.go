package fleet

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/egress-go/egress/bench/internal/benchkit"
	"github.com/egress-go/egress/internal/fakeapi"
)

// The provider of every scenario: 50 requests per second over all its
// callers, bursts of 10, and it does not advertise its limit unless a
// scenario says so.
const providerRate, providerBurst = 50, 10

const (
	fleetDuration      = 8 * time.Second  // of each scenario of the fleet table
	misconfigDuration  = 10 * time.Second // of each scenario of the misconfigured table
	misconfiguredRate  = 100              // what the clients believe the limit is
	egressBurst        = 5                // the burst given to egress's shared bucket
	goroutineLeakGrace = 5 * time.Second  // for goroutines to end after the last scenario
)

// fleetStrategies are the rows of the fleet table, in order.
func fleetStrategies() []strategy {
	return []strategy{
		plainStrategy(),
		naiveStrategy(),
		retryableStrategy(),
		splitStrategy(),
		redisRateStrategy(),
		egressStrategy("egress (shared bucket + WithRetry)"),
	}
}

// misconfigured is a row of the misconfigured table: a strategy with the
// egress options and provider behaviour it runs with.
type misconfigured struct {
	strategy  strategy
	adaptive  bool
	advertise bool
}

func misconfiguredRows() []misconfigured {
	return []misconfigured{
		{strategy: egressStrategy("egress: adaptive off, advertise off")},
		{strategy: egressStrategy("egress: adaptive on, advertise off"), adaptive: true},
		{strategy: egressStrategy("egress: adaptive off, advertise on"), advertise: true},
		{strategy: retryableStrategy()},
		{strategy: splitStrategy()},
		{strategy: redisRateStrategy()},
	}
}

// TestFleetScenarios runs each client strategy once per scenario against
// the fake provider, as a fleet of four pods, and reports what the provider
// saw. Two tables: the fleet with the right limit configured, under an even
// and an uneven load; and the fleet configured at twice the provider's real
// limit. It takes about three minutes.
func TestFleetScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for minutes; skipped under -short")
	}
	goroutines := runtime.NumGoroutine()
	var out strings.Builder
	fmt.Fprintf(&out, "## Fleet scenarios\n\n%s\n", benchkit.Machine())

	fleet := fleetTable(t)
	fmt.Fprintf(&out, "\n### The right limit configured\n\n%s\n%s\n", fleetIntro(), fleet)
	misconf := misconfiguredTable(t)
	fmt.Fprintf(&out, "\n### A limit configured at twice the real one\n\n%s\n%s\n", misconfiguredIntro(), misconf)
	fmt.Fprintf(&out, "\nLoad after the run: %s\n", benchkit.LoadAvg())

	t.Logf("\n%s", out.String())
	if path := os.Getenv("EGRESS_FLEET_OUT"); path != "" {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Errorf("EGRESS_FLEET_OUT: %v", err)
		}
	}
	benchkit.CheckGoroutines(t, goroutines, goroutineLeakGrace)
}

func fleetIntro() string {
	return fmt.Sprintf("Provider: %d/s, burst %d, no rate-limit headers but Retry-After on a 429. "+
		"4 pods, each its own client and limiter; even: 8 workers per pod; uneven: one pod with 16 workers, "+
		"three with 1 worker calling every 500 ms. Each call has a %v deadline; workers start calls for %v. "+
		"Clients configured with the right limit (%d/s, burst %d; egress's shared bucket burst %d). "+
		"Utilisation = accepted / (%d/s × run), the run lasting until the last call returned; "+
		"the best possible is (%d × run + %d) / (%d × run).",
		providerRate, providerBurst, callTimeout, fleetDuration, providerRate, providerBurst, egressBurst,
		providerRate, providerRate, providerBurst, providerRate)
}

func misconfiguredIntro() string {
	return fmt.Sprintf("Provider: %d/s, burst %d. Clients configured at %d/s (egress: shared bucket %d/s burst %d; "+
		"x/time/rate: %d/4 per pod, burst %d; redis_rate: %d/s burst %d). 4 pods × 8 workers for %v. "+
		"Utilisation of the real limit = accepted / (%d/s × run).",
		providerRate, providerBurst, misconfiguredRate, misconfiguredRate, egressBurst,
		misconfiguredRate, max(1, providerBurst/4), misconfiguredRate, providerBurst, misconfigDuration, providerRate)
}

func fleetTable(t *testing.T) string {
	header := []string{"load", "strategy", "calls", "failed", "accepted", "429s", "upstream",
		fmt.Sprintf("max accepted / 1 s (limit %d+%d)", providerRate, providerBurst), "p50", "p99", "run", "utilisation"}
	var rows [][]string
	for _, l := range []load{evenLoad, unevenLoad} {
		for _, st := range fleetStrategies() {
			sc := scenario{
				strategy: st, load: l, duration: fleetDuration,
				provider: fakeapi.Config{Rate: providerRate, Burst: providerBurst},
				limits:   limits{rate: providerRate, burst: providerBurst, egressBurst: egressBurst},
			}
			o := runRow(t, l.name+"/"+st.name, sc)
			rows = append(rows, []string{
				l.name, st.name, benchkit.Count(o.calls), benchkit.Count(o.failed), benchkit.Count(o.accepted), benchkit.Count(o.limited), benchkit.Count(o.upstream),
				benchkit.Count(o.maxPerSecond), benchkit.Ms(o.p50), benchkit.Ms(o.p99), benchkit.Secs(o.elapsed), benchkit.Percent(o.utilisation(providerRate)),
			})
		}
	}
	return benchkit.Markdown(header, rows)
}

func misconfiguredTable(t *testing.T) string {
	header := []string{"strategy", "429s", "429s in the busiest 1 s", "accepted",
		fmt.Sprintf("utilisation of %d/s", providerRate), "failed / calls", "upstream",
		"max accepted / 1 s", "egress rate at the end", "run"}
	var rows [][]string
	for _, m := range misconfiguredRows() {
		sc := scenario{
			strategy: m.strategy, load: evenLoad, duration: misconfigDuration,
			provider: fakeapi.Config{Rate: providerRate, Burst: providerBurst, Advertise: m.advertise},
			limits:   limits{rate: misconfiguredRate, burst: providerBurst, egressBurst: egressBurst, adaptive: m.adaptive},
		}
		o := runRow(t, "misconfigured/"+m.strategy.name, sc)
		endRate := "–"
		if o.endRate > 0 {
			endRate = fmt.Sprintf("%.1f/s", o.endRate)
		}
		rows = append(rows, []string{
			m.strategy.name, benchkit.Count(o.limited), benchkit.Count(o.maxLimitedPerSec), benchkit.Count(o.accepted),
			benchkit.Percent(o.utilisation(providerRate)), benchkit.Count(o.failed) + " / " + benchkit.Count(o.calls), benchkit.Count(o.upstream),
			benchkit.Count(o.maxPerSecond), endRate, benchkit.Secs(o.elapsed),
		})
	}
	return benchkit.Markdown(header, rows)
}

// runRow runs sc in a subtest, so that its provider, Redis and pods are
// closed before the next one starts, and logs what it measured.
func runRow(t *testing.T, name string, sc scenario) outcome {
	var o outcome
	ok := t.Run(name, func(t *testing.T) {
		load := benchkit.LoadAvg()
		o = run(t, sc)
		t.Logf("calls %d, failed %d, accepted %d, 429s %d (busiest 1 s: %d), upstream %d, max accepted/1 s %d, "+
			"p50 %s, p99 %s, run %s, utilisation %s; load before %s",
			o.calls, o.failed, o.accepted, o.limited, o.maxLimitedPerSec, o.upstream, o.maxPerSecond,
			benchkit.Ms(o.p50), benchkit.Ms(o.p99), benchkit.Secs(o.elapsed), benchkit.Percent(o.utilisation(providerRate)), load)
		t.Logf("accepted per second: %v; 429s per second: %v", o.acceptedPerSec, o.limitedPerSec)
		if o.fallback > 0 {
			t.Logf("egress switched to its local fallback %d times: Redis was slow or unreachable", o.fallback)
		}
	})
	if !ok {
		t.FailNow()
	}
	return o
}
