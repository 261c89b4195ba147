package egressotel

import (
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// OtherKey is the key attribute of every key outside the allow-list or
// beyond the cap on distinct keys.
const OtherKey = "other"

// The attribute keys of the instruments.
const (
	attrKey            = attribute.Key("egress.key")
	attrResult         = attribute.Key("egress.result")
	attrReason         = attribute.Key("egress.reason")
	attrCause          = attribute.Key("egress.retry.cause")
	attrWhy            = attribute.Key("egress.rate.why")
	attrLimiter        = attribute.Key("egress.limiter")
	attrDimension      = attribute.Key("egress.quota.dimension")
	attrStatus         = attribute.Key("http.response.status_code")
	attrErrorType      = attribute.Key("error.type")
	attrFallbackActive = attribute.Key("egress.fallback.active")
)

// guard maps keys to the series they are recorded under: the key itself
// while it is allowed and under the cap, OtherKey beyond.
type guard struct {
	allow map[string]bool // nil: every key, up to max
	max   int

	mu    sync.RWMutex
	keys  map[string]*series // guarded by mu; the keys given their own series
	other *series
}

func newGuard(allow []string, max int) *guard {
	g := &guard{max: max, keys: map[string]*series{}, other: newSeries(OtherKey)}
	if allow != nil {
		g.allow = make(map[string]bool, len(allow))
		for _, k := range allow {
			g.allow[k] = true
		}
	}
	return g
}

// series returns the series key is recorded under.
func (g *guard) series(key string) *series {
	g.mu.RLock()
	s, ok := g.keys[key]
	g.mu.RUnlock()
	if ok {
		return s
	}
	if g.allow != nil && !g.allow[key] {
		return g.other
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if s, ok := g.keys[key]; ok {
		return s
	}
	if len(g.keys) >= g.max {
		return g.other
	}
	s = newSeries(key)
	g.keys[key] = s
	return s
}

// named returns the keys given their own series, with their series.
func (g *guard) named() map[string]*series {
	g.mu.RLock()
	defer g.mu.RUnlock()
	m := make(map[string]*series, len(g.keys))
	for k, s := range g.keys {
		m[k] = s
	}
	return m
}

// series holds the attribute sets of one key attribute value, built once
// so that recording allocates nothing, and the key's pending waits.
type series struct {
	key     string
	add     []metric.AddOption    // {egress.key}
	record  []metric.RecordOption // {egress.key}
	sent    []metric.AddOption    // {egress.key, egress.result=sent}
	waited  []metric.AddOption    // {egress.key, egress.result=waited}
	observe []metric.ObserveOption

	// waits counts the waits told by OnWait whose attempt OnSent has not
	// told yet: an OnSent that finds one was a waited request, else a
	// request sent at once.
	waits atomic.Int64

	mu   sync.Mutex
	more map[attrPair][]metric.AddOption // guarded by mu; {egress.key, one more attribute}
}

type attrPair struct{ a, b attribute.KeyValue }

func newSeries(key string) *series {
	k := attribute.String(string(attrKey), key)
	set := attribute.NewSet(k)
	return &series{
		key:     key,
		add:     []metric.AddOption{metric.WithAttributeSet(set)},
		record:  []metric.RecordOption{metric.WithAttributeSet(set)},
		observe: []metric.ObserveOption{metric.WithAttributeSet(set)},
		sent:    []metric.AddOption{metric.WithAttributes(k, attrResult.String("sent"))},
		waited:  []metric.AddOption{metric.WithAttributes(k, attrResult.String("waited"))},
		more:    map[attrPair][]metric.AddOption{},
	}
}

// with returns the options of the key with one or two more attributes
// (b may be the zero KeyValue), built on first use. The values given are
// few (reasons, causes, status codes), so the map stays small.
func (s *series) with(a, b attribute.KeyValue) []metric.AddOption {
	p := attrPair{a, b}
	s.mu.Lock()
	defer s.mu.Unlock()
	if o, ok := s.more[p]; ok {
		return o
	}
	kvs := []attribute.KeyValue{attrKey.String(s.key), a}
	if b.Valid() {
		kvs = append(kvs, b)
	}
	o := []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(kvs...))}
	s.more[p] = o
	return o
}

// takeWait takes one of the pending waits, and reports whether there was
// one. Each OnWait is followed by its attempt's OnSent, so the totals are
// exact even when concurrent requests of a key pair up out of order.
func (s *series) takeWait() bool {
	for {
		n := s.waits.Load()
		if n <= 0 {
			return false
		}
		if s.waits.CompareAndSwap(n, n-1) {
			return true
		}
	}
}
