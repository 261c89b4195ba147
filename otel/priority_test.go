package egressotel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/egress-go/egress"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// TestClassMetrics: with priorities, waits are recorded by priority and
// tenant, refusals are counted by class and reason (the default class's
// too; a Transport without priorities counts none), and tenants beyond the
// cap are recorded as OtherTenant.
func TestClassMetrics(t *testing.T) {
	m, r := newTest(t, WithMaxTenants(2))
	o := m.Observer()
	high := egress.Class{Priority: egress.PriorityHigh, Tenant: "acme"}
	o.OnQueued("api", high, 20*time.Millisecond)
	o.OnQueued("api", high, 30*time.Millisecond)
	o.OnQueued("api", egress.Class{Priority: egress.PriorityLow, Tenant: "beta"}, time.Second)
	o.OnQueued("api", egress.Class{Priority: egress.PriorityLow, Tenant: "gamma"}, time.Second)
	// Refusals: by a Transport with priorities, of a class and of the
	// default class; by one without (not counted by class).
	refuse := func(prio bool, c *egress.Class) {
		t.Helper()
		tb, err := egress.NewTokenBucket(egress.PerSecond(1), 1)
		if err != nil {
			t.Fatal(err)
		}
		opts := []egress.Option{egress.WithLimiter(tb), egress.WithMaxWait(time.Millisecond), egress.WithObserver(o)}
		if prio {
			opts = append(opts, egress.WithPriorities(egress.Priorities{}))
		}
		tr, err := egress.New(okBase{}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2 { // the burst, then a refusal
			ctx := context.Background()
			if c != nil {
				ctx = egress.WithClass(ctx, *c)
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://api/", nil)
			resp, err := tr.RoundTrip(req)
			if i == 0 && err == nil {
				resp.Body.Close()
			}
			if i == 1 && !errors.Is(err, egress.ErrRateLimited) {
				t.Fatalf("want a refusal, got %v", err)
			}
		}
	}
	refuse(true, &egress.Class{Priority: egress.PriorityLow, Tenant: "beta"})
	refuse(true, nil)
	refuse(false, &egress.Class{Priority: egress.PriorityLow, Tenant: "beta"})
	o.OnReject("api", context.Canceled)

	p := collect(t, r)
	waits := p["egress.priority.wait.duration"]
	if got := waits["egress.key=api,egress.priority=high,egress.tenant=acme"]; got != 2 {
		t.Errorf("high/acme waits = %v, want 2 (all: %v)", got, waits)
	}
	if got := waits["egress.key=api,egress.priority=low,egress.tenant=other"]; got != 1 {
		t.Errorf("the third tenant is not recorded as other: %v", waits)
	}
	refused := p["egress.priority.refused"]
	want := map[string]float64{
		"egress.key=api,egress.priority=low,egress.reason=max_wait,egress.tenant=beta":     1,
		"egress.key=api,egress.priority=normal,egress.reason=max_wait,egress.tenant=other": 1, // "", the third tenant
	}
	if fmt.Sprint(refused) != fmt.Sprint(want) {
		t.Errorf("egress.priority.refused = %v, want %v", refused, want)
	}
	mp := sdkmetric.NewMeterProvider()
	defer mp.Shutdown(context.Background())
	if _, err := NewMetrics(mp, WithMaxTenants(0)); err == nil || !strings.Contains(err.Error(), "WithMaxTenants 0") {
		t.Errorf("NewMetrics(WithMaxTenants(0)) = %v, want an error naming the option", err)
	}
}

// okBase answers every request 200.
type okBase struct{}

func (okBase) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("")), Request: req}, nil
}
