package egress

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorder is a slog.Handler that keeps the records at or above its level.
type recorder struct {
	level slog.Level
	mu    sync.Mutex
	recs  []slog.Record
}

func (r *recorder) Enabled(_ context.Context, l slog.Level) bool { return l >= r.level }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler           { return r }
func (r *recorder) WithGroup(string) slog.Handler                { return r }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}

// attrs returns the attributes of the i-th record as strings.
func (r *recorder) attrs(i int) map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := map[string]string{}
	r.recs[i].Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.String()
		return true
	})
	return m
}

func TestSlogObserverLevels(t *testing.T) {
	until := time.Now().Add(3 * time.Second)
	limitErr := &LimitError{Key: "api", Cost: 1, Reason: ReasonMaxWait, Wait: 2 * time.Second}
	tests := []struct {
		name  string
		call  func(Observer)
		level slog.Level
		msg   string
		attrs map[string]string
	}{
		{"wait", func(o Observer) { o.OnWait("api", 250*time.Millisecond) },
			slog.LevelDebug, "egress: waited for capacity", map[string]string{"key": "api", "waited": "250ms"}},
		{"refusal", func(o Observer) { o.OnReject("api", limitErr) },
			slog.LevelInfo, "egress: request refused", map[string]string{"key": "api", "reason": "max wait", "wait": "2s", "cost": "1"}},
		{"refusal in the priority queue", func(o Observer) {
			o.OnReject("api", &LimitError{Key: "api", Cost: 1, Reason: ReasonDeadline, Wait: time.Second,
				Class: Class{Priority: PriorityLow, Tenant: "acme"}, Queued: true})
		},
			slog.LevelInfo, "egress: request refused", map[string]string{"key": "api", "reason": "deadline", "wait": "1s", "cost": "1",
				"priority": "low", "tenant": "acme", "queued": "true"}},
		{"queued", func(o Observer) {
			o.OnQueued("api", Class{Priority: PriorityHigh, Tenant: "acme"}, 30*time.Millisecond)
		},
			slog.LevelDebug, "egress: waited for its turn", map[string]string{"key": "api", "priority": "high", "tenant": "acme", "waited": "30ms"}},
		{"refusal by the context", func(o Observer) { o.OnReject("api", context.Canceled) },
			slog.LevelInfo, "egress: request refused", map[string]string{"key": "api", "error": "context canceled"}},
		{"retry", func(o Observer) { o.OnRetry("api", 2, time.Second, 429, nil) },
			slog.LevelDebug, "egress: retrying", map[string]string{"key": "api", "attempt": "2", "delay": "1s", "status": "429"}},
		{"pause", func(o Observer) { o.OnCooldown("api", until, nil) },
			slog.LevelWarn, "egress: key paused by the provider", map[string]string{"key": "api"}},
		{"pause not shared", func(o Observer) { o.OnCooldown("api", until, errors.New("redis down")) },
			slog.LevelWarn, "egress: key paused by the provider", map[string]string{"key": "api", "error": "redis down"}},
		{"budget", func(o Observer) { o.OnBudgetExhausted("api") },
			slog.LevelWarn, "egress: retry budget exhausted, retry not made", map[string]string{"key": "api"}},
		{"rate", func(o Observer) { o.OnRateChange("api", PerSecond(30), PerSecond(20), "advertised") },
			slog.LevelInfo, "egress: rate changed", map[string]string{"key": "api", "old": "30/s", "new": "20/s", "why": "advertised"}},
		{"shadow wait", func(o Observer) { o.OnShadow("api", 300*time.Millisecond, nil) },
			slog.LevelDebug, "egress: shadow: would have waited", map[string]string{"key": "api", "wait": "300ms"}},
		{"shadow refusal", func(o Observer) { o.OnShadow("api", 2*time.Second, limitErr) },
			slog.LevelInfo, "egress: shadow: would have refused", map[string]string{"key": "api", "reason": "max wait", "wait": "2s"}},
		{"near limit", func(o Observer) {
			o.OnNearLimit("api", Quota{Dimension: Requests, Limit: 100, HasLimit: true, Remaining: 12, HasRemaining: true, Reset: 30 * time.Second})
		}, slog.LevelInfo, "egress: near the provider's limit", map[string]string{"key": "api", "dimension": "requests", "remaining": "12", "limit": "100", "reset": "30s"}},
		{"near limit without counts", func(o Observer) { o.OnNearLimit("api", Quota{}) },
			slog.LevelInfo, "egress: near the provider's limit", map[string]string{"key": "api"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// At its own level the hook logs once; one level above, not at all.
			h := &recorder{level: tt.level}
			tt.call(SlogObserver(slog.New(h)))
			require.Len(t, h.recs, 1)
			assert.Equal(t, tt.level, h.recs[0].Level)
			assert.Equal(t, tt.msg, h.recs[0].Message)
			got := h.attrs(0)
			for k, v := range tt.attrs {
				assert.Equal(t, v, got[k], "attribute %s", k)
			}

			above := &recorder{level: tt.level + 1}
			tt.call(SlogObserver(slog.New(above)))
			assert.Empty(t, above.recs)
		})
	}
}

func TestSlogObserverPauseSaysUntil(t *testing.T) {
	h := &recorder{level: slog.LevelDebug}
	until := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	SlogObserver(slog.New(h)).OnCooldown("api", until, nil)
	require.Len(t, h.recs, 1)
	assert.Equal(t, until.String(), h.attrs(0)["until"])
	assert.NotEmpty(t, h.attrs(0)["for"])
}

func TestSlogFallbackObserver(t *testing.T) {
	h := &recorder{level: slog.LevelWarn}
	f := SlogFallbackObserver(slog.New(h))
	f("payments", true, errors.New("dial tcp: connection refused"))
	f("payments", false, nil)
	require.Len(t, h.recs, 2)
	assert.Equal(t, "egress: shared limiter fell back to its local limiter", h.recs[0].Message)
	assert.Equal(t, map[string]string{"limiter": "payments", "error": "dial tcp: connection refused"}, h.attrs(0))
	assert.Equal(t, "egress: shared limiter back in shared mode", h.recs[1].Message)
	assert.Equal(t, slog.LevelWarn, h.recs[1].Level)

	off := &recorder{level: slog.LevelError}
	SlogFallbackObserver(slog.New(off))("payments", true, nil)
	assert.Empty(t, off.recs)
}

// A hook whose level is off allocates nothing: the Observer can stay
// installed at Info in production.
func TestSlogObserverAllocatesNothingWhenOff(t *testing.T) {
	o := SlogObserver(slog.New(&recorder{level: slog.LevelError}))
	fb := SlogFallbackObserver(slog.New(&recorder{level: slog.LevelError}))
	limitErr := error(&LimitError{Key: "api", Cost: 1, Reason: ReasonDeadline, Wait: time.Second})
	redisErr := errors.New("redis down")
	until := time.Now().Add(time.Second)
	hooks := map[string]func(){
		"OnWait":            func() { o.OnWait("api", time.Second) },
		"OnReject":          func() { o.OnReject("api", limitErr) },
		"OnRetry":           func() { o.OnRetry("api", 2, time.Second, 503, redisErr) },
		"OnCooldown":        func() { o.OnCooldown("api", until, redisErr) },
		"OnBudgetExhausted": func() { o.OnBudgetExhausted("api") },
		"OnRateChange":      func() { o.OnRateChange("api", PerSecond(30), PerSecond(20), "throttled") },
		"OnShadow":          func() { o.OnShadow("api", time.Second, limitErr) },
		"OnNearLimit":       func() { o.OnNearLimit("api", Quota{Limit: 10, HasLimit: true}) },
		"fallback":          func() { fb("payments", true, redisErr) },
	}
	for name, call := range hooks {
		if n := testing.AllocsPerRun(100, call); n != 0 {
			t.Errorf("%s: %v allocations per call with its level off, want 0", name, n)
		}
	}
}

func TestSlogObserverNilLoggerUsesDefault(t *testing.T) {
	h := &recorder{level: slog.LevelInfo}
	old := slog.Default()
	slog.SetDefault(slog.New(h))
	defer slog.SetDefault(old)
	SlogObserver(nil).OnBudgetExhausted("api")
	assert.Len(t, h.recs, 1)
}
