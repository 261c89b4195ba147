package benchpeers

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/egress-go/egress"
	"github.com/egress-go/egress/bench/internal/benchkit"
	"github.com/egress-go/egress/internal/redistest"
)

// The limits of the shared benchmarks. Wait: low enough that requests must
// wait, so admissions per second are the rate each library sustains. NoWait:
// so high that nothing waits, so they are the decisions per second.
const (
	waitRate, waitBurst     = 2000, 20
	noWaitRate, noWaitBurst = 1_000_000, 1_000_000
	runLimit                = time.Minute // bounds one b.N run whatever goes wrong
)

// goroutineCounts are the concurrencies of the shared benchmarks.
var goroutineCounts = []int{1, 8, 64}

// BenchmarkSharedWait: egress's SharedTokenBucket (and SharedLimits with
// the same bucket as its one limit) against redis_rate at
// 2000/s, burst 20, on one key of a local redis-server. One op is one
// admitted request, so ns/op is 1/(admissions per second); the burst is
// spent before the timer starts. Run it with a fixed count, e.g.
// -benchtime 5000x (2.5 s per run).
func BenchmarkSharedWait(b *testing.B) {
	benchShared(b, waitRate, waitBurst)
}

// BenchmarkSharedNoWait is the same at 1,000,000/s, burst 1,000,000: nothing
// ever waits, so admissions per second are the decision throughput.
func BenchmarkSharedNoWait(b *testing.B) {
	benchShared(b, noWaitRate, noWaitBurst)
}

func benchShared(b *testing.B, rate, burst int) {
	srv := redistest.Start(b)
	var cmds atomic.Int64
	rdb := newClient(b, srv.Addr, &cmds)
	var runs atomic.Int64 // for a fresh key per run
	// By concurrency first, so that the libraries are measured close in time.
	for _, g := range goroutineCounts {
		b.Run(fmt.Sprintf("egress/g=%d", g), func(b *testing.B) {
			benchEgress(b, rdb, &cmds, fmt.Sprintf("run%d", runs.Add(1)), g, rate, burst, false)
		})
		b.Run(fmt.Sprintf("egress-limits/g=%d", g), func(b *testing.B) {
			benchEgress(b, rdb, &cmds, fmt.Sprintf("run%d", runs.Add(1)), g, rate, burst, true)
		})
		b.Run(fmt.Sprintf("redis_rate/g=%d", g), func(b *testing.B) {
			benchRedisRate(b, rdb, &cmds, fmt.Sprintf("run%d", runs.Add(1)), g, rate, burst)
		})
		if rate == noWaitRate {
			b.Run(fmt.Sprintf("ping/g=%d", g), func(b *testing.B) {
				benchPing(b, rdb, &cmds, g)
			})
		}
	}
}

// benchPing is a PING in a loop on the same client: the floor of one round
// trip, for reading the figures of the limiters.
func benchPing(b *testing.B, rdb *redis.Client, cmds *atomic.Int64, g int) {
	b.ReportAllocs()
	ctx, cancel := context.WithTimeout(context.Background(), runLimit)
	defer cancel()
	resetServerStats(b, ctx, rdb)
	cmds0 := cmds.Load()
	b.ResetTimer()
	run(b, g, func() error { return rdb.Ping(ctx).Err() })
	b.StopTimer()
	n := cmds.Load() - cmds0
	report(b, n, n, serverMicros(b, ctx, rdb))
}

// newClient returns a go-redis client with the library's default pool
// (10 per GOMAXPROCS) and timeouts, counting in cmds every command sent.
func newClient(b *testing.B, addr string, cmds *atomic.Int64) *redis.Client {
	rdb := redis.NewClient(&redis.Options{
		Addr:                     addr,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	rdb.AddHook(countingHook{cmds})
	b.Cleanup(func() { _ = rdb.Close() }) // before the server stops
	return rdb
}

// countingHook counts the commands a client sends, pipelined ones included.
type countingHook struct{ n *atomic.Int64 }

func (h countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// sharedLimiter is what benchEgress measures: SharedTokenBucket, or
// SharedLimits with the same bucket as its one limit.
type sharedLimiter interface {
	egress.Limiter
	Stats() egress.SharedStats
	Close() error
}

func benchEgress(b *testing.B, rdb *redis.Client, cmds *atomic.Int64, name string, g, rate, burst int, limits bool) {
	b.ReportAllocs()
	var lim sharedLimiter
	var err error
	if limits {
		lim, err = egress.NewSharedLimits(rdb, name, []egress.Limit{egress.BucketOf(egress.Requests, egress.PerSecond(float64(rate)), burst)})
	} else {
		lim, err = egress.NewSharedTokenBucket(rdb, name, egress.PerSecond(float64(rate)), burst)
	}
	if err != nil {
		b.Fatal(err)
	}
	defer lim.Close()
	ctx, cancel := context.WithTimeout(context.Background(), runLimit)
	defer cancel()
	const key = "api.example.com"
	// Load the script, and spend the burst when requests are to wait.
	for range min(burst, waitBurst) {
		if _, err := lim.Wait(ctx, key, 1, 0); err != nil {
			b.Fatal(err)
		}
	}
	resetServerStats(b, ctx, rdb)
	before, cmds0 := lim.Stats(), cmds.Load()
	b.ResetTimer()
	run(b, g, func() error {
		_, err := lim.Wait(ctx, key, 1, 0)
		return err
	})
	b.StopTimer()
	after := lim.Stats()
	admitted := after.Admitted - before.Admitted
	if after.Fallback || admitted != int64(b.N) {
		b.Fatalf("admitted %d of %d through Redis (fallback %v): the figures would not be of Redis", admitted, b.N, after.Fallback)
	}
	report(b, after.RoundTrips-before.RoundTrips, cmds.Load()-cmds0, serverMicros(b, ctx, rdb))
}

func benchRedisRate(b *testing.B, rdb *redis.Client, cmds *atomic.Int64, name string, g, rate, burst int) {
	b.ReportAllocs()
	lim := redis_rate.NewLimiter(rdb)
	limit := redis_rate.Limit{Rate: rate, Burst: burst, Period: time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), runLimit)
	defer cancel()
	key := name + ":api.example.com"
	// Load the script, and spend the burst when requests are to wait.
	if _, err := lim.AllowN(ctx, key, limit, min(burst, waitBurst)); err != nil {
		b.Fatal(err)
	}
	var calls atomic.Int64
	resetServerStats(b, ctx, rdb)
	cmds0 := cmds.Load()
	b.ResetTimer()
	run(b, g, func() error {
		// The natural usage: Allow; if refused, sleep RetryAfter and ask again.
		for {
			calls.Add(1)
			res, err := lim.Allow(ctx, key, limit)
			if err != nil {
				return err
			}
			if res.Allowed > 0 {
				return nil
			}
			if err := benchkit.Sleep(ctx, res.RetryAfter); err != nil {
				return err
			}
		}
	})
	b.StopTimer()
	report(b, calls.Load(), cmds.Load()-cmds0, serverMicros(b, ctx, rdb))
}

// run calls admit b.N times in all from g goroutines and fails the
// benchmark on the first error.
func run(b *testing.B, g int, admit func() error) {
	var left atomic.Int64
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	var once sync.Once
	for range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				if err := admit(); err != nil {
					once.Do(func() { b.Error(err) })
					return
				}
			}
		}()
	}
	wg.Wait()
}

// report adds the shared metrics: admissions per second, limiter round
// trips (script calls) per admission, Redis commands per admission (all the
// client sent, heartbeats included) and the Redis server's time spent in
// commands per admission, in microseconds: a single-threaded Redis has about
// 10⁶ of them per second to give.
func report(b *testing.B, roundTrips, cmds int64, serverMicros float64) {
	n := float64(b.N)
	b.ReportMetric(n/b.Elapsed().Seconds(), "admits/s")
	b.ReportMetric(float64(roundTrips)/n, "rt/admit")
	b.ReportMetric(float64(cmds)/n, "cmds/admit")
	b.ReportMetric(serverMicros/n, "redis-µs/admit")
}

// resetServerStats zeroes the server's per-command statistics.
func resetServerStats(b *testing.B, ctx context.Context, rdb *redis.Client) {
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
}

// serverMicros returns the microseconds the server spent in commands since
// resetServerStats, from INFO commandstats (usec= of every cmdstat_ line).
func serverMicros(b *testing.B, ctx context.Context, rdb *redis.Client) float64 {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		for _, field := range strings.Split(strings.TrimSpace(line[strings.IndexByte(line, ':')+1:]), ",") {
			if v, ok := strings.CutPrefix(field, "usec="); ok {
				us, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatalf("INFO commandstats: %q: %v", line, err)
				}
				total += us
			}
		}
	}
	return total
}
