package priority

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/failsafe-go/failsafe-go/adaptivelimiter"
	fspriority "github.com/failsafe-go/failsafe-go/priority"
	"github.com/failsafe-go/failsafe-go/ratelimiter"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/egress-go/egress"
)

// The levels of a call, as the streams name them; each implementation maps
// them to its own.
const (
	levelLow    = 0
	levelNormal = 1
	levelHigh   = 2
)

// class is what a call is for: its priority level, its tenant, and its cost
// in tokens (0 outside the token scenario).
type class struct {
	level  int
	tenant string
	tokens int
}

// The failsafe-go row's settings: see TestPriorityScenarios.
const (
	failsafeLimit       = 1                      // permits of its PriorityLimiter: one caller at a time waits for the rate limiter
	failsafeCalibration = 100 * time.Millisecond // between the Prioritizer's calibrations
	failsafeUsageWindow = 5 * time.Second        // of its UsageTracker
)

// impl is a row: a way for an instance to call the provider under a rate
// limit with priorities.
type impl struct {
	name     string
	fleet    bool // 4 instances sharing a limit in Redis; else one instance
	failsafe bool // the failsafe-go row
	new      func(env instEnv) (instance, error)
}

// instEnv is what an instance is built from.
type instEnv struct {
	rate   float64 // the provider's rate, per second, in requests or tokens
	burst  int     // the clients' burst, in the same unit
	tokens bool    // costs are in tokens: the tokens header of each request
	base   http.RoundTripper
	rdb    *redis.Client // the instance's own client; nil unless impl.fleet
	name   string        // of the shared limit in Redis
	add    func(func() error)
}

// instance makes one call as its caller sees it: wait, then send.
type instance struct {
	do func(req *http.Request, c class) (*http.Response, error)
}

func impls() []impl {
	return []impl{
		{name: "failsafe-go PriorityLimiter + RateLimiter", failsafe: true, new: newFailsafe},
		{name: "priority heap over x/time/rate", new: newBottleneck},
		{name: "egress, no priorities (FIFO), local", new: func(env instEnv) (instance, error) { return newEgress(env, false) }},
		{name: "egress WithPriorities, local", new: func(env instEnv) (instance, error) { return newEgress(env, true) }},
		{name: "egress WithPriorities, shared, 4 instances", fleet: true, new: func(env instEnv) (instance, error) { return newEgress(env, true) }},
	}
}

// costOf is a call's units: its tokens in the token scenario, else 1.
func (env instEnv) costOf(c class) int {
	if env.tokens {
		return c.tokens
	}
	return 1
}

// newFailsafe is failsafe-go's nearest to a priority queue at a fixed rate:
// a PriorityLimiter (a concurrency limiter that sheds the lower priorities
// when its queue grows) fixed at failsafeLimit permits, whose permit a
// caller holds while it waits for a smooth RateLimiter at the rate; the
// permit's usage is the call's cost, recorded for its tenant (a user) in a
// UsageTracker, so that heavier users get lower levels within a priority.
func newFailsafe(env instEnv) (instance, error) {
	tracker := fspriority.NewUsageTracker(failsafeUsageWindow, 100)
	pz := adaptivelimiter.NewPrioritizerBuilder().WithUsageTracker(tracker).Build()
	pl := adaptivelimiter.NewBuilder[any]().WithLimits(failsafeLimit, failsafeLimit, failsafeLimit).BuildPrioritized(pz)
	stop := pz.ScheduleCalibrations(context.Background(), failsafeCalibration)
	env.add(func() error { stop(); return nil })
	rl := ratelimiter.NewSmooth[any](uint(env.rate), time.Second)
	client := &http.Client{Transport: env.base}
	levels := [...]fspriority.Priority{levelLow: fspriority.Low, levelNormal: fspriority.Medium, levelHigh: fspriority.High}
	do := func(req *http.Request, c class) (*http.Response, error) {
		ctx := fspriority.ContextWithPriority(req.Context(), levels[c.level])
		if c.tenant != "" {
			ctx = fspriority.ContextWithUser(ctx, c.tenant)
		}
		permit, err := pl.AcquirePermit(ctx)
		if err != nil {
			return nil, err
		}
		cost := env.costOf(c)
		err = rl.AcquirePermits(req.Context(), uint(cost))
		if u, ok := permit.(interface{ RecordUsage(string, int64) }); ok && c.tenant != "" {
			u.RecordUsage(c.tenant, int64(cost))
		} else {
			permit.Drop()
		}
		if err != nil {
			return nil, err
		}
		return client.Do(req)
	}
	return instance{do: do}, nil
}

// newBottleneck is prioQueue over an x/time/rate limiter at the rate and
// burst.
func newBottleneck(env instEnv) (instance, error) {
	q := newPrioQueue(rate.NewLimiter(rate.Limit(env.rate), env.burst))
	env.add(func() error { q.close(); return nil })
	client := &http.Client{Transport: env.base}
	do := func(req *http.Request, c class) (*http.Response, error) {
		if err := q.wait(req.Context(), c.level, env.costOf(c)); err != nil {
			return nil, err
		}
		return client.Do(req)
	}
	return instance{do: do}, nil
}

// newEgress is an egress Transport over the instance's connection pool,
// with the right limit configured and discovery off (a stray 429 does not
// lower the rate), no retries, and WithPriorities when prio is set. Its
// limiter is a TokenBucket at the rate and burst (tokens: Limits of one
// token bucket, with WithCosts), or, with a Redis client, the shared kind.
func newEgress(env instEnv, prio bool) (instance, error) {
	var (
		lim egress.Limiter
		err error
	)
	tokenLimit := egress.BucketOf(egress.Tokens, egress.PerSecond(env.rate), env.burst)
	switch {
	case env.rdb != nil && env.tokens:
		var sl *egress.SharedLimits
		sl, err = egress.NewSharedLimits(env.rdb, env.name, []egress.Limit{tokenLimit}, egress.WithoutDiscovery())
		if err == nil {
			env.add(sl.Close)
		}
		lim = sl
	case env.rdb != nil:
		var sb *egress.SharedTokenBucket
		sb, err = egress.NewSharedTokenBucket(env.rdb, env.name, egress.PerSecond(env.rate), env.burst, egress.WithoutDiscovery())
		if err == nil {
			env.add(sb.Close)
		}
		lim = sb
	case env.tokens:
		lim, err = egress.NewLimits(tokenLimit)
	default:
		lim, err = egress.NewTokenBucket(egress.PerSecond(env.rate), env.burst, egress.WithoutDiscovery())
	}
	if err != nil {
		return instance{}, err
	}
	opts := []egress.Option{egress.WithLimiter(lim)}
	if prio {
		opts = append(opts, egress.WithPriorities(egress.Priorities{}))
	}
	if env.tokens {
		opts = append(opts, egress.WithCosts(func(r *http.Request) egress.Cost {
			n, _ := strconv.Atoi(r.Header.Get(tokensHeader))
			return egress.Cost{Requests: 1, Tokens: n}
		}))
	}
	tr, err := egress.New(env.base, opts...)
	if err != nil {
		return instance{}, err
	}
	client := &http.Client{Transport: tr}
	levels := [...]egress.Priority{levelLow: egress.PriorityLow, levelNormal: egress.PriorityNormal, levelHigh: egress.PriorityHigh}
	do := func(req *http.Request, c class) (*http.Response, error) {
		ctx := egress.WithClass(req.Context(), egress.Class{Priority: levels[c.level], Tenant: c.tenant})
		return client.Do(req.WithContext(ctx))
	}
	return instance{do: do}, nil
}

// refused reports whether err is a limiter's refusal (rather than the
// call's deadline): egress's LimitError, failsafe-go's ErrExceeded.
func refused(err error) bool {
	var le *egress.LimitError
	return errors.As(err, &le) || errors.Is(err, adaptivelimiter.ErrExceeded) || errors.Is(err, ratelimiter.ErrExceeded)
}
