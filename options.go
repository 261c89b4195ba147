package egress

// The Transport's options, each with its default (set in newConfig) and
// what it refuses. The limiters' own options stay beside them: the
// learning options (LearnOption) in adaptive.go, the fleet's (SharedOption,
// RedisOption) in shared.go, the in-flight caps' (InFlightOption) in
// inflight.go.

import (
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"time"
)

// Option configures a Transport in New.
type Option interface {
	apply(*config)
}

// config gathers the options; newConfig sets the defaults and validates
// it once.
type config struct {
	limiter  Limiter
	inFlight InFlightLimiter
	keyFunc  func(*http.Request) string
	costFunc func(*http.Request) int
	costs    func(*http.Request) Cost
	// costFuncSet says WithCostFunc was given (it and WithCosts exclude
	// each other).
	costFuncSet bool
	maxWait     time.Duration
	observer    Observer
	retry       *RetryPolicy
	maxPause    time.Duration
	maxQuota    time.Duration
	signals     signalConfig // how responses are read (dialect.go)
	shadow      bool
	near        float64
	priorities  *Priorities // nil: arrival order
	errs        []error
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// newConfig applies opts to the defaults and validates the result once,
// with every error it finds joined.
func newConfig(opts []Option) (config, error) {
	c := config{
		keyFunc:  hostKey,
		costFunc: unitCost,
		maxPause: defaultMaxPause,
		maxQuota: defaultMaxQuotaHold,
		near:     defaultNearLimit,
	}
	for _, o := range opts {
		if o == nil {
			c.errs = append(c.errs, configError("New: option", "nil", "options must not be nil"))
			continue
		}
		o.apply(&c)
	}
	if c.shadow && c.retry != nil {
		c.errs = append(c.errs, configError("WithShadow", "with WithRetry", "shadow mode reports decisions and does not retry; drop one of the two"))
	}
	c.checkCosts()
	return c, errors.Join(c.errs...)
}

// The defaults of WithMaxPause and WithMaxQuotaHold. The pause cap is two
// minutes, the longest wait openai-python honours in-line, so that a
// provider that asks for 90 s is not sent to 30 s early.
const (
	defaultMaxPause     = 2 * time.Minute
	defaultMaxQuotaHold = 24 * time.Hour
	defaultNearLimit    = 0.2
)

// WithLimiter sets the limiter that every request passes. Default: none, the
// Transport does not throttle. A nil limiter is an error.
func WithLimiter(l Limiter) Option {
	return optionFunc(func(c *config) {
		if l == nil || isNilPointer(l) {
			c.errs = append(c.errs, configError("WithLimiter", l, "the limiter must not be nil"))
		}
		c.limiter = l
	})
}

// WithInFlightLimit caps the requests of each key in flight at once (see
// InFlightLimiter): an attempt takes a slot before it waits for the rate
// limiter, and frees it when its response body is read to its end or
// closed, when it fails, or when its context ends. The slot wait counts
// against WithMaxWait. Default: no cap. A nil limiter is an error.
func WithInFlightLimit(l InFlightLimiter) Option {
	return optionFunc(func(c *config) {
		if l == nil || isNilPointer(l) {
			c.errs = append(c.errs, inFlightConfigError(l))
		}
		c.inFlight = l
	})
}

// WithKeyFunc sets the function that names the bucket a request draws from.
// Default: the request's host (req.URL.Host). Key by host, account or API
// key, never by the raw URL path: an ID in the path would make one key per
// request. A nil function is an error.
func WithKeyFunc(f func(*http.Request) string) Option {
	return optionFunc(func(c *config) {
		if f == nil {
			c.errs = append(c.errs, configError("WithKeyFunc", "nil", "the key function must not be nil"))
		}
		c.keyFunc = f
	})
}

// WithCostFunc sets the function that says how many units a request costs.
// Default: 1 for every request. A cost of 0 passes without waiting; a
// negative cost fails the request. A nil function is an error.
func WithCostFunc(f func(*http.Request) int) Option {
	return optionFunc(func(c *config) {
		if f == nil {
			c.errs = append(c.errs, configError("WithCostFunc", "nil", "the cost function must not be nil"))
		}
		c.costFunc, c.costFuncSet = f, true
	})
}

// WithCosts sets the function that estimates a request's cost in each
// dimension (WithCostFunc is its requests-only form; give one or the
// other). The limiter must be a CostLimiter, such as Limits.
//
// An LLM call's tokens are known only after the response: estimate them
// from the request (its prompt's size and max_tokens), and the Transport
// settles each attempt once its response tells: the usage object of an
// OpenAI, Azure OpenAI, Groq or Anthropic body, or Shopify GraphQL's
// actualQueryCost (in Points), read as the body streams by, JSON or
// server-sent events, at its end (see usageBody). A throttled attempt (a
// 429, a 503 with a Retry-After, GitHub's 403 throttle) settles its tokens
// at 0: the provider ran nothing. An attempt that failed, or whose body the
// caller closes before its usage is complete, keeps its estimate. A nil
// function is an error.
func WithCosts(estimate func(*http.Request) Cost) Option {
	return optionFunc(func(c *config) {
		if estimate == nil {
			c.errs = append(c.errs, configError("WithCosts", "nil", "the cost function must not be nil"))
		}
		c.costs = estimate
	})
}

// WithMaxWait sets the longest a request may wait for capacity; a request
// that would need longer fails at once with ErrRateLimited. Default: no
// limit but the request's context. It must be positive.
func WithMaxWait(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d <= 0 {
			c.errs = append(c.errs, configError("WithMaxWait", d, "must be positive"))
		}
		c.maxWait = d
	})
}

// WithRetry makes the Transport retry failed attempts as p says (see
// RetryPolicy; its zero fields take their defaults). Default: no retries.
// An invalid field is an error naming it.
func WithRetry(p RetryPolicy) Option {
	return optionFunc(func(c *config) {
		p, err := p.withDefaults()
		if err != nil {
			c.errs = append(c.errs, err)
		}
		c.retry = &p
	})
}

// WithMaxPause caps how long a response's Retry-After may hold a key or
// delay its request: a hostile or broken header never parks the fleet for
// longer. A longer Retry-After counts as this long, and a retry it asked for
// is given up. Default 2 minutes. It must be positive. (An exhausted quota's
// reset has its own cap: WithMaxQuotaHold.)
func WithMaxPause(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d <= 0 {
			c.errs = append(c.errs, configError("WithMaxPause", d, "must be positive"))
		}
		c.maxPause = d
	})
}

// WithMaxQuotaHold caps how long an exhausted quota may hold a key until
// its reset: GitHub's hourly quota, answered "remaining 0" with a reset 40
// minutes away, holds the key (fleet-wide with a shared limiter) until that
// reset, and every request that cannot wait that long is refused at once
// with a *LimitError whose Wait is the real wait. Default 24 hours. It must
// be positive; Retry-After keeps the WithMaxPause cap.
func WithMaxQuotaHold(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d <= 0 {
			c.errs = append(c.errs, configError("WithMaxQuotaHold", d, "must be positive"))
		}
		c.maxQuota = d
	})
}

// WithShadow makes the Transport compute its decisions, count and report
// them, and enforce none: every request is sent at once, and each one that
// the limiter, a hold of its key or the in-flight cap would have delayed or
// refused is reported to Observer.OnShadow. Use it to roll egress, or a
// change of its limits, out on a live integration (see the README's
// "Running in production"). The controller still learns from responses,
// and its holds and rate changes are reported as usual (OnCooldown,
// OnRateChange), but they hold nothing. A request that would have waited
// takes no capacity from the limiter, as it would not have been sent then:
// under sustained overload the limiter grants its own rate and reports the
// rest, the share that enforcing would have slowed down. A TokenBucket
// instead counts each request as if it waited its turn, so that the waits
// reported add up as an enforcing queue's would, and those beyond the
// maximum wait or the deadline are reported refused. Shadow mode does
// not retry: WithShadow with WithRetry is an error.
func WithShadow() Option {
	return optionFunc(func(c *config) { c.shadow = true })
}

// WithNearLimit sets the ratio of remaining to limit below which a
// provider's report makes Observer.OnNearLimit fire for the key. Default
// 0.2 (20%). It must be above 0 and below 1.
func WithNearLimit(ratio float64) Option {
	return optionFunc(func(c *config) {
		if !(ratio > 0 && ratio < 1) {
			c.errs = append(c.errs, configError("WithNearLimit", ratio, "must be above 0 and below 1"))
		}
		c.near = ratio
	})
}

// WithSignalReader adds r to the readers of every response, after the
// built-in ones: a dialect the built-in readers do not know, without
// forking. Readers run in the order of their options. A nil reader is an
// error. Default: the built-in readers only.
func WithSignalReader(r SignalReader) Option {
	return optionFunc(func(c *config) {
		if r == nil || isNilReader(r) {
			c.errs = append(c.errs, configError("WithSignalReader", fmt.Sprintf("%T", r), "the reader must not be nil"))
			return
		}
		c.signals.readers = append(c.signals.readers, r)
	})
}

// WithResetUnit says that, in responses from host, the reset header
// carries unit: where one header name carries different units at different
// providers, the built-in shape rule (ResetAuto) cannot always tell, e.g.
// X-Rate-Limit-Reset is epoch seconds at Okta but milliseconds from now at
// Prisjakt:
//
//	egress.WithResetUnit("api.prisjakt.nu", "X-Rate-Limit-Reset", egress.ResetDeltaMillis)
//
// host is matched, without regard to case, against the request URL's host,
// with its port or without it. header is one of the reset headers the
// built-in readers read (docs/dialects.md lists them), in any case. A later
// setting for the same host and header replaces an earlier one; ResetAuto
// restores the shape rule. An empty host, an unknown header or an unknown
// unit is an error.
func WithResetUnit(host, header string, unit ResetUnit) Option {
	return optionFunc(func(c *config) {
		name := http.CanonicalHeaderKey(strings.TrimSpace(header))
		switch {
		case host == "" || strings.ContainsAny(host, "/ \t"):
			c.errs = append(c.errs, configError("WithResetUnit: host", fmt.Sprintf("%q", host), "must be a host name, with or without a port"))
		case !isResetHeader(name):
			c.errs = append(c.errs, configError("WithResetUnit: header", fmt.Sprintf("%q", header), "is not a reset header egress reads"))
		case int(unit) >= len(resetUnitNames):
			c.errs = append(c.errs, configError("WithResetUnit: unit", unit, "is not a ResetUnit"))
		default:
			c.signals.units = append(c.signals.units, resetOverride{host: host, header: name, unit: unit})
		}
	})
}

// WithPriorities orders the requests that wait for a key's limit by their
// Class (from the request's context, see WithClass, or p.Classify) rather
// than by arrival:
//
//   - A higher priority goes first. Each lower priority keeps p.MinShare
//     of the grants while it has requests waiting, so none starves.
//   - Within a priority, the tenants with requests waiting share the
//     limit max-min fairly, counted in the limit's own dimension (a
//     request's cost in seconds of the limit; with Limits and WithCosts,
//     of the limit it takes the largest share of): a tenant whose
//     requests cost ten times the tokens gets a tenth of the requests.
//     A tenant's own requests go in arrival order.
//
// It works with every Limiter. The order is kept in the Transport, one
// queue a key: a request waits there for its turn, then for the limiter
// (and the in-flight cap) as it does without priorities, one request of
// the key at a time (two with a shared limiter), up to four high-priority
// ones beside it, and a lower one whose share is due. A turn the limiter
// has given is not displaced: a high-priority request arriving takes the
// next turn from the limiter at once, behind at most those given. The
// shared limiters (SharedTokenBucket, SharedLeakyBucket, SharedLimits)
// keep one order for the fleet in Redis: a request below the highest
// priority takes a turn no further than 20 ms ahead, so that a higher one
// of any instance waits behind at most 20 ms of lower turns; the minimum
// shares and the tenants' fair shares hold across the instances (see the
// README's "Who goes first").
//
// A request that waits in the queue keeps its deadline and maximum wait.
// Its wait there is not known in advance (a higher priority arriving later
// goes before it, and a limit that does not bind grants the queue at
// once), so it is refused when they end while it waits (a *LimitError
// with Queued set, whose Wait is what it waited: the least it would have),
// and, once its turn comes, by the limiter as without priorities (at once
// when the limiter's own wait would outlast them). A request whose context
// ends leaves the queue at once and takes nothing from anyone.
//
// A request granted at once passes the queue's lock, about 70 ns, and
// allocates nothing (see BENCHMARKS.md §1). Without WithPriorities, requests wait in arrival order
// and pay nothing for it. In shadow mode (WithShadow) it has no effect.
func WithPriorities(p Priorities) Option {
	return optionFunc(func(c *config) {
		if err := p.validate(); err != nil {
			c.errs = append(c.errs, err)
			return
		}
		c.priorities = &p
	})
}

// WithObserver sets hooks that the Transport calls as requests wait, are
// refused and are sent. Default: none. Hooks run on the request's goroutine
// and must be quick and safe for concurrent use.
func WithObserver(o Observer) Option {
	return optionFunc(func(c *config) { c.observer = o })
}

// isNilPointer reports whether v is a nil pointer in an interface, such as
// a (*TokenBucket)(nil) passed as a Limiter.
func isNilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

func hostKey(req *http.Request) string { return req.URL.Host }

func unitCost(*http.Request) int { return 1 }
