package fleet

import (
	"fmt"

	"github.com/egress-go/egress"
	"github.com/egress-go/egress/bench/internal/benchkit"
	"github.com/egress-go/egress/internal/fakeapi"
)

// What a fleet-size row is made of, shared by TestFleetSize (instances in
// one process) and TestFleetProcesses (instances in separate processes).

// fleetSizeKinds are the strategies of each fleet, in the table's order.
func fleetSizeKinds() []string {
	return []string{"egress SharedTokenBucket", "egress SharedLeakyBucket", "redis_rate"}
}

// fleetSizeStrategy is the strategy of kind for fleet f, its Redis commands
// counted by d: egress's shared token bucket, its shared leaky bucket (a
// queue as deep as the fleet's workers), or redis_rate.
func fleetSizeStrategy(kind string, f fleetSize, d *fleetDiag) strategy {
	switch kind {
	case "egress SharedTokenBucket":
		return sharedSizeStrategy(kind, d, func(env podEnv) (sharedSizeLimiter, error) {
			return egress.NewSharedTokenBucket(env.rdb, sharedName, egress.PerSecond(env.limits.rate), env.limits.egressBurst, d.options(env)...)
		})
	case "egress SharedLeakyBucket":
		depth := f.pods * f.workers
		return sharedSizeStrategy(kind, d, func(env podEnv) (sharedSizeLimiter, error) {
			return egress.NewSharedLeakyBucket(env.rdb, sharedName, egress.PerSecond(env.limits.rate), depth, d.options(env)...)
		})
	default:
		return redisRateSizeStrategy(d)
	}
}

// provider is f's provider: rate R, burst B, RateLimit-* on every answer,
// 2 ms of latency.
func (f fleetSize) provider() fakeapi.Config {
	return fakeapi.Config{Rate: f.rate, Burst: f.burst, Latency: signalLatency, Dialect: fakeapi.IETFDraft, Seed: signalsSeed()}
}

// limits are what f's instances are configured with: the provider's rate
// and burst, discovery on.
func (f fleetSize) limits() limits {
	return limits{rate: f.rate, burst: f.burst, egressBurst: f.burst, adaptive: true}
}

// fleetSizeHeader is the header of the fleet-size table.
func fleetSizeHeader() []string {
	return []string{"fleet", "R / B", "strategy", "successes in 10 s", "% of R", "429s", "429s per second",
		"max sent / 1 s (R+B)", "p50", "p99", "p99 / FIFO ideal", "Redis round trips / success of the load", "an instance's own round trips", "fallbacks"}
}

// row is f's row for kind: succ successes in the run's 10 s, o's 429s,
// sends and latencies, rt Redis round trips per success of the load and
// rtPod an instance's own: its connections' set-up and its heartbeats sent
// alone (see fleetDiag.roundTrips).
func (f fleetSize) row(kind string, succ int, o outcome, rt, rtPod float64) []string {
	return []string{f.id, fmt.Sprintf("%g / %d", f.rate, f.burst), kind, benchkit.Count(succ),
		benchkit.Percent(float64(succ) / (f.rate * signalDuration.Seconds())), benchkit.Count(o.limited), fmt.Sprint(o.limitedPerSec),
		fmt.Sprintf("%d (%d)", o.maxSentPerSec, int(f.rate)+f.burst), benchkit.Ms(o.p50), benchkit.Ms(o.p99),
		fmt.Sprintf("%.2f", o.p99.Seconds()/f.fifoIdeal().Seconds()), fmt.Sprintf("%.2f", rt), fmt.Sprintf("%.1f", rtPod), benchkit.Count(int(o.fallback))}
}
