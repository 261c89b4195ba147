package egress

import "time"

// Observers returns an Observer that calls the hooks of each of o in turn,
// in the order given: metrics and logs from one Transport, for instance
//
//	egress.WithObserver(egress.Observers(metrics.Observer(), egress.SlogObserver(logger)))
//
// A hook that none of o sets stays nil (the Transport skips it at no cost);
// a hook that only one of o sets is that hook itself. Calling a combined
// hook allocates nothing beyond what the hooks it calls allocate. The result
// is as safe for concurrent use as those hooks.
func Observers(o ...Observer) Observer {
	var hs observerHooks
	for _, o := range o {
		hs.wait = appendHook(hs.wait, o.OnWait, o.OnWait != nil)
		hs.reject = appendHook(hs.reject, o.OnReject, o.OnReject != nil)
		hs.sent = appendHook(hs.sent, o.OnSent, o.OnSent != nil)
		hs.retry = appendHook(hs.retry, o.OnRetry, o.OnRetry != nil)
		hs.cooldown = appendHook(hs.cooldown, o.OnCooldown, o.OnCooldown != nil)
		hs.exhausted = appendHook(hs.exhausted, o.OnBudgetExhausted, o.OnBudgetExhausted != nil)
		hs.rate = appendHook(hs.rate, o.OnRateChange, o.OnRateChange != nil)
		hs.shadow = appendHook(hs.shadow, o.OnShadow, o.OnShadow != nil)
		hs.near = appendHook(hs.near, o.OnNearLimit, o.OnNearLimit != nil)
		hs.queued = appendHook(hs.queued, o.OnQueued, o.OnQueued != nil)
	}
	return hs.observer()
}

// observerHooks is the hooks set by the Observers that Observers combines,
// one list per hook, in the order given.
type observerHooks struct {
	wait      []func(string, time.Duration)
	reject    []func(string, error)
	sent      []func(string, int, int, error)
	retry     []func(string, int, time.Duration, int, error)
	cooldown  []func(string, time.Time, error)
	exhausted []func(string)
	rate      []func(string, Rate, Rate, string)
	shadow    []func(string, time.Duration, error)
	near      []func(string, Quota)
	queued    []func(string, Class, time.Duration)
}

// observer returns the Observer whose each hook is the combination of its
// list in hs (see combine): nil, the one hook, or one that calls each in
// turn.
func (hs *observerHooks) observer() Observer {
	return Observer{
		OnWait: combine(hs.wait, func(key string, waited time.Duration) {
			for _, h := range hs.wait {
				h(key, waited)
			}
		}),
		OnReject: combine(hs.reject, func(key string, err error) {
			for _, h := range hs.reject {
				h(key, err)
			}
		}),
		OnSent: combine(hs.sent, func(key string, attempt, status int, err error) {
			for _, h := range hs.sent {
				h(key, attempt, status, err)
			}
		}),
		OnRetry: combine(hs.retry, func(key string, attempt int, delay time.Duration, status int, err error) {
			for _, h := range hs.retry {
				h(key, attempt, delay, status, err)
			}
		}),
		OnCooldown: combine(hs.cooldown, func(key string, until time.Time, err error) {
			for _, h := range hs.cooldown {
				h(key, until, err)
			}
		}),
		OnBudgetExhausted: combine(hs.exhausted, func(key string) {
			for _, h := range hs.exhausted {
				h(key)
			}
		}),
		OnRateChange: combine(hs.rate, func(key string, old, new Rate, why string) {
			for _, h := range hs.rate {
				h(key, old, new, why)
			}
		}),
		OnShadow: combine(hs.shadow, func(key string, wait time.Duration, err error) {
			for _, h := range hs.shadow {
				h(key, wait, err)
			}
		}),
		OnNearLimit: combine(hs.near, func(key string, q Quota) {
			for _, h := range hs.near {
				h(key, q)
			}
		}),
		OnQueued: combine(hs.queued, func(key string, c Class, waited time.Duration) {
			for _, h := range hs.queued {
				h(key, c, waited)
			}
		}),
	}
}

// appendHook appends h to hs when it is set.
func appendHook[F any](hs []F, h F, set bool) []F {
	if !set {
		return hs
	}
	return append(hs, h)
}

// combine returns the zero hook (nil) for no hooks, the one hook itself, or
// all, which calls each of hs in turn.
func combine[F any](hs []F, all F) F {
	switch len(hs) {
	case 0:
		var none F
		return none
	case 1:
		return hs[0]
	}
	return all
}
