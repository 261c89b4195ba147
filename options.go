package egress

// Every option, in two types: the Transport's (Option), each with its
// default (set in newConfig) and what it refuses; and the limiters'
// (LimiterOption, one type for every limiter, each option applying to the
// limiters its doc names and refused by name by the others).

import (
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/egress-go/egress/internal/dialect"
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
		case !dialect.IsResetHeader(name):
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

// LimiterOption configures a limiter of this package. Each option's doc
// names the limiters it applies to; a constructor given one that does not
// apply to it fails with ErrInvalidConfig, naming both.
type LimiterOption interface {
	limiterOption() *limiterOption
}

// limiterOption is every LimiterOption: its name, the limiters it applies
// to, and what it sets.
type limiterOption struct {
	name    string
	applies limiterKind
	set     func(*limiterSettings)
}

func (o *limiterOption) limiterOption() *limiterOption { return o }

// limiterKind is a set of the limiters' constructors.
type limiterKind uint8

const (
	localRate      limiterKind = 1 << iota // NewTokenBucket, NewLeakyBucket
	sharedRate                             // NewSharedTokenBucket, NewSharedLeakyBucket, NewSharedLimits
	localInFlight                          // NewInFlightLimit
	sharedInFlight                         // NewSharedInFlightLimit

	rateLimiters     = localRate | sharedRate
	inRedis          = sharedRate | sharedInFlight
	inFlightLimiters = localInFlight | sharedInFlight
)

func (k limiterKind) String() string {
	switch k {
	case rateLimiters:
		return "the rate limiters"
	case inRedis:
		return "the limiters kept in Redis"
	case inFlightLimiters:
		return "the in-flight limits"
	case sharedRate:
		return "the shared rate limiters"
	case sharedInFlight:
		return "a SharedInFlightLimit"
	}
	return fmt.Sprintf("limiters %#x", uint8(k))
}

// limiterSettings gathers a limiter's options over the defaults; each
// constructor reads its own part.
type limiterSettings struct {
	learn    learnOptions // the rate limiters'
	redis    sharedConfig // the limiters kept in Redis (its learn is set by newShared)
	lease    time.Duration
	liveness time.Duration
	errs     []error
}

// limiterSettingsFor applies opts, for the constructor op of kind k, over
// the defaults: a nil option, one that does not apply to k and an invalid
// value are errors, all of them joined.
func limiterSettingsFor(op string, k limiterKind, opts []LimiterOption) (limiterSettings, error) {
	s := limiterSettings{
		redis: sharedConfig{timeout: defaultCommandTimeout, heartbeat: defaultHeartbeat},
		lease: defaultLeaseTime, liveness: defaultLiveness,
	}
	for _, opt := range opts {
		var o *limiterOption
		if opt != nil {
			o = opt.limiterOption()
		}
		switch {
		case o == nil:
			s.errs = append(s.errs, configError(op+": option", "nil", "options must not be nil"))
		case o.applies&k == 0:
			s.errs = append(s.errs, fmt.Errorf("%w: %s: %s applies to %v only", ErrInvalidConfig, op, o.name, o.applies))
		default:
			o.set(&s)
		}
	}
	return s, errors.Join(s.errs...)
}

// limiterOpt is the option name, of the limiters k, that set sets.
func limiterOpt(name string, k limiterKind, set func(*limiterSettings)) LimiterOption {
	return &limiterOption{name: name, applies: k, set: set}
}

// positive records an error naming option when d is not positive.
func (s *limiterSettings) positive(option string, d time.Duration) {
	if d <= 0 {
		s.errs = append(s.errs, configError(option, d, "must be positive"))
	}
}

// WithAdaptive tunes the discovery of a provider's unadvertised limit (see
// AdaptivePolicy); discovery is on by default with the policy's defaults.
// An invalid field fails the limiter's constructor, naming it. It applies
// to the rate limiters (local and shared).
func WithAdaptive(p AdaptivePolicy) LimiterOption {
	return limiterOpt("WithAdaptive", rateLimiters, func(s *limiterSettings) { s.learn.policy = &p })
}

// WithoutDiscovery turns the discovery of unadvertised limits off: a
// throttle then holds the key as the provider asks, and never lowers its
// rate. It applies to the rate limiters.
func WithoutDiscovery() LimiterOption {
	return limiterOpt("WithoutDiscovery", rateLimiters, func(s *limiterSettings) { s.learn.noDiscover = true })
}

// WithoutAdvertisedLimits makes the limiter ignore the limits providers
// advertise (RateLimit-Policy, X-RateLimit-Limit with a window, ...). By
// default a key's rate is lowered to the advertised limit when that is below
// the configured rate. It applies to the rate limiters.
func WithoutAdvertisedLimits() LimiterOption {
	return limiterOpt("WithoutAdvertisedLimits", rateLimiters, func(s *limiterSettings) { s.learn.noAdvert = true })
}

// WithTransitMargin sets the variation of transit time a token bucket
// absorbs by keeping part of its burst in reserve: a provider sees each
// request a little after egress admits it, and a client that used the
// provider's whole burst would see refused every request that travels
// faster than the one before it. The bucket keeps ceil(rate·d) units of its
// burst (at least one, and at most burst−1) unused; that costs the first
// burst those units, never the sustained rate, and a cost up to the whole
// burst is still granted (it waits for the margin to refill). Default 5ms;
// 0 keeps no margin. It must not be negative. It applies to the rate
// limiters; leaky buckets, which never burst, ignore it.
func WithTransitMargin(d time.Duration) LimiterOption {
	return limiterOpt("WithTransitMargin", rateLimiters, func(s *limiterSettings) { s.learn.margin = &d })
}

// WithCommandTimeout bounds each Redis command; a command that takes longer
// counts as a failure and the request goes to the fallback. Default 50ms.
// It applies to the limiters kept in Redis.
func WithCommandTimeout(d time.Duration) LimiterOption {
	return limiterOpt("WithCommandTimeout", inRedis, func(s *limiterSettings) {
		s.positive("WithCommandTimeout", d)
		s.redis.timeout = d
	})
}

// WithFailClosed makes requests fail with ErrSharedUnavailable while Redis
// is unreachable, instead of the default: falling back to a local limiter
// at this instance's share of the rate, so that no request fails because
// Redis did. It applies to the limiters kept in Redis.
func WithFailClosed() LimiterOption {
	return limiterOpt("WithFailClosed", inRedis, func(s *limiterSettings) { s.redis.failClosed = true })
}

// WithFallbackRate sets the rate of the local limiter used while Redis is
// unreachable. Default: the shared rate divided by the number of live
// instances last counted in Redis (each instance heartbeats with its
// reservations, and at least every two seconds when idle; an instance that
// never reached Redis counts the fleet as itself alone). The fallback of a
// SharedTokenBucket sends at once only the same share of the burst. It
// applies to the shared rate limiters (a SharedInFlightLimit's fallback is
// its share of n).
func WithFallbackRate(r Rate) LimiterOption {
	return limiterOpt("WithFallbackRate", sharedRate, func(s *limiterSettings) {
		if err := r.validate("WithFallbackRate"); err != nil {
			s.errs = append(s.errs, err)
		}
		s.redis.fallbackRate = r
	})
}

// WithFallbackObserver sets a hook called when the limiter named name
// switches to its local fallback (active true, with the Redis error) and
// back to shared mode (active false). It must be quick. It applies to the
// limiters kept in Redis.
func WithFallbackObserver(f func(name string, active bool, err error)) LimiterOption {
	return limiterOpt("WithFallbackObserver", inRedis, func(s *limiterSettings) {
		if f == nil {
			s.errs = append(s.errs, configError("WithFallbackObserver", "nil", "the hook must not be nil"))
		}
		s.redis.onFallback = f
	})
}

// WithLeaseTime sets the longest one request may hold a slot: a response
// body that is never read to its end nor closed, in a context that never
// ends, gives its slot back when its lease ends. Set it above the longest
// response you read (a long stream). Default 5 minutes; it must be
// positive. It applies to the in-flight limits.
func WithLeaseTime(d time.Duration) LimiterOption {
	return limiterOpt("WithLeaseTime", inFlightLimiters, func(s *limiterSettings) {
		s.positive("WithLeaseTime", d)
		s.lease = d
	})
}

// WithLiveness sets how long a SharedInFlightLimit's lease lives in Redis
// unless its instance renews it: how soon the slots of an instance that
// died come back. Its instance renews it every third of that. Default 10
// seconds; it must be positive. It applies to a SharedInFlightLimit.
func WithLiveness(d time.Duration) LimiterOption {
	return limiterOpt("WithLiveness", sharedInFlight, func(s *limiterSettings) {
		s.positive("WithLiveness", d)
		s.liveness = d
	})
}
