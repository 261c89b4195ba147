// Package dialect holds the built-in readers of the providers' dialects:
// which header (and which 429 body) of which provider means what, read
// into a Reading, which the root adds to its Signal. The IETF RateLimit
// fields and their older draft, the X-RateLimit-* families, OpenAI's,
// Anthropic's, Discord's, Shopify's, Salesforce's, HubSpot's, Stripe's,
// Jira's and Zendesk's (docs/dialects.md lists what each reads).
// Retry-After, HTTP's own, is the root's (retryafter.go).
//
// It owns the meaning of the headers, not the grammar of their values
// (internal/field's) nor what a Signal does with them (the root's Signal
// validates, caps and merges what the readers found; its controller
// decides). It keeps no state, reads no clock, and imports nothing of the
// module but internal/field. Every header and body is hostile input: a
// value that cannot be read is ignored, never guessed, and nothing here
// panics.
package dialect

import (
	"net/http"
	"time"

	"github.com/egress-go/egress/internal/field"
)

// Reading is one response being read: what the readers read it with,
// set by Begin, and what they found, which the caller then adds to its
// Signal (its AddQuota, AddRetryAfter, SetScope and SetRetry validate, cap
// and merge). The readers only add: a Quota as it was read, the longest
// wait asked for, every scope and word on retrying said, the first reason.
// It is a value the caller keeps on its stack, with the first two quotas
// found in it: reading a response that reports no more costs no
// allocation.
type Reading struct {
	now      time.Time
	maxWait  time.Duration // the cap on waits and resets; math.MaxInt64 for none
	parseCap time.Duration // maxWait and a nanosecond: a wait read above the cap is told from one at it
	host     string
	units    Units

	quotas        [2]Quota      // the first quotas found, in place
	nq            int           // how many of quotas hold one
	more          []Quota       // the quotas found after them
	RetryAfter    time.Duration // the longest wait asked for, as read (not capped)
	HasRetryAfter bool
	Scopes        uint8 // 1<<Scope of every scope said
	Retries       uint8 // 1<<Retry of every word on retrying said
	Reason        string
	NearLimit     bool
}

// Units gives the unit a caller's settings set for a reset header
// (canonical) in responses from host: UnitAuto when none is.
type Units interface {
	UnitFor(host, header string) field.Unit
}

// Begin starts s, a zero Reading, on a response read at now, from host,
// with waits capped at maxWait (math.MaxInt64 for none; parseCap one
// nanosecond more, or math.MaxInt64 too) and the reset units of units
// (nil: none set).
func (s *Reading) Begin(now time.Time, maxWait, parseCap time.Duration, host string, units Units) {
	s.now, s.maxWait, s.parseCap, s.host, s.units = now, maxWait, parseCap, host, units
}

// Now returns when the response was read.
func (s *Reading) Now() time.Time { return s.now }

// MaxWait returns the cap on waits and resets.
func (s *Reading) MaxWait() time.Duration { return s.maxWait }

// ParseCap returns the cap the parsers read waits with (see Begin).
func (s *Reading) ParseCap() time.Duration { return s.parseCap }

// ResetUnit returns the unit set for header (canonical), or UnitAuto.
func (s *Reading) ResetUnit(header string) field.Unit {
	if s.units == nil {
		return field.UnitAuto
	}
	return s.units.UnitFor(s.host, header)
}

// AddQuota adds a quota as read.
func (s *Reading) AddQuota(q Quota) {
	if s.nq < len(s.quotas) {
		s.quotas[s.nq] = q
		s.nq++
		return
	}
	s.more = append(s.more, q)
}

// Quotas returns how many quotas were found; Quota returns the i-th, in
// the order found.
func (s *Reading) Quotas() int { return s.nq + len(s.more) }

// Quota: see Quotas.
func (s *Reading) Quota(i int) Quota {
	if i < s.nq {
		return s.quotas[i]
	}
	return s.more[i-s.nq]
}

// AddRetryAfter records a wait asked for: the longest is kept.
func (s *Reading) AddRetryAfter(d time.Duration) {
	if !s.HasRetryAfter || d > s.RetryAfter {
		s.RetryAfter, s.HasRetryAfter = d, true
	}
}

// SetScope records a scope said.
func (s *Reading) SetScope(sc Scope) { s.Scopes |= 1 << sc }

// SetRetry records a word on retrying said.
func (s *Reading) SetRetry(r Retry) { s.Retries |= 1 << r }

// SetReason records the provider's reason, the first one read.
func (s *Reading) SetReason(r string) {
	if s.Reason == "" {
		s.Reason = r
	}
}

// SetNearLimit records that the provider warned of its limit near.
func (s *Reading) SetNearLimit() { s.NearLimit = true }

// Quota is one limit a response reported: the root's Quota, field for
// field (the root's TestDialectMirrors holds the two together).
type Quota struct {
	Dimension    Dimension
	Name         string
	Limit        float64
	HasLimit     bool
	Remaining    float64
	HasRemaining bool
	Reset        time.Duration
	HasReset     bool
	Window       time.Duration
	HasWindow    bool
	Used         float64
	HasUsed      bool
	Kind         Kind
}

// Dimension is what a quota counts: the root's Dimension.
type Dimension uint8

// The dimensions, as the root's.
const (
	Requests Dimension = iota
	Tokens
	InputTokens
	OutputTokens
	Points
)

// Kind says what a quota's reset means: the root's ResetKind.
type Kind uint8

// The kinds, as the root's ResetKindUnknown, ResetKindWindow and
// ResetKindBucket.
const (
	KindUnknown Kind = iota
	KindWindow
	KindBucket
)

// Scope says what a throttling response is about: the root's Scope.
type Scope uint8

// The scopes, as the root's.
const (
	ScopeUnknown Scope = iota
	ScopeQuota
	ScopeOther
	ScopeBilling
)

// Retry is the provider's word on retrying: the root's RetryDecision.
type Retry uint8

// The words, as the root's.
const (
	RetryDefault Retry = iota
	RetryYes
	RetryNo
)

// ResetHeaders are the headers whose unit the root's WithResetUnit may
// set: every reset header the readers read by the shape rule.
var ResetHeaders = [...]string{
	hXRateLimitReset, hXRateLimitResetAfter, hXRateLimitResetRequests, hXRateLimitResetTokens,
	hXRateLimitHyphenReset, hRateLimitReset, hRateLimitResetTime, hFastlyReset, hXBetaRateLimitReset,
	hAnthropicRequestsReset, hAnthropicTokensReset, hAnthropicInputReset, hAnthropicOutputReset,
}

// IsResetHeader reports whether canonical is one of ResetHeaders.
func IsResetHeader(canonical string) bool {
	for _, h := range ResetHeaders {
		if h == canonical {
			return true
		}
	}
	return false
}

// Read runs the built-in readers over resp, into s. Its caller passes
// over a response that is no 429 (whose body may speak) and has no header
// that may carry a signal (MaySignal), after one look at its header names.
func Read(resp *http.Response, s *Reading) {
	ietfReader{field: hRateLimit, policy: hRateLimitPolicy}.read(resp, s)
	ietfReader{field: hBetaRateLimit, policy: hBetaRateLimitPolicy}.read(resp, s)
	draftReader{}.read(resp, s)
	xRateLimitReader{}.read(resp, s)
	openAIReader{}.read(resp, s)
	anthropicReader{}.read(resp, s)
	discordReader{}.read(resp, s)
	callLimitReader{}.read(resp, s)
	salesforceReader{}.read(resp, s)
	hubSpotReader{}.read(resp, s)
	stripeReader{}.read(resp, s)
	jiraReader{}.read(resp, s)
	zendeskReader{}.read(resp, s)
}

// MaySignal reports whether h has a header that a built-in reader may
// read, or the root's Retry-After reader: every one of their names holds
// "imit" (RateLimit, Rate-Limit, Call-Limit, Limited) or "Retry". Every
// response's headers are looked at so (see signalName): two
// strings.Contains a name were 125 ns of the allowed path for eight plain
// headers.
func MaySignal(h http.Header) bool {
	for name := range h {
		if signalName(name) {
			return true
		}
	}
	return false
}

// signalName reports whether a header's name holds "imit" or "Retry". It
// looks at every fourth byte or so (Horspool's skip, for the two needles
// "imit" and "Retr" at once): where the byte under a needle's last place
// is one neither needle holds, no match ends within four places of it.
// Eight plain names take 34 ns so, where a look at every byte took 70.
func signalName(name string) bool {
	for i := 3; i < len(name); i += int(nameSkip[name[i]]) {
		switch name[i] {
		case 't':
			if name[i-3] == 'i' && name[i-2] == 'm' && name[i-1] == 'i' {
				return true
			}
		case 'r':
			if name[i-3] == 'R' && name[i-2] == 'e' && name[i-1] == 't' && i+1 < len(name) && name[i+1] == 'y' {
				return true
			}
		}
	}
	return false
}

// nameSkip is how far signalName moves on past a byte: the least distance,
// over "imit" and "Retr", from the byte's last place among a needle's first
// three to the needle's end; 4 for a byte neither holds there.
var nameSkip = func() (t [256]uint8) {
	for i := range t {
		t[i] = 4
	}
	for _, n := range [...]string{"imit", "Retr"} {
		for j := range 3 {
			t[n[j]] = min(t[n[j]], uint8(3-j))
		}
	}
	return t
}()
