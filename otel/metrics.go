package egressotel

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/egress-go/egress"
	"go.opentelemetry.io/otel/metric"
)

// ScopeName is the instrumentation scope of the meter the instruments are
// made with.
const ScopeName = "github.com/egress-go/egress/otel"

// Metrics holds the instruments of one or more egress Transports, and what
// the gauges read (the limiters, the provider's last reported quotas).
// Make it with NewMetrics, once per process (or per provider, with its own
// MeterProvider or attributes); a Metrics is safe for simultaneous use by
// multiple goroutines.
type Metrics struct {
	guard   *guard
	keyFunc func(*http.Request) string

	requests  metric.Int64Counter
	attempts  metric.Int64Counter
	wait      metric.Float64Histogram
	waiting   metric.Int64UpDownCounter
	inFlight  metric.Int64UpDownCounter
	retries   metric.Int64Counter
	exhausted metric.Int64Counter
	pauses    metric.Int64Counter
	changes   metric.Int64Counter
	switches  metric.Int64Counter
	shadow    metric.Int64Counter
	near      metric.Int64Counter

	classes      *classes // the attribute sets of requests' classes
	classWait    metric.Float64Histogram
	classRefused metric.Int64Counter

	rate, fallback, instances, remaining, limit metric.Float64ObservableGauge
	registration                                metric.Registration

	mu     sync.Mutex
	rates  []named[RateReader]  // guarded by mu
	shared []named[StatsReader] // guarded by mu
	quotas map[quotaKey]quota   // guarded by mu; the provider's last report by key and dimension
}

type named[T any] struct {
	name string
	src  T
}

// RateReader is what ObserveRates reads: the limiters of egress
// (TokenBucket, LeakyBucket and their shared forms) implement it.
type RateReader interface {
	EffectiveRate(key string) egress.Rate
}

// StatsReader is what ObserveShared reads: SharedTokenBucket,
// SharedLeakyBucket and SharedLimits implement it.
type StatsReader interface {
	Stats() egress.SharedStats
}

// NewMetrics makes the instruments with a meter of mp named ScopeName. A
// nil mp is an error; an invalid option is an error naming it.
func NewMetrics(mp metric.MeterProvider, opts ...Option) (*Metrics, error) {
	if mp == nil {
		return nil, errors.New("egressotel: NewMetrics: the MeterProvider must not be nil")
	}
	c := config{maxKeys: defaultMaxKeys, maxTenants: defaultMaxTenants, keyFunc: hostKey}
	for _, o := range opts {
		if o == nil {
			c.errs = append(c.errs, errors.New("egressotel: NewMetrics: options must not be nil"))
			continue
		}
		o.apply(&c)
	}
	if err := errors.Join(c.errs...); err != nil {
		return nil, err
	}
	m := &Metrics{guard: newGuard(c.allow, c.maxKeys), keyFunc: c.keyFunc, quotas: map[quotaKey]quota{}, classes: newClasses(c.maxTenants)}
	if err := m.instruments(mp.Meter(ScopeName)); err != nil {
		return nil, fmt.Errorf("egressotel: NewMetrics: %w", err)
	}
	return m, nil
}

// waitBuckets are the wait histogram's bounds, in seconds: from a
// millisecond of pacing to a minute's pause.
var waitBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

func (m *Metrics) instruments(meter metric.Meter) error {
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	upDown := func(name, unit, desc string) metric.Int64UpDownCounter {
		c, err := meter.Int64UpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	gauge := func(name, unit, desc string) metric.Float64ObservableGauge {
		g, err := meter.Float64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	m.requests = counter("egress.requests", "{request}",
		"Attempts that passed the limiter (result sent or waited) or were refused without being sent (result refused, with its reason).")
	m.attempts = counter("egress.attempts", "{attempt}",
		"Attempts sent to the provider, by response status code (error.type when no response came).")
	var err error
	m.wait, err = meter.Float64Histogram("egress.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("Time an attempt waited for capacity before it was sent; attempts sent at once are not recorded."),
		metric.WithExplicitBucketBoundaries(waitBuckets...))
	errs = append(errs, err)
	m.classWait, err = meter.Float64Histogram("egress.priority.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("With egress.WithPriorities, the time a request waited before it was sent, by its priority and tenant (egress.priority, egress.tenant)."),
		metric.WithExplicitBucketBoundaries(waitBuckets...))
	errs = append(errs, err)
	m.classRefused = counter("egress.priority.refused", "{request}",
		"With egress.WithPriorities, requests refused without being sent, by priority, tenant and reason.")
	m.waiting = upDown("egress.requests.waiting", "{request}", "Requests waiting for capacity now (through Metrics.Limiter).")
	m.inFlight = upDown("egress.requests.in_flight", "{request}", "Requests sent and not yet answered (through Metrics.InFlight).")
	m.retries = counter("egress.retries", "{retry}", "Retries about to be made, by the cause of the failed attempt.")
	m.exhausted = counter("egress.retry_budget.exhausted", "{retry}", "Retries not made because the retry budget was spent.")
	m.pauses = counter("egress.pauses", "{pause}", "Responses that paused a key (a Retry-After, an exhausted quota).")
	m.changes = counter("egress.rate.changes", "{change}", "Changes of a key's rate decided from responses, by why.")
	m.shadow = counter("egress.shadow.decisions", "{request}",
		"In shadow mode, attempts sent that an enforcing Transport would have delayed (result waited) or refused (result refused, with its reason).")
	m.near = counter("egress.near_limit", "{event}", "Keys that a provider's report put below the near-limit ratio of a quota (once per crossing).")
	m.switches = counter("egress.fallback.switches", "{switch}", "Switches of a shared limiter to its local fallback (egress.fallback.active=true) and back.")
	g := []metric.Float64ObservableGauge{
		gauge("egress.rate.effective", "1/s", "The rate each key is held to now, in cost units per second (through ObserveRates)."),
		gauge("egress.fallback.active", "", "1 while a shared limiter runs on its local fallback because Redis is unreachable, else 0 (through ObserveShared)."),
		gauge("egress.fleet.instances", "{instance}", "Instances of a shared limiter last counted in Redis (through ObserveShared)."),
		gauge("egress.provider.remaining", "{unit}", "The provider's last reported remaining quota of each key, by dimension (through Limiter)."),
		gauge("egress.provider.limit", "{unit}", "The provider's last reported quota limit of each key, by dimension (through Limiter)."),
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	m.rate, m.fallback, m.instances, m.remaining, m.limit = g[0], g[1], g[2], g[3], g[4]
	m.registration, err = meter.RegisterCallback(m.observe, g[0], g[1], g[2], g[3], g[4])
	return err
}

// Close unregisters the callback of the gauges; the counters are left to
// the MeterProvider's shutdown.
func (m *Metrics) Close() error {
	return m.registration.Unregister()
}

// ObserveRates makes egress.rate.effective report l's effective rate of
// every key recorded under its own name (not OtherKey), with the attribute
// egress.limiter=name. The limiters of egress implement RateReader. A nil l
// or an empty name is an error.
func (m *Metrics) ObserveRates(name string, l RateReader) error {
	if l == nil || name == "" {
		return errors.New("egressotel: ObserveRates: the name and the limiter must be set")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rates = append(m.rates, named[RateReader]{name, l})
	return nil
}

// ObserveShared makes egress.fallback.active and egress.fleet.instances
// report s's Stats, with the attribute egress.limiter=name. A nil s or an
// empty name is an error.
func (m *Metrics) ObserveShared(name string, s StatsReader) error {
	if s == nil || name == "" {
		return errors.New("egressotel: ObserveShared: the name and the limiter must be set")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.shared = append(m.shared, named[StatsReader]{name, s})
	return nil
}

// observe is the gauges' callback.
func (m *Metrics) observe(_ context.Context, o metric.Observer) error {
	m.mu.Lock()
	rates, shared := m.rates, m.shared
	quotas := make([]quotaReading, 0, len(m.quotas))
	for k, q := range m.quotas {
		quotas = append(quotas, quotaReading{k, q})
	}
	m.mu.Unlock()

	if len(rates) > 0 {
		keys := m.guard.named()
		for _, r := range rates {
			for key := range keys {
				o.ObserveFloat64(m.rate, r.src.EffectiveRate(key).PerSecond(),
					metric.WithAttributes(attrLimiter.String(r.name), attrKey.String(key)))
			}
		}
	}
	for _, s := range shared {
		st := s.src.Stats()
		active := 0.0
		if st.Fallback {
			active = 1
		}
		attrs := metric.WithAttributes(attrLimiter.String(s.name))
		o.ObserveFloat64(m.fallback, active, attrs)
		o.ObserveFloat64(m.instances, float64(st.LiveInstances), attrs)
	}
	for _, q := range quotas {
		attrs := metric.WithAttributes(attrKey.String(q.key.key), attrDimension.String(q.key.dimension))
		o.ObserveFloat64(m.remaining, q.q.remaining, attrs)
		if q.q.hasLimit {
			o.ObserveFloat64(m.limit, q.q.limit, attrs)
		}
	}
	return nil
}

// FallbackObserver returns a hook for egress.WithFallbackObserver that
// counts a shared limiter's switches in egress.fallback.switches, with the
// attributes egress.limiter and egress.fallback.active (true on the switch
// to the fallback). Chain it with egress.SlogFallbackObserver to log them
// too.
func (m *Metrics) FallbackObserver() func(name string, active bool, err error) {
	return func(name string, active bool, _ error) {
		m.switches.Add(context.Background(), 1, metric.WithAttributes(
			attrLimiter.String(name), attrFallbackActive.Bool(active)))
	}
}
