package egress

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// SlogObserver returns an Observer that logs through l what a Transport
// does that an operator may want to read:
//
//   - Warn: a key paused by a response (OnCooldown: a 429's Retry-After or
//     an exhausted quota; the fleet's requests of the key wait until then)
//     and a retry given up because the retry budget is spent;
//   - Info: a request refused without being sent (OnReject), a key's rate
//     changed by what the provider said (OnRateChange), a key near its
//     limit (OnNearLimit), and in shadow mode a request that would have
//     been refused (OnShadow);
//   - Debug: a request that waited for capacity (OnWait, and OnQueued
//     with its priority and tenant under WithPriorities), a retry about to
//     be made (OnRetry), and in shadow mode a request that would have
//     waited.
//
// Each record carries the key as "key", and the facts of its hook (the
// wait, the refusal's reason, the pause's end, ...). A hook whose level l
// does not enable returns at once and allocates nothing, so the Observer
// may stay installed in production at Info. OnSent is not set: a line per
// request is for a tracer, not a log. A nil l logs to slog.Default() as it
// is when SlogObserver is called. The Observer is safe for concurrent use
// when l's handler is, as slog's handlers are.
//
// Pair it with SlogFallbackObserver for a shared limiter's switches to its
// local fallback, and with other observers through Observers.
func SlogObserver(l *slog.Logger) Observer {
	if l == nil {
		l = slog.Default()
	}
	ctx := context.Background()
	return Observer{
		OnWait: func(key string, waited time.Duration) {
			if !l.Enabled(ctx, slog.LevelDebug) {
				return
			}
			l.LogAttrs(ctx, slog.LevelDebug, "egress: waited for capacity",
				slog.String("key", key), slog.Duration("waited", waited))
		},
		OnReject: func(key string, err error) { slogReject(ctx, l, key, err) },
		OnRetry: func(key string, attempt int, delay time.Duration, status int, err error) {
			if !l.Enabled(ctx, slog.LevelDebug) {
				return
			}
			attrs := []slog.Attr{slog.String("key", key), slog.Int("attempt", attempt),
				slog.Duration("delay", delay), slog.Int("status", status)}
			if err != nil {
				attrs = append(attrs, slog.String("error", err.Error()))
			}
			l.LogAttrs(ctx, slog.LevelDebug, "egress: retrying", attrs...)
		},
		OnCooldown: func(key string, until time.Time, err error) {
			if !l.Enabled(ctx, slog.LevelWarn) {
				return
			}
			attrs := []slog.Attr{slog.String("key", key), slog.Time("until", until),
				slog.Duration("for", time.Until(until).Round(time.Millisecond))}
			if err != nil {
				attrs = append(attrs, slog.String("error", err.Error()))
			}
			l.LogAttrs(ctx, slog.LevelWarn, "egress: key paused by the provider", attrs...)
		},
		OnBudgetExhausted: func(key string) {
			if !l.Enabled(ctx, slog.LevelWarn) {
				return
			}
			l.LogAttrs(ctx, slog.LevelWarn, "egress: retry budget exhausted, retry not made",
				slog.String("key", key))
		},
		OnShadow:    func(key string, wait time.Duration, err error) { slogShadow(ctx, l, key, wait, err) },
		OnNearLimit: func(key string, q Quota) { slogNearLimit(ctx, l, key, q) },
		OnQueued:    func(key string, c Class, waited time.Duration) { slogQueued(ctx, l, key, c, waited) },
		OnRateChange: func(key string, old, new Rate, why string) {
			if !l.Enabled(ctx, slog.LevelInfo) {
				return
			}
			l.LogAttrs(ctx, slog.LevelInfo, "egress: rate changed",
				slog.String("key", key), slog.String("old", old.String()),
				slog.String("new", new.String()), slog.String("why", why))
		},
	}
}

// slogReject is SlogObserver's OnReject: it logs at Info a request refused
// without being sent, with the refusal's reason, wait and cost when err is
// a *LimitError, else with the error.
func slogReject(ctx context.Context, l *slog.Logger, key string, err error) {
	if !l.Enabled(ctx, slog.LevelInfo) {
		return
	}
	var le *LimitError
	if errors.As(err, &le) {
		attrs := []slog.Attr{slog.String("key", key), slog.String("reason", le.Reason.String()),
			slog.Duration("wait", le.Wait), slog.Int("cost", le.Cost)}
		if le.Queued || le.Class != (Class{}) {
			attrs = append(attrs, slog.String("priority", le.Class.Priority.String()),
				slog.String("tenant", le.Class.Tenant), slog.Bool("queued", le.Queued))
		}
		l.LogAttrs(ctx, slog.LevelInfo, "egress: request refused", attrs...)
		return
	}
	l.LogAttrs(ctx, slog.LevelInfo, "egress: request refused",
		slog.String("key", key), slog.String("error", err.Error()))
}

// slogQueued is SlogObserver's OnQueued: it logs at Debug a request that
// waited in its key's priority queue, with its priority and tenant.
func slogQueued(ctx context.Context, l *slog.Logger, key string, c Class, waited time.Duration) {
	if !l.Enabled(ctx, slog.LevelDebug) {
		return
	}
	l.LogAttrs(ctx, slog.LevelDebug, "egress: waited for its turn",
		slog.String("key", key), slog.String("priority", c.Priority.String()),
		slog.String("tenant", c.Tenant), slog.Duration("waited", waited))
}

// slogShadow is SlogObserver's OnShadow: it logs at Debug a request that
// shadow mode would have made wait, and at Info one it would have refused,
// with the refusal's reason and wait when err is a *LimitError, else with
// the error.
func slogShadow(ctx context.Context, l *slog.Logger, key string, wait time.Duration, err error) {
	level := slog.LevelDebug
	if err != nil {
		level = slog.LevelInfo
	}
	if !l.Enabled(ctx, level) {
		return
	}
	if err == nil {
		l.LogAttrs(ctx, level, "egress: shadow: would have waited",
			slog.String("key", key), slog.Duration("wait", wait))
		return
	}
	var le *LimitError
	if errors.As(err, &le) {
		l.LogAttrs(ctx, level, "egress: shadow: would have refused",
			slog.String("key", key), slog.String("reason", le.Reason.String()),
			slog.Duration("wait", le.Wait))
		return
	}
	l.LogAttrs(ctx, level, "egress: shadow: would have refused",
		slog.String("key", key), slog.String("error", err.Error()))
}

// slogNearLimit is SlogObserver's OnNearLimit: it logs at Info a key near
// its provider's limit, with the quota's dimension, remaining, limit and
// reset when the provider told its limit.
func slogNearLimit(ctx context.Context, l *slog.Logger, key string, q Quota) {
	if !l.Enabled(ctx, slog.LevelInfo) {
		return
	}
	if !q.HasLimit {
		l.LogAttrs(ctx, slog.LevelInfo, "egress: near the provider's limit", slog.String("key", key))
		return
	}
	l.LogAttrs(ctx, slog.LevelInfo, "egress: near the provider's limit",
		slog.String("key", key), slog.String("dimension", q.Dimension.String()),
		slog.Float64("remaining", q.Remaining), slog.Float64("limit", q.Limit),
		slog.Duration("reset", q.Reset))
}

// SlogFallbackObserver returns a hook for WithFallbackObserver that logs at
// Warn, through l, each switch of a shared limiter to its local fallback
// (with the Redis error) and back to shared mode. A nil l logs to
// slog.Default() as it is when SlogFallbackObserver is called. When Warn is
// not enabled the hook returns at once and allocates nothing.
func SlogFallbackObserver(l *slog.Logger) func(name string, active bool, err error) {
	if l == nil {
		l = slog.Default()
	}
	ctx := context.Background()
	return func(name string, active bool, err error) {
		if !l.Enabled(ctx, slog.LevelWarn) {
			return
		}
		if !active {
			l.LogAttrs(ctx, slog.LevelWarn, "egress: shared limiter back in shared mode",
				slog.String("limiter", name))
			return
		}
		msg := "egress: shared limiter fell back to its local limiter"
		if err == nil {
			l.LogAttrs(ctx, slog.LevelWarn, msg, slog.String("limiter", name))
			return
		}
		l.LogAttrs(ctx, slog.LevelWarn, msg, slog.String("limiter", name), slog.String("error", err.Error()))
	}
}
