package control

import (
	_ "embed"
	"time"
)

// Lua is control.lua: the fleet's controller, the rules of this package
// restated for Redis, where the shared limiters run them in one script
// with the rate's arithmetic (internal/lua composes it: Control). It
// reads the tuning constants from tune.lua, generated from this
// package's.
//
//go:embed control.lua
var Lua string

// RateLua is rate.lua: the pure functions the fleet's scripts share (the
// key's effective rate and its CUBIC climb, the turn, the rings of turns
// given and refused, the budget a report sets and what a bucket's counts
// drain), the arithmetic of this package's State restated for Redis,
// where internal/lua puts it before the reserve and control scripts.
//
//go:embed rate.lua
var RateLua string

// Response is what a key's controller reads of one response: the root
// package's Signal, with its most restrictive requests quota chosen and
// its throttle read (Signal.response). Every duration is relative to Now.
type Response struct {
	Now, SentAt time.Time
	// Status is the response's status code; 0 when the attempt failed
	// without a response.
	Status int
	// InFlight is how many other requests of the key were in flight when
	// the response was read: the provider's Remaining does not count them.
	InFlight      int
	RetryAfter    time.Duration
	HasRetryAfter bool
	Scope         Scope
	// Throttled: the response asks the caller to slow down (a 429, a 503
	// with a Retry-After, a response marked throttling); never a billing
	// error.
	Throttled bool
	// Counts: the response reported a quota, of any dimension.
	Counts bool
	// Advertised is the request limit the response states with its
	// window, in units per second; 0 when none.
	Advertised float64
	// Quota is its most restrictive requests quota (HasQuota); Implied:
	// its reset is the one its window implies.
	Quota    Quota
	HasQuota bool
	Implied  bool
}

// Quota is a provider's count of requests, as the controller reads it: the
// root package's Quota less its dimension and name.
type Quota struct {
	Limit        float64
	HasLimit     bool
	Remaining    float64
	HasRemaining bool
	Reset        time.Duration
	HasReset     bool
	Window       time.Duration
	HasWindow    bool
	// Kind says what Reset means, as the dialect says (ShapeUnknown when it
	// does not).
	Kind Shape
}

// Scope says whether a throttling response is about the caller's quota;
// the values are the root package's Scope's.
type Scope uint8

// The scopes of a throttling response.
const (
	ScopeUnknown Scope = iota
	ScopeQuota
	ScopeOther
	ScopeBilling
)

// NotAboutQuota reports whether a throttle (throttled) of scope sc is, by
// the provider's own word, not about the caller's quota: it says so
// (ScopeOther: a lock, a shared resource), or its count of requests has
// room (room) and it does not say the quota is the reason.
func NotAboutQuota(throttled bool, sc Scope, room bool) bool {
	return throttled && (sc == ScopeOther || (room && sc != ScopeQuota))
}

// notAboutQuota is NotAboutQuota of r and its quota q (when hasQ).
func (r *Response) notAboutQuota(q Quota, hasQ bool) bool {
	return NotAboutQuota(r.Throttled, r.Scope, hasQ && q.Remaining > 0)
}

// WindowStart narrows the reset a window implies (the root's
// Quota.impliedReset) from the window's counts: a count with the whole
// limit back but one answers the window's first request, so the window
// began when it was read at the latest, and ends a window after that. Only
// that window is narrowed: the next may begin at its first request after a
// pause, or at a request of another client (another instance of a fleet),
// which this one does not see. (Where the window rolls, or began before a
// first request sent mid-window, the end found is later than the real one:
// a hold until then is longer than it had to be, never shorter.) One start
// is kept a key: the quota the key is held to.
type WindowStart struct{ at time.Time }

// Narrow narrows q's reset, when its window implies it (implied), as of
// now, when q was read.
func (w *WindowStart) Narrow(q *Quota, implied bool, now time.Time) {
	if !implied || !q.HasLimit || !q.HasRemaining || q.Window <= 0 {
		return
	}
	if q.Remaining >= q.Limit-1 {
		w.at = now
	}
	if since := now.Sub(w.at); !w.at.IsZero() && since >= 0 && since < q.Window {
		q.Reset = min(q.Reset, q.Window-since)
	}
}
