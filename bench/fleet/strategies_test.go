package fleet

import (
	"context"
	"errors"
	"math"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/hashicorp/go-retryablehttp"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/egress-go/egress"
	"github.com/egress-go/egress/bench/internal/benchkit"
	"github.com/egress-go/egress/internal/naive"
)

// sharedName is the name of the fleet's limit in Redis, for egress and
// redis_rate alike. Each scenario has a Redis of its own.
const sharedName = "fleet"

// limits are what the clients are configured with: the provider's limit
// as the team wrote it down, right or wrong.
type limits struct {
	rate        float64 // per second, for the whole fleet
	burst       int     // the provider's burst, as documented
	egressBurst int     // the burst egress's shared bucket is given
	adaptive    bool    // egress: discovery on (the default; off is WithoutDiscovery)
}

// strategy is a way for a pod to call the provider. newPod builds one pod's
// client; every pod of a fleet gets its own, as separate processes would.
type strategy struct {
	name   string
	redis  bool // needs a Redis
	newPod func(env podEnv) (pod, error)
}

// podEnv is what a pod is built from.
type podEnv struct {
	url      string
	pods     int // in the fleet, for the per-pod split
	limits   limits
	base     http.RoundTripper // the pod's own connection pool, seen through the probe
	rdb      *redis.Client     // the pod's own Redis client; nil unless strategy.redis
	fallback *atomic.Int64     // counts egress's switches to its local fallback
}

// pod is one simulated instance.
type pod struct {
	// do makes one call as the caller sees it: retries and waits inside.
	do func(*http.Request) (*http.Response, error)
	// effectiveRate is the rate egress holds the provider's key to now;
	// nil for the other strategies.
	effectiveRate func(key string) float64
	// close releases the pod's limiter; nil when there is nothing to release.
	close func() error
}

func plainStrategy() strategy {
	return strategy{name: "plain http.Client", newPod: func(env podEnv) (pod, error) {
		c := &http.Client{Transport: env.base}
		return pod{do: c.Do}, nil
	}}
}

func naiveStrategy() strategy {
	return strategy{name: "naive: 429 → again at once (×3)", newPod: func(env podEnv) (pod, error) {
		c := &http.Client{Transport: naive.Retry{Base: env.base}}
		return pod{do: c.Do}, nil
	}}
}

// retryableStrategy is go-retryablehttp with its defaults (RetryMax 4,
// waits of 1 s to 30 s that honour Retry-After on a 429 or 503), quiet.
// Only its connection pool is ours, so that the probe sees every attempt.
func retryableStrategy() strategy {
	return strategy{name: "go-retryablehttp (defaults)", newPod: func(env podEnv) (pod, error) {
		rc := retryablehttp.NewClient()
		rc.Logger = nil
		rc.HTTPClient = &http.Client{Transport: env.base}
		return pod{do: rc.StandardClient().Do}, nil
	}}
}

// splitStrategy is an x/time/rate limiter per pod at the fleet's rate and
// burst divided by the number of pods: Wait, then a plain client.
func splitStrategy() strategy {
	return strategy{name: "x/time/rate per pod (rate/4)", newPod: func(env podEnv) (pod, error) {
		r := env.limits.rate / float64(env.pods)
		lim := rate.NewLimiter(rate.Limit(r), max(1, env.limits.burst/env.pods))
		c := &http.Client{Transport: env.base}
		do := func(req *http.Request) (*http.Response, error) {
			if err := lim.Wait(req.Context()); err != nil {
				return nil, err
			}
			return c.Do(req)
		}
		return pod{do: do}, nil
	}}
}

// redisRateStrategy is redis_rate's GCRA in Redis at the fleet's rate and
// burst, in the loop its README suggests: Allow; if not allowed, sleep
// RetryAfter and ask again; then a plain client.
func redisRateStrategy() strategy {
	return strategy{name: "redis_rate (Allow, sleep RetryAfter)", redis: true, newPod: func(env podEnv) (pod, error) {
		lim := redis_rate.NewLimiter(env.rdb)
		limit := redis_rate.Limit{Rate: int(math.Round(env.limits.rate)), Burst: env.limits.burst, Period: time.Second}
		c := &http.Client{Transport: env.base}
		do := func(req *http.Request) (*http.Response, error) {
			if err := waitRedisRate(req.Context(), lim, limit); err != nil {
				return nil, err
			}
			return c.Do(req)
		}
		return pod{do: do}, nil
	}}
}

func waitRedisRate(ctx context.Context, lim *redis_rate.Limiter, limit redis_rate.Limit) error {
	for {
		res, err := lim.Allow(ctx, sharedName, limit)
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
}

// egressStrategy is egress with a SharedTokenBucket of the fleet's rate in
// the pod's own Redis client, and retries with the default policy.
func egressStrategy(name string) strategy {
	return strategy{name: name, redis: true, newPod: func(env podEnv) (pod, error) {
		lim, err := egress.NewSharedTokenBucket(env.rdb, sharedName, egress.PerSecond(env.limits.rate), env.limits.egressBurst, sharedOptions(env)...)
		if err != nil {
			return pod{}, err
		}
		return egressPod(env, lim, lim.Close)
	}}
}

// egressNoRetryStrategy is egressStrategy with no retries (one attempt):
// a 429 goes back to the caller, as redis_rate's does.
func egressNoRetryStrategy() strategy {
	return strategy{name: "egress SharedTokenBucket, no retries", redis: true, newPod: func(env podEnv) (pod, error) {
		lim, err := egress.NewSharedTokenBucket(env.rdb, sharedName, egress.PerSecond(env.limits.rate), env.limits.egressBurst, sharedOptions(env)...)
		if err != nil {
			return pod{}, err
		}
		return egressPodWith(env, lim, lim.Close, egress.RetryPolicy{MaxAttempts: 1})
	}}
}

// sharedOptions are the options of egress's shared limiters: the fallback
// counted, discovery as the limits say.
func sharedOptions(env podEnv) []egress.LimiterOption {
	opts := []egress.LimiterOption{egress.WithFallbackObserver(func(string, bool, error) { env.fallback.Add(1) })}
	if !env.limits.adaptive {
		opts = append(opts, egress.WithoutDiscovery())
	}
	return opts
}

// egressLimiter is what every limiter of egress offers the pod.
type egressLimiter interface {
	egress.Limiter
	EffectiveRate(key string) egress.Rate
}

// egressPod is a pod that calls through egress with lim and retries with the
// default policy; closeLim, when not nil, releases lim.
func egressPod(env podEnv, lim egressLimiter, closeLim func() error) (pod, error) {
	return egressPodWith(env, lim, closeLim, egress.RetryPolicy{})
}

// egressPodWith is egressPod with the retry policy p.
func egressPodWith(env podEnv, lim egressLimiter, closeLim func() error, p egress.RetryPolicy) (pod, error) {
	tr, err := egress.New(env.base, egress.WithLimiter(lim), egress.WithRetry(p))
	if err != nil {
		if closeLim != nil {
			err = errors.Join(err, closeLim())
		}
		return pod{}, err
	}
	c := &http.Client{Transport: tr}
	return pod{
		do:            c.Do,
		effectiveRate: func(key string) float64 { return lim.EffectiveRate(key).PerSecond() },
		close:         closeLim,
	}, nil
}
