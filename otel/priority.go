package egressotel

import (
	"context"
	"errors"
	"sync"

	"github.com/egress-go/egress"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The attributes of a request's class (egress.WithPriorities).
const (
	attrPriority = attribute.Key("egress.priority")
	attrTenant   = attribute.Key("egress.tenant")
)

// OtherTenant is the tenant attribute of every tenant beyond the cap on
// distinct tenants (WithMaxTenants).
const OtherTenant = "other"

// defaultMaxTenants is the cap on distinct tenants of WithMaxTenants.
const defaultMaxTenants = 20

// classes builds the attribute sets of a key's series with a class (and a
// refusal's reason), once each, so that recording allocates nothing after
// the first time. The first max tenants seen keep their name; later ones
// are OtherTenant.
type classes struct {
	max int

	mu      sync.Mutex
	tenants map[string]bool            // guarded by mu: the tenants named
	sets    map[classSet]attribute.Set // guarded by mu
}

type classSet struct {
	key, tenant, reason string
	priority            egress.Priority
}

func newClasses(max int) *classes {
	return &classes{max: max, tenants: map[string]bool{}, sets: map[classSet]attribute.Set{}}
}

// set returns the attribute set of key (already bounded by the guard),
// class c and reason ("" for none).
func (cs *classes) set(key string, c egress.Class, reason string) attribute.Set {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	tenant := c.Tenant
	if !cs.tenants[tenant] {
		if len(cs.tenants) >= cs.max {
			tenant = OtherTenant
		} else {
			cs.tenants[tenant] = true
		}
	}
	p := c.Priority.String()
	k := classSet{key: key, tenant: tenant, reason: reason, priority: c.Priority}
	if s, ok := cs.sets[k]; ok {
		return s
	}
	kvs := []attribute.KeyValue{attrKey.String(key), attrPriority.String(p), attrTenant.String(tenant)}
	if reason != "" {
		kvs = append(kvs, attrReason.String(reason))
	}
	s := attribute.NewSet(kvs...)
	cs.sets[k] = s
	return s
}

// onQueued is the Observer's OnQueued: the wait of a request by its class.
func (m *Metrics) onQueued(key string, c egress.Class, seconds float64) {
	s := m.classes.set(m.guard.series(key).key, c, "")
	m.classWait.Record(context.Background(), seconds, metric.WithAttributeSet(s))
}

// onClassRefused counts a refusal by the request's class, when the
// Transport orders by priority (the LimitError carries the class).
func (m *Metrics) onClassRefused(key string, err error, why string) {
	var le *egress.LimitError
	if !errors.As(err, &le) || !le.Ordered() {
		return
	}
	s := m.classes.set(m.guard.series(key).key, le.Class, why)
	m.classRefused.Add(context.Background(), 1, metric.WithAttributeSet(s))
}
