package egressotel

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/egress-go/egress"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// newTest returns Metrics recording into a manual reader.
func newTest(t *testing.T, opts ...Option) (*Metrics, *sdkmetric.ManualReader) {
	t.Helper()
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	m, err := NewMetrics(mp, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m, r
}

// points are the data points of one collection: instrument name, then the
// attributes as "k=v,k=v" (sorted), then the value (a sum, a gauge, or a
// histogram's count).
type points map[string]map[string]float64

func collect(t *testing.T, r *sdkmetric.ManualReader) points {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	p := points{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			byAttrs := map[string]float64{}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					byAttrs[attrString(dp.Attributes)] = float64(dp.Value)
				}
			case metricdata.Gauge[float64]:
				for _, dp := range d.DataPoints {
					byAttrs[attrString(dp.Attributes)] = dp.Value
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					byAttrs[attrString(dp.Attributes)] = float64(dp.Count)
				}
			default:
				t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
			}
			p[m.Name] = byAttrs
		}
	}
	return p
}

func attrString(s attribute.Set) string {
	out := ""
	for _, kv := range s.ToSlice() {
		if out != "" {
			out += ","
		}
		out += string(kv.Key) + "=" + kv.Value.Emit()
	}
	return out
}

func TestObserverRecordsEachHook(t *testing.T) {
	m, r := newTest(t)
	o := m.Observer()
	o.OnWait("api", 200*time.Millisecond)
	o.OnSent("api", 1, 200, nil) // the waited one
	o.OnSent("api", 1, 429, nil) // sent at once
	o.OnSent("api", 2, 0, errors.New("connection reset"))
	o.OnReject("api", &egress.LimitError{Key: "api", Cost: 1, Reason: egress.ReasonMaxWait, Wait: time.Minute})
	o.OnReject("api", &egress.LimitError{Key: "api", Cost: 1, Reason: egress.ReasonQueueFull})
	o.OnReject("api", context.Canceled)
	o.OnRetry("api", 2, time.Second, 429, nil)
	o.OnRetry("api", 3, time.Second, 0, errors.New("reset"))
	o.OnCooldown("api", time.Now().Add(time.Second), nil)
	o.OnBudgetExhausted("api")
	o.OnRateChange("api", egress.PerSecond(30), egress.PerSecond(20), "advertised")
	o.OnReject("api", &egress.LimitError{Key: "api", Cost: 1, Reason: egress.ReasonInFlight, Wait: time.Second})
	o.OnShadow("api", time.Second, nil)
	o.OnShadow("api", 2*time.Second, &egress.LimitError{Key: "api", Cost: 1, Reason: egress.ReasonDeadline, Wait: 2 * time.Second})
	o.OnNearLimit("api", egress.Quota{})

	want := points{
		"egress.requests": {
			"egress.key=api,egress.result=waited":                           1,
			"egress.key=api,egress.result=sent":                             2,
			"egress.key=api,egress.reason=max_wait,egress.result=refused":   1,
			"egress.key=api,egress.reason=queue_full,egress.result=refused": 1,
			"egress.key=api,egress.reason=canceled,egress.result=refused":   1,
			"egress.key=api,egress.reason=in_flight,egress.result=refused":  1,
		},
		"egress.attempts": {
			"egress.key=api,http.response.status_code=200": 1,
			"egress.key=api,http.response.status_code=429": 1,
			"egress.key=api,error.type=transport":          1,
		},
		"egress.wait.duration":          {"egress.key=api": 1},
		"egress.retries":                {"egress.key=api,egress.retry.cause=throttled": 1, "egress.key=api,egress.retry.cause=transport": 1},
		"egress.pauses":                 {"egress.key=api": 1},
		"egress.retry_budget.exhausted": {"egress.key=api": 1},
		"egress.rate.changes":           {"egress.key=api,egress.rate.why=advertised": 1},
		"egress.shadow.decisions": {
			"egress.key=api,egress.result=waited":                         1,
			"egress.key=api,egress.reason=deadline,egress.result=refused": 1,
		},
		"egress.near_limit": {"egress.key=api": 1},
	}
	got := collect(t, r)
	for name, series := range want {
		for attrs, v := range series {
			if got[name][attrs] != v {
				t.Errorf("%s{%s} = %v, want %v (all: %v)", name, attrs, got[name][attrs], v, got[name])
			}
		}
		if len(got[name]) != len(series) {
			t.Errorf("%s: series %v, want %v", name, got[name], series)
		}
	}
}

func TestKeyGuard(t *testing.T) {
	tests := []struct {
		name string
		opts []Option
		keys []string
		want map[string]float64 // egress.pauses by key attribute
	}{
		{"cap", []Option{WithMaxKeys(2)}, []string{"a", "b", "req-1", "req-2", "a"},
			map[string]float64{"egress.key=a": 2, "egress.key=b": 1, "egress.key=other": 2}},
		{"allow-list", []Option{WithKeys("b")}, []string{"a", "b", "req-1"},
			map[string]float64{"egress.key=b": 1, "egress.key=other": 2}},
		{"allow-list under a cap", []Option{WithKeys("a", "b"), WithMaxKeys(1)}, []string{"a", "b"},
			map[string]float64{"egress.key=a": 1, "egress.key=other": 1}},
		{"a request ID as the key", nil, ids(1000),
			map[string]float64{"egress.key=other": 900}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, r := newTest(t, tt.opts...)
			o := m.Observer()
			for _, k := range tt.keys {
				o.OnCooldown(k, time.Time{}, nil)
			}
			got := collect(t, r)["egress.pauses"]
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("%s = %v, want %v", k, got[k], v)
				}
			}
			if tt.name == "a request ID as the key" && len(got) != defaultMaxKeys+1 {
				t.Errorf("%d series, want the cap %d and other", len(got), defaultMaxKeys)
			}
		})
	}
}

func ids(n int) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = fmt.Sprintf("req-%d", i)
	}
	return s
}

func TestOptionsAreChecked(t *testing.T) {
	mp := sdkmetric.NewMeterProvider()
	defer mp.Shutdown(context.Background())
	for name, opts := range map[string][]Option{
		"WithMaxKeys(0)": {WithMaxKeys(0)},
		"WithKeys()":     {WithKeys()},
		"WithKeyFunc":    {WithKeyFunc(nil)},
		"nil":            {nil},
	} {
		if _, err := NewMetrics(mp, opts...); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := NewMetrics(nil); err == nil {
		t.Error("nil MeterProvider: no error")
	}
}

// A Transport wired through Limiter, InFlight, Observer and ObserveRates
// against a provider that reports its quota.
func TestTransportThroughMetrics(t *testing.T) {
	var inside int64
	var m *Metrics
	var r *sdkmetric.ManualReader
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		// While the request is in the handler it is in flight.
		inside = int64(collect(t, r)["egress.requests.in_flight"]["egress.key=api"])
		w.Header().Set("X-RateLimit-Limit", "100")
		w.Header().Set("X-RateLimit-Remaining", "42")
	}))
	defer srv.Close()
	key := func(*http.Request) string { return "api" }
	m, r = newTest(t, WithKeyFunc(key))
	lim, err := egress.NewTokenBucket(egress.PerSecond(1000), 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ObserveRates("local", lim); err != nil {
		t.Fatal(err)
	}
	tr, err := egress.New(m.InFlight(srv.Client().Transport),
		egress.WithLimiter(m.Limiter(lim)), egress.WithKeyFunc(key), egress.WithObserver(m.Observer()))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Limiter(lim).(egress.Learner); !ok {
		t.Fatal("the Limiter of a Learner is not a Learner")
	}
	c := &http.Client{Transport: tr}
	for range 3 {
		resp, err := c.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	got := collect(t, r)
	checks := []struct {
		name, attrs string
		want        float64
	}{
		{"egress.requests", "egress.key=api,egress.result=sent", 3},
		{"egress.attempts", "egress.key=api,http.response.status_code=200", 3},
		{"egress.requests.waiting", "egress.key=api", 0},
		{"egress.requests.in_flight", "egress.key=api", 0},
		{"egress.provider.remaining", "egress.key=api,egress.quota.dimension=requests", 42},
		{"egress.provider.limit", "egress.key=api,egress.quota.dimension=requests", 100},
		{"egress.rate.effective", "egress.key=api,egress.limiter=local", 1000},
	}
	for _, c := range checks {
		if v, ok := got[c.name][c.attrs]; !ok || v != c.want {
			t.Errorf("%s{%s} = %v (present %v), want %v; all %v", c.name, c.attrs, v, ok, c.want, got[c.name])
		}
	}
	if inside != 1 {
		t.Errorf("in flight while in the handler = %d, want 1", inside)
	}
}

type stats struct{ s egress.SharedStats }

func (s stats) Stats() egress.SharedStats { return s.s }

func TestObserveShared(t *testing.T) {
	m, r := newTest(t)
	if err := m.ObserveShared("payments", stats{egress.SharedStats{Fallback: true, LiveInstances: 4}}); err != nil {
		t.Fatal(err)
	}
	if err := m.ObserveShared("", nil); err == nil {
		t.Error("no error for a nil limiter")
	}
	m.FallbackObserver()("payments", true, errors.New("redis down"))
	got := collect(t, r)
	if v := got["egress.fallback.active"]["egress.limiter=payments"]; v != 1 {
		t.Errorf("egress.fallback.active = %v, want 1", v)
	}
	if v := got["egress.fleet.instances"]["egress.limiter=payments"]; v != 4 {
		t.Errorf("egress.fleet.instances = %v, want 4", v)
	}
	if v := got["egress.fallback.switches"]["egress.fallback.active=true,egress.limiter=payments"]; v != 1 {
		t.Errorf("egress.fallback.switches = %v, want 1; all %v", v, got["egress.fallback.switches"])
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := collect(t, r)["egress.fallback.active"]; ok {
		t.Error("the gauges still report after Close")
	}
}

// The hooks called for every request allocate nothing once the key's
// series exists.
func TestObserverHotPathAllocations(t *testing.T) {
	m, _ := newTest(t)
	o := m.Observer()
	o.OnSent("api", 1, 200, nil)
	n := testing.AllocsPerRun(100, func() {
		o.OnWait("api", time.Millisecond)
		o.OnSent("api", 1, 200, nil)
	})
	if n > 0 {
		t.Errorf("%v allocations per request, want 0", n)
	}
}
