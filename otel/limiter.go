package egressotel

import (
	"context"
	"net/http"
	"time"

	"github.com/egress-go/egress"
)

// Limiter returns l with egress.requests.waiting counted around each Wait,
// by key. When l is an egress.Learner (the limiters of egress are), the
// result is one too: it forwards Learn to l and keeps the provider's last
// reported quotas for egress.provider.remaining and egress.provider.limit.
// Give the result to egress.WithLimiter, and keep l for its other methods
// (EffectiveRate, Stats, Close).
//
// A Transport whose limiter is not a Learner waits out providers' pauses
// outside the limiter: those waits are not counted as waiting.
func (m *Metrics) Limiter(l egress.Limiter) egress.Limiter {
	w := &waitCounter{m: m, l: l}
	if ln, ok := l.(egress.Learner); ok {
		return &learner{waitCounter: w, ln: ln}
	}
	return w
}

type waitCounter struct {
	m *Metrics
	l egress.Limiter
}

// Wait implements egress.Limiter.
func (w *waitCounter) Wait(ctx context.Context, key string, cost int, maxWait time.Duration) (time.Duration, error) {
	opts := w.m.guard.series(key).add
	bg := context.Background()
	w.m.waiting.Add(bg, 1, opts...)
	defer w.m.waiting.Add(bg, -1, opts...)
	return w.l.Wait(ctx, key, cost, maxWait)
}

type learner struct {
	*waitCounter
	ln egress.Learner
}

// Learn implements egress.Learner: it forwards to the limiter, then keeps
// what the response said of the key's quotas.
func (l *learner) Learn(ctx context.Context, key string, s egress.Signal) egress.Decision {
	d := l.ln.Learn(ctx, key, s)
	l.m.heard(key, s.Quotas)
	return d
}

// quotaKey names a gauge series of the provider's quotas.
type quotaKey struct{ key, dimension string }

// quota is the provider's last report of a quota.
type quota struct {
	remaining, limit float64
	hasLimit         bool
}

type quotaReading struct {
	key quotaKey
	q   quota
}

// heard keeps the quotas a response reported, the tightest (least
// remaining) of each dimension; a response without quotas leaves the last
// report as it is. Keys recorded as OtherKey are not kept: the last of many
// keys says nothing of any.
func (m *Metrics) heard(key string, qs []egress.Quota) {
	if len(qs) == 0 {
		return
	}
	s := m.guard.series(key)
	if s == m.guard.other {
		return
	}
	var tight map[string]quota
	for _, q := range qs {
		if !q.HasRemaining {
			continue
		}
		dim := q.Dimension.String()
		if t, ok := tight[dim]; ok && t.remaining <= q.Remaining {
			continue
		}
		if tight == nil {
			tight = map[string]quota{}
		}
		tight[dim] = quota{remaining: q.Remaining, limit: q.Limit, hasLimit: q.HasLimit}
	}
	if tight == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for dim, q := range tight {
		m.quotas[quotaKey{s.key, dim}] = q
	}
}

// InFlight returns base with egress.requests.in_flight counted around each
// RoundTrip, by key (named by WithKeyFunc, which must match the
// Transport's). Give the result to egress.New as the Transport's base: it
// then counts each attempt from the moment it leaves the limiter until its
// response headers (or error) come back. A nil base is
// http.DefaultTransport.
func (m *Metrics) InFlight(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &inFlight{m: m, base: base}
}

type inFlight struct {
	m    *Metrics
	base http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (t *inFlight) RoundTrip(req *http.Request) (*http.Response, error) {
	opts := t.m.guard.series(t.m.keyFunc(req)).add
	ctx := context.Background()
	t.m.inFlight.Add(ctx, 1, opts...)
	defer t.m.inFlight.Add(ctx, -1, opts...)
	return t.base.RoundTrip(req)
}

// CloseIdleConnections closes the idle connections of base, when it has
// such a method.
func (t *inFlight) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}
