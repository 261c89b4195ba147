package egress

import (
	"net/http"
	"time"

	"github.com/egress-go/egress/internal/control"
	"github.com/egress-go/egress/internal/dialect"
)

// Signal is what one response said about its key's limit, whatever dialect
// the provider speaks: the Transport reads it (see SignalReader) and hands
// it to the key's controller, which decides what the key does next (see
// Learner). Every duration is relative to Now and never negative; a field
// whose Has flag is false was not sent, or could not be read, and is zero.
type Signal struct {
	// Now is when the response was read.
	Now time.Time
	// SentAt is when the request that got the response was sent.
	SentAt time.Time
	// Status is the response's status code; 0 when the attempt failed
	// without a response.
	Status int
	// InFlight is how many other requests of the key the Transport had
	// sent and had no response to when this response was read. The
	// provider's Remaining does not count them yet: they will spend it.
	// (A shared limiter's fleet has more in flight than one Transport
	// sees.)
	InFlight int
	// Host is the host the request was sent to (its URL's host, with any
	// port); per-host settings such as WithResetUnit match it.
	Host string
	// MaxWait caps RetryAfter and every Quota's Reset: the Transport's
	// caps, the larger of WithMaxPause and WithMaxQuotaHold (it then holds
	// RetryAfter to WithMaxPause itself). Zero or negative: no cap.
	MaxWait time.Duration

	// RetryAfter is the wait the provider asked for (Retry-After,
	// retry-after-ms, a body's retry delay), capped by the Transport's
	// pause cap.
	RetryAfter    time.Duration
	HasRetryAfter bool
	// RetryAfterTooLong says the provider asked for longer than the cap.
	RetryAfterTooLong bool

	// Quotas are the provider's counts, one a dimension and window it
	// reported (requests per second and per day, tokens per minute, ...).
	Quotas []Quota

	// Scope says whether a throttling response is about the caller's quota.
	Scope Scope
	// Retry is the provider's own word on whether to retry (x-should-retry,
	// Stripe-Should-Retry; a billing error says RetryNo); RetryDefault when
	// it says nothing.
	Retry RetryDecision

	// Throttling says the response refuses the request for its rate even
	// though its status is neither 429 nor 503: GitHub answers an exhausted
	// primary limit with 403 and x-ratelimit-remaining: 0, and a secondary
	// limit with 403 and Retry-After. The built-in reading sets it for a 403
	// that carries a Retry-After or a requests quota with nothing remaining
	// (and then sets Scope to ScopeQuota when it is unknown).
	Throttling bool
	// NearLimit says the provider warned that the caller is close to its
	// limit without giving counts (Jira's X-RateLimit-NearLimit: true).
	NearLimit bool
	// Reason is the provider's own word for why it throttles, as sent
	// (Stripe-Rate-Limited-Reason, Jira's RateLimit-Reason); may be empty.
	Reason string

	// cfg holds the per-host settings while the readers run; readSignal
	// clears it before it returns the Signal.
	cfg *signalConfig
	// asked is RetryAfter before the Transport's pause cap (WithMaxPause):
	// the real wait, for a request given up because it asked for longer.
	asked time.Duration
}

// Quota is one limit a provider reported in a response.
type Quota struct {
	// Dimension is what the quota counts.
	Dimension Dimension
	// Name is the provider's name for the limit, when it gives one (a
	// policy name, GitHub's resource, Discord's bucket); may be empty.
	Name string

	Limit        float64 // the quota of the window; >= 0
	HasLimit     bool
	Remaining    float64 // units left now; >= 0
	HasRemaining bool
	// Reset is the time from Now until the quota comes back: the end of
	// the window (a window server) or until the bucket is full again (a
	// bucket server); see ResetKind.
	Reset    time.Duration
	HasReset bool
	// Window is the length of the window Limit counts over, when the
	// headers or the provider's documentation state it (HubSpot's
	// "secondly", Salesforce's rolling day, Shopify's 20-second bucket).
	Window    time.Duration
	HasWindow bool
	// Used is how much of Limit was spent, when the provider says so
	// (GitHub's x-ratelimit-used, Shopify's "32/40"); >= 0.
	Used    float64
	HasUsed bool
	// Kind says what Reset means; ResetKindUnknown when the dialect does
	// not say (read it as a window's end: the cautious reading).
	Kind ResetKind
}

// ResetKind says what a Quota's Reset means.
type ResetKind uint8

// The meanings of a reset.
const (
	// ResetKindUnknown: the provider does not say.
	ResetKindUnknown ResetKind = iota
	// ResetKindWindow: the quota comes back whole at Reset (a window server:
	// GitHub, X, Discord, Reddit); with nothing remaining, every request
	// before then is refused.
	ResetKindWindow
	// ResetKindBucket: Reset is when the bucket is full again (a bucket
	// server: OpenAI, Anthropic, Shopify); with nothing remaining, the next
	// unit comes back long before Reset.
	ResetKindBucket
)

// Dimension is what a quota counts.
type Dimension uint8

// The dimensions providers report.
const (
	Requests     Dimension = iota // requests (the default)
	Tokens                        // tokens, input and output together
	InputTokens                   // input (prompt) tokens
	OutputTokens                  // output (completion) tokens
	// Points are a query's calculated cost (Shopify GraphQL's cost points).
	Points
)

// String returns the dimension's name.
func (d Dimension) String() string {
	switch d {
	case Requests:
		return "requests"
	case Tokens:
		return "tokens"
	case InputTokens:
		return "input-tokens"
	case OutputTokens:
		return "output-tokens"
	case Points:
		return "points"
	}
	return "dimension(?)"
}

// Scope says what a throttling response is about.
type Scope uint8

// The scopes of a throttling response.
const (
	// ScopeUnknown: the response does not say; egress reads its quotas.
	ScopeUnknown Scope = iota
	// ScopeQuota: the caller's own quota is exhausted.
	ScopeQuota
	// ScopeOther: throttled for a reason other than the caller's rate (a
	// lock, a shared resource, load shedding): only this request waits.
	ScopeOther
	// ScopeBilling: a billing or quota-of-account error dressed as a
	// throttle (OpenAI's insufficient_quota): never a hold, never retried.
	ScopeBilling
)

// requestQuota returns the most restrictive quota of the requests
// dimension: the one with the least remaining (on a tie, the later reset:
// both must come back), and ok false when the signal has none with a
// remaining count. Two reports of the same limit and remaining are one
// limit sent twice, in two families (Jira's Beta-RateLimit, whose reset is
// in seconds, and its X-RateLimit-Reset, in whole minutes): the finer
// wins, the one that states its window, else the earlier reset (both are
// rounded up from the same end). A reset its window implies counts as
// stated (Quota.impliedReset); implied says the one returned is such.
func (s *Signal) requestQuota() (q Quota, implied, ok bool) {
	for _, c := range s.Quotas {
		if c.Dimension != Requests || !c.HasRemaining {
			continue
		}
		c, imp := c.impliedReset(s.maxWait())
		if !ok || c.Remaining < q.Remaining {
			q, implied, ok = c, imp, true
			continue
		}
		if c.Remaining != q.Remaining {
			continue
		}
		if c.HasLimit && q.HasLimit && c.Limit == q.Limit && c.HasReset && q.HasReset {
			if c.HasWindow != q.HasWindow {
				if c.HasWindow {
					q, implied = c, imp
				}
			} else if c.Reset < q.Reset {
				q, implied = c, imp
			}
			continue
		}
		if c.Reset > q.Reset {
			q, implied = c, imp
		}
	}
	return q, implied, ok
}

// impliedReset returns q with the reset its window implies when it states a
// window and no reset: a window's quota comes back within the window, so
// the reset is read as the window, at most a minute (countLookAgain: a
// day's count, Salesforce's rolling api-usage or HubSpot's daily, is
// looked at again every minute, not held a day), and at most maxWait. What
// the reset means stays as the dialect says (HubSpot's and Salesforce's
// readers say a window's end; a generic "100;w=60" says nothing, and its
// shape is learnt). A bucket's count (Shopify's used/capacity over its
// 20-second leak) implies nothing: it refills continuously. implied says
// whether q's reset is one its window implies.
func (q Quota) impliedReset(maxWait time.Duration) (_ Quota, implied bool) {
	if q.HasReset || !q.HasWindow || q.Window <= 0 || q.Kind == ResetKindBucket {
		return q, false
	}
	q.Reset, q.HasReset = min(q.Window, countLookAgain, maxWait), true
	return q, true
}

// countLookAgain is the longest reset a window implies (see impliedReset).
const countLookAgain = time.Minute

// maxPacedWindow is the longest window whose limit is a pace: a limit over
// a longer one (a day's) is spent as the provider counts it, and holds the
// key when nothing is left, rather than spread at limit/window.
const maxPacedWindow = time.Hour

// advertised returns the request limit a signal states with its window, in
// units per second (the lowest when it states several), or 0. A window
// longer than maxPacedWindow states no pace.
func (s *Signal) advertised() float64 {
	best := 0.0
	for _, c := range s.Quotas {
		if c.Dimension != Requests || !c.HasLimit || !c.HasWindow || c.Limit <= 0 || c.Window <= 0 || c.Window > maxPacedWindow {
			continue
		}
		if r := c.Limit / c.Window.Seconds(); best == 0 || r < best {
			best = r
		}
	}
	return best
}

// throttled reports whether the response asks the caller to slow down: a
// 429, a 503 with a Retry-After, or any response marked Throttling (GitHub's
// 403 with nothing remaining or with a Retry-After); never a billing error
// (ScopeBilling), which is not about the rate.
func (s *Signal) throttled() bool {
	if s.Scope == ScopeBilling {
		return false
	}
	return s.Throttling || s.Status == http.StatusTooManyRequests ||
		(s.Status == http.StatusServiceUnavailable && s.HasRetryAfter)
}

// notAboutQuota reports whether a throttle is, by the provider's own
// word, not about the caller's quota: it says so (ScopeOther: a lock, a
// shared resource), or its count of requests, q (when hasQ), has room and
// it does not say the quota is the reason.
func (s *Signal) notAboutQuota(q Quota, hasQ bool) bool {
	return control.NotAboutQuota(s.throttled(), control.Scope(s.Scope), hasQ && q.Remaining > 0)
}

// plain reports whether s says nothing of its key's limit, whatever the
// key has learnt (control.Plain).
func (s *Signal) plain() bool {
	return control.Plain(len(s.Quotas) > 0, s.Status, control.Scope(s.Scope), s.throttled())
}

// response reads s for its key's controller: its most restrictive
// requests quota (requestQuota) and its advertised limit, when it has
// counts, and whether it is a throttle. A response without counts reads
// none (the allowed path's: see control.State.Silent).
func (s *Signal) response() control.Response {
	r := control.Response{
		Now: s.Now, SentAt: s.SentAt, Status: s.Status, InFlight: s.InFlight,
		RetryAfter: s.RetryAfter, HasRetryAfter: s.HasRetryAfter,
		Scope: control.Scope(s.Scope), Throttled: s.throttled(), Counts: len(s.Quotas) > 0,
	}
	if r.Counts {
		var q Quota
		q, r.Implied, r.HasQuota = s.requestQuota()
		r.Quota, r.Advertised = q.control(), s.advertised()
	}
	return r
}

// control is q as the controller reads it.
func (q Quota) control() control.Quota {
	return control.Quota{
		Limit: q.Limit, HasLimit: q.HasLimit, Remaining: q.Remaining, HasRemaining: q.HasRemaining,
		Reset: q.Reset, HasReset: q.HasReset, Window: q.Window, HasWindow: q.HasWindow,
		Kind: control.Shape(q.Kind),
	}
}

// statusOverloaded is the status Anthropic answers when its API as a whole
// is overloaded (529 overloaded_error): not about the caller's quota.
const statusOverloaded = 529

// overloaded reports whether the provider refused the request for its own
// load, not the caller's rate: a 529, or a 503 that names no wait (a 503
// with Retry-After is a throttle: see throttled). Such a response is
// retried after a short fixed pause for its own request (overloadPause);
// it never holds the key nor lowers its rate.
func (s *Signal) overloaded() bool {
	return s.Status == statusOverloaded || (s.Status == http.StatusServiceUnavailable && !s.HasRetryAfter)
}

// readSignal reads resp's signal at now with the built-in readers only,
// capping waits at maxWait; the host is the one of resp.Request, when set.
// A Transport reads with its own settings through signalConfig.readSignal.
func readSignal(resp *http.Response, sentAt, now time.Time, maxWait time.Duration) Signal {
	host := ""
	if resp != nil && resp.Request != nil && resp.Request.URL != nil {
		host = resp.Request.URL.Host
	}
	return (*signalConfig)(nil).readSignal(resp, host, sentAt, now, maxWait)
}

// reads reports whether reading resp runs a reader, which may need the
// time it is read at, and whether the built-in readers are among them:
// they read a 429, or a response with a header whose name may be theirs
// (dialect.MaySignal, one look at every name, which readInto is given
// rather than take again); a Transport's own readers read every
// response. A response that runs none is read the same at any time
// (TestUnreadSignalIsTimeless).
func (c *signalConfig) reads(resp *http.Response) (any, builtin bool) {
	builtin = resp.StatusCode == http.StatusTooManyRequests || dialect.MaySignal(resp.Header)
	return builtin || (c != nil && len(c.readers) > 0), builtin
}

// unread is readInto for a response that runs no reader (see reads): its
// status is all there is to read, at any time, so s.Now is left zero. (It
// does not ask again what reads asked: a response's every header is
// looked at for that.)
func (c *signalConfig) unread(s *Signal, resp *http.Response, host string, sentAt time.Time, maxWait time.Duration) {
	*s = Signal{SentAt: sentAt, Host: host, MaxWait: maxWait, Status: resp.StatusCode}
	s.finish()
}

// readSignal reads resp, the answer to a request sent to host at sentAt,
// at now: the built-in readers, then c's, each adding what it finds to one
// Signal, with every wait capped at maxWait. A nil c reads the built-in
// dialects only. A response without rate-limit headers costs no
// allocation.
func (c *signalConfig) readSignal(resp *http.Response, host string, sentAt, now time.Time, maxWait time.Duration) Signal {
	var s Signal
	builtin := false
	if resp != nil {
		_, builtin = c.reads(resp)
	}
	c.readInto(&s, resp, host, sentAt, now, maxWait, builtin)
	return s
}

// readInto is readSignal into s, all of which it sets: the Transport reads
// into the Signal it keeps for the attempt, rather than copy one there.
// builtin is reads' word on whether the built-in readers read resp.
func (c *signalConfig) readInto(s *Signal, resp *http.Response, host string, sentAt, now time.Time, maxWait time.Duration, builtin bool) {
	*s = Signal{Now: now, SentAt: sentAt, Host: host, MaxWait: maxWait}
	if resp == nil {
		return
	}
	s.Status = resp.StatusCode
	s.cfg = c
	if builtin {
		readBuiltin(resp, s)
	}
	if c != nil && len(c.readers) > 0 {
		// A Signal handed to an interface escapes: only a Transport with
		// readers of its own pays for a copy on the heap.
		p := new(Signal)
		*p = *s
		for _, r := range c.readers {
			r.ReadSignal(resp, p)
		}
		*s = *p
	}
	s.finish()
	s.cfg = nil
}
