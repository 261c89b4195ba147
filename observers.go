package egress

import "time"

// Observer holds hooks for metrics and logs. A nil hook is skipped at no
// cost; the Transport allocates nothing to call them.
type Observer struct {
	// OnWait is called after a request waited for capacity, with how long.
	// Requests granted at once do not call it.
	OnWait func(key string, waited time.Duration)
	// OnReject is called when a request is refused without being sent; err
	// is the *LimitError (or other error) that RoundTrip returns.
	OnReject func(key string, err error)
	// OnSent is called when the base RoundTripper returns, with the attempt
	// number (1 for the first), the response status (0 when err != nil) and
	// the error.
	OnSent func(key string, attempt, status int, err error)
	// OnRetry is called before the Transport waits delay and sends attempt
	// again; status and err are what the previous attempt got.
	OnRetry func(key string, attempt int, delay time.Duration, status int, err error)
	// OnCooldown is called when a response holds key until the given time
	// (or holds it longer); err is the limiter's error while learning, if
	// any (a shared limiter that could not reach Redis).
	OnCooldown func(key string, until time.Time, err error)
	// OnBudgetExhausted is called when a retry is not made because the
	// retry budget is spent.
	OnBudgetExhausted func(key string)
	// OnShadow is called, in shadow mode only (WithShadow), for each
	// attempt sent that an enforcing Transport would not have sent at
	// once: err is nil when it would have waited for wait, and the
	// *LimitError (or the limiter's error) when it would have been
	// refused, with the wait it would have needed when known.
	OnShadow func(key string, wait time.Duration, err error)
	// OnNearLimit is called when a response reports key below the
	// near-limit ratio of one of its quotas (WithNearLimit, 20% by
	// default), with the quota reported; or warns without counts (Jira's
	// X-RateLimit-NearLimit), with a zero Quota. It is called once as the
	// key crosses below, and again only after a report above the ratio.
	OnNearLimit func(key string, q Quota)
	// OnRateChange is called when a response changes the rate key is held
	// to; why is "advertised" (the provider stated its limit), "throttled"
	// (discovery lowered it), "storm" (throttles thought to be about the
	// quota were not: the decreases they caused are undone) or "counted"
	// (a bucket's counts showed no room, or fell, as the rate climbed back:
	// it levels off at the refill they show, or at the rate of the last
	// count with room). Rates in between, as discovery climbs back, are
	// read with the limiter's EffectiveRate.
	OnRateChange func(key string, old, new Rate, why string)
	// OnQueued is called, with WithPriorities, after a request waited for
	// capacity, with its class and its whole wait: in its key's priority
	// queue, then for the limiter. OnWait is called too.
	OnQueued func(key string, c Class, waited time.Duration)
}

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
