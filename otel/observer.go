package egressotel

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/egress-go/egress"
	"go.opentelemetry.io/otel/attribute"
)

// Observer returns the hooks that record the Transport's events:
//
//   - egress.requests: result "sent" (passed the limiter at once), "waited"
//     (passed it after a wait) or "refused" (not sent; egress.reason says
//     why). Every attempt passes the limiter, a retry too, so sent + waited
//     counts the attempts the provider received.
//   - egress.attempts: each attempt's response status code, or error.type
//     "transport" when none came;
//   - egress.wait.duration: the wait of the attempts that waited;
//   - egress.retries by cause, egress.retry_budget.exhausted, egress.pauses,
//     egress.rate.changes by why;
//   - egress.shadow.decisions (shadow mode only): result "waited" or
//     "refused" (with egress.reason), what enforcing would have done;
//   - egress.near_limit: a key crossing below the near-limit ratio;
//   - with egress.WithPriorities, egress.priority.wait.duration (OnQueued)
//     and egress.priority.refused, by egress.priority and egress.tenant
//     (the first tenants seen, up to WithMaxTenants; OtherTenant beyond).
//
// Give it to egress.WithObserver, alone or through egress.Observers. The
// hooks are safe for concurrent use; the ones called for every request
// (OnWait, OnSent) allocate nothing once the key's series exists.
func (m *Metrics) Observer() egress.Observer {
	ctx := context.Background()
	return egress.Observer{
		OnWait: func(key string, waited time.Duration) {
			s := m.guard.series(key)
			s.waits.Add(1)
			m.wait.Record(ctx, waited.Seconds(), s.record...)
		},
		OnSent: func(key string, _, status int, err error) {
			s := m.guard.series(key)
			if s.takeWait() {
				m.requests.Add(ctx, 1, s.waited...)
			} else {
				m.requests.Add(ctx, 1, s.sent...)
			}
			if err != nil || status == 0 {
				m.attempts.Add(ctx, 1, s.with(attrErrorType.String("transport"), attribute.KeyValue{})...)
				return
			}
			m.attempts.Add(ctx, 1, s.with(attrStatus.Int(status), attribute.KeyValue{})...)
		},
		OnReject: func(key string, err error) {
			why := reason(err)
			m.requests.Add(ctx, 1, m.guard.series(key).with(attrResult.String("refused"), attrReason.String(why))...)
			m.onClassRefused(key, err, why)
		},
		OnQueued: func(key string, c egress.Class, waited time.Duration) {
			m.onQueued(key, c, waited.Seconds())
		},
		OnRetry: func(key string, _ int, _ time.Duration, status int, err error) {
			m.retries.Add(ctx, 1, m.guard.series(key).with(attrCause.String(cause(status, err)), attribute.KeyValue{})...)
		},
		OnCooldown: func(key string, _ time.Time, _ error) {
			m.pauses.Add(ctx, 1, m.guard.series(key).add...)
		},
		OnBudgetExhausted: func(key string) {
			m.exhausted.Add(ctx, 1, m.guard.series(key).add...)
		},
		OnRateChange: func(key string, _, _ egress.Rate, why string) {
			m.changes.Add(ctx, 1, m.guard.series(key).with(attrWhy.String(why), attribute.KeyValue{})...)
		},
		OnShadow: func(key string, _ time.Duration, err error) {
			if err == nil {
				m.shadow.Add(ctx, 1, m.guard.series(key).with(attrResult.String("waited"), attribute.KeyValue{})...)
				return
			}
			m.shadow.Add(ctx, 1, m.guard.series(key).with(attrResult.String("refused"), attrReason.String(reason(err)))...)
		},
		OnNearLimit: func(key string, _ egress.Quota) {
			m.near.Add(ctx, 1, m.guard.series(key).add...)
		},
	}
}

// reason names why a request was refused, in the attribute's words.
func reason(err error) string {
	var le *egress.LimitError
	switch {
	case errors.As(err, &le):
		switch le.Reason {
		case egress.ReasonDeadline:
			return "deadline"
		case egress.ReasonMaxWait:
			return "max_wait"
		case egress.ReasonQueueFull:
			return "queue_full"
		case egress.ReasonCostTooHigh:
			return "cost_too_high"
		case egress.ReasonInFlight:
			return "in_flight"
		}
		return "reason_" + strconv.Itoa(int(le.Reason))
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	case errors.Is(err, egress.ErrSharedUnavailable):
		return "shared_unavailable"
	}
	return "error"
}

// cause names why an attempt is retried.
func cause(status int, err error) string {
	switch {
	case err != nil || status == 0:
		return "transport"
	case status == 429:
		return "throttled"
	case status == 503:
		return "unavailable"
	case status >= 500:
		return "server_error"
	}
	return "status_" + strconv.Itoa(status)
}
