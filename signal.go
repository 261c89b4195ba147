package egress

import (
	"net/http"
	"time"
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
	// Window is the length of the window Limit counts over, when stated.
	Window    time.Duration
	HasWindow bool
}

// Dimension is what a quota counts.
type Dimension uint8

// The dimensions providers report.
const (
	Requests     Dimension = iota // requests (the default)
	Tokens                        // tokens, input and output together
	InputTokens                   // input (prompt) tokens
	OutputTokens                  // output (completion) tokens
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
)

// requestQuota returns the most restrictive quota of the requests
// dimension: the one with the least remaining (on a tie, the later reset),
// and ok false when the signal has none with a remaining count.
func (s *Signal) requestQuota() (q Quota, ok bool) {
	for _, c := range s.Quotas {
		if c.Dimension != Requests || !c.HasRemaining {
			continue
		}
		if !ok || c.Remaining < q.Remaining || (c.Remaining == q.Remaining && c.Reset > q.Reset) {
			q, ok = c, true
		}
	}
	return q, ok
}

// advertised returns the request limit a signal states with its window, in
// units per second (the lowest when it states several), or 0.
func (s *Signal) advertised() float64 {
	best := 0.0
	for _, c := range s.Quotas {
		if c.Dimension != Requests || !c.HasLimit || !c.HasWindow || c.Limit <= 0 || c.Window <= 0 {
			continue
		}
		if r := c.Limit / c.Window.Seconds(); best == 0 || r < best {
			best = r
		}
	}
	return best
}

// throttled reports whether the response asks the caller to slow down: a
// 429, or a 503 with a Retry-After.
func (s *Signal) throttled() bool {
	return s.Status == http.StatusTooManyRequests || (s.Status == http.StatusServiceUnavailable && s.HasRetryAfter)
}

// readSignal reads resp's signal at now with the built-in readers, capping
// waits at maxWait.
func readSignal(resp *http.Response, sentAt, now time.Time, maxWait time.Duration) Signal {
	s := Signal{Now: now, SentAt: sentAt}
	if resp == nil {
		return s
	}
	s.Status = resp.StatusCode
	if len(resp.Header) == 0 {
		return s
	}
	if s.Status == http.StatusTooManyRequests || s.Status == http.StatusServiceUnavailable {
		// One nanosecond over the cap tells "too long" from "exactly the cap".
		if d, ok := parseRetryAfter(resp.Header.Values("Retry-After"), now, maxWait+1); ok {
			s.RetryAfter, s.HasRetryAfter, s.RetryAfterTooLong = min(d, maxWait), true, d > maxWait
		}
	}
	h := parseRateLimit(resp.Header, now, maxWait)
	if h.HasRemaining || h.HasReset || h.HasLimit {
		s.Quotas = append(s.Quotas, Quota{
			Limit: float64(h.Limit), HasLimit: h.HasLimit,
			Remaining: float64(h.Remaining), HasRemaining: h.HasRemaining,
			Reset: h.Reset, HasReset: h.HasReset,
			Window: h.Window, HasWindow: h.HasWindow,
		})
	}
	return s
}
