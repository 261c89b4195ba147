package egressotel

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/egress-go/egress"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// TestClassMetrics: with priorities, waits are recorded by priority and
// tenant, refusals carrying a class are counted by class and reason, and
// tenants beyond the cap are recorded as OtherTenant.
func TestClassMetrics(t *testing.T) {
	m, r := newTest(t, WithMaxTenants(2))
	o := m.Observer()
	high := egress.Class{Priority: egress.PriorityHigh, Tenant: "acme"}
	o.OnQueued("api", high, 20*time.Millisecond)
	o.OnQueued("api", high, 30*time.Millisecond)
	o.OnQueued("api", egress.Class{Priority: egress.PriorityLow, Tenant: "beta"}, time.Second)
	o.OnQueued("api", egress.Class{Priority: egress.PriorityLow, Tenant: "gamma"}, time.Second)
	o.OnReject("api", fmt.Errorf("wrapped: %w", &egress.LimitError{Key: "api", Cost: 1, Reason: egress.ReasonDeadline,
		Class: egress.Class{Priority: egress.PriorityLow, Tenant: "beta"}, Queued: true}))
	o.OnReject("api", &egress.LimitError{Key: "api", Cost: 1, Reason: egress.ReasonMaxWait}) // no class: not counted by class
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
	want := map[string]float64{"egress.key=api,egress.priority=low,egress.reason=deadline,egress.tenant=beta": 1}
	if fmt.Sprint(refused) != fmt.Sprint(want) {
		t.Errorf("egress.priority.refused = %v, want %v", refused, want)
	}
	mp := sdkmetric.NewMeterProvider()
	defer mp.Shutdown(context.Background())
	if _, err := NewMetrics(mp, WithMaxTenants(0)); err == nil || !strings.Contains(err.Error(), "WithMaxTenants 0") {
		t.Errorf("NewMetrics(WithMaxTenants(0)) = %v, want an error naming the option", err)
	}
}
