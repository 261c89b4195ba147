package egress

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/egress-go/egress/internal/dialect"
	"github.com/egress-go/egress/internal/field"
)

// This file holds the reading of responses as a whole: the SignalReader
// interface through which every dialect is read (the built-in ones in
// internal/dialect and retryafter.go, and a user's own), the options that
// configure the reading, and the methods readers use to add what they
// read to a Signal, which validate, cap and merge it.
//
// Every header and body is hostile input: a value that cannot be read is
// ignored, never guessed, and nothing here panics.

// SignalReader reads one dialect of rate-limit signals: it adds to s what
// resp says in that dialect. Every built-in dialect (see docs/dialects.md)
// is a SignalReader; WithSignalReader adds a user's own, for a provider the
// built-in ones do not read.
//
// ReadSignal is called once per response, after the built-in readers, with
// s already holding Now, SentAt, Status, Host, MaxWait and what the readers
// before it found. It must add what it reads through s's methods (AddQuota,
// AddRetryAfter, SetRetry, SetScope), which validate, cap and merge, or set
// Throttling, NearLimit and Reason directly. It may read the first bytes of
// the body with PeekBody, never more, and must not close the body. It must
// not keep resp or s after it returns. It is called from the goroutines
// of RoundTrip, so it must be safe for concurrent use.
type SignalReader interface {
	ReadSignal(resp *http.Response, s *Signal)
}

// SignalReaderFunc is a function that is a SignalReader.
type SignalReaderFunc func(resp *http.Response, s *Signal)

// ReadSignal calls f(resp, s).
func (f SignalReaderFunc) ReadSignal(resp *http.Response, s *Signal) { f(resp, s) }

// ResetUnit is the unit of a reset header's value. The zero value,
// ResetAuto, reads the value by its shape; the others read it as one unit
// only, for a provider whose values the shape rule misreads (WithResetUnit).
type ResetUnit uint8

// The units of reset headers.
const (
	// ResetAuto reads a reset by its shape: a Go-style duration ("6m0s",
	// "12ms"); a number by its size (>= 1e12 epoch milliseconds, >= 1e9
	// epoch seconds, anything smaller seconds from now, decimals allowed);
	// or a timestamp (RFC 3339, ISO 8601 without seconds, HTTP-date).
	ResetAuto ResetUnit = iota
	// ResetDeltaSeconds: seconds from now, decimals allowed ("41", "64.57").
	ResetDeltaSeconds
	// ResetDeltaMillis: milliseconds from now ("600000").
	ResetDeltaMillis
	// ResetEpochSeconds: a Unix time in seconds ("1609459200").
	ResetEpochSeconds
	// ResetEpochMillis: a Unix time in milliseconds ("1609459200000").
	ResetEpochMillis
	// ResetDuration: a Go-style duration ("6m0s", "1.5s", "12ms").
	ResetDuration
	// ResetTimestamp: an RFC 3339 or ISO 8601 time ("2025-08-21T12:40:59Z",
	// "2026-03-26T16:00Z") or an HTTP-date.
	ResetTimestamp
)

var resetUnitNames = [...]string{"auto", "delta-seconds", "delta-milliseconds", "epoch-seconds", "epoch-milliseconds", "duration", "timestamp"}

// String returns the unit's name, e.g. "epoch-seconds".
func (u ResetUnit) String() string {
	if int(u) < len(resetUnitNames) {
		return resetUnitNames[u]
	}
	return fmt.Sprintf("ResetUnit(%d)", uint8(u))
}

// signalConfig is how a Transport reads responses: the readers and the
// per-host overrides. Its zero value reads the built-in dialects. It is
// set once in New and only read afterwards, so it is safe for concurrent
// use.
type signalConfig struct {
	readers []SignalReader  // the user's, run after the built-in ones
	units   []resetOverride // per host and header; the last one set wins
}

// resetOverride is one WithResetUnit setting.
type resetOverride struct {
	host   string // as given, matched without regard to case
	header string // canonical
	unit   ResetUnit
}

// isNilReader reports whether r holds a nil pointer or a nil func, such as
// a SignalReaderFunc(nil).
func isNilReader(r SignalReader) bool {
	if f, ok := r.(SignalReaderFunc); ok {
		return f == nil
	}
	return isNilPointer(r)
}

// unitFor returns the unit set for header (canonical) in responses from
// host, or ResetAuto.
func (c *signalConfig) unitFor(host, header string) ResetUnit {
	if c == nil || len(c.units) == 0 {
		return ResetAuto
	}
	name := hostName(host)
	unit := ResetAuto
	for _, o := range c.units {
		if o.header == header && (strings.EqualFold(o.host, host) || strings.EqualFold(o.host, name)) {
			unit = o.unit
		}
	}
	return unit
}

// hostName returns host without its port: "api.x.com:443" is "api.x.com",
// "[::1]:80" is "[::1]".
func hostName(host string) string {
	i := strings.LastIndexByte(host, ':')
	if i < 0 || strings.HasSuffix(host, "]") {
		return host
	}
	if j := strings.IndexByte(host, ':'); j != i && !strings.HasPrefix(host, "[") {
		return host // a bare IPv6 address has no port
	}
	return host[:i]
}

// finish draws what the readers' findings imply together: a 403 that
// carries a Retry-After or an exhausted requests quota is a throttle
// (GitHub's secondary and primary limits); a billing error is never a
// pause and never retried.
func (s *Signal) finish() {
	if s.Status == http.StatusForbidden && !s.Throttling {
		if q, _, ok := s.requestQuota(); ok && q.Remaining == 0 {
			s.Throttling = true
			s.SetScope(ScopeQuota)
		} else if s.HasRetryAfter {
			s.Throttling = true
		}
	}
	if s.Scope == ScopeBilling {
		s.Retry = RetryNo
		s.RetryAfter, s.HasRetryAfter, s.RetryAfterTooLong = 0, false, false
		s.Throttling = false
	}
}

// UnitFor returns the unit that c's settings give header (canonical) in
// responses from host, as internal/field reads it: c is the readers'
// dialect.Units.
func (c *signalConfig) UnitFor(host, header string) field.Unit {
	return field.Unit(c.unitFor(host, header))
}

// maxWait returns the cap on waits: MaxWait, or no cap when it is <= 0.
func (s *Signal) maxWait() time.Duration {
	if s.MaxWait <= 0 {
		return math.MaxInt64
	}
	return s.MaxWait
}

// parseCap is the cap the built-in parsers read waits with: one nanosecond
// over MaxWait, so that AddRetryAfter can tell "too long" from "exactly the
// cap".
func (s *Signal) parseCap() time.Duration {
	m := s.maxWait()
	if m == math.MaxInt64 {
		return m
	}
	return m + 1
}

// AddRetryAfter records that the response asked for a wait of d before the
// next attempt. A negative d is ignored; d above MaxWait is capped and sets
// RetryAfterTooLong. When several waits are asked for (Retry-After,
// retry-after-ms, a body's retry delay), the longest wins.
func (s *Signal) AddRetryAfter(d time.Duration) {
	if d < 0 {
		return
	}
	m := s.maxWait()
	if d > m {
		s.RetryAfterTooLong = true
		d = m
	}
	if !s.HasRetryAfter || d > s.RetryAfter {
		s.RetryAfter = d
	}
	s.HasRetryAfter = true
}

// SetRetry records the provider's word on retrying. The stronger word wins:
// RetryNo over RetryYes over RetryDefault. An unknown value is ignored.
func (s *Signal) SetRetry(d RetryDecision) {
	if d > RetryNo {
		return
	}
	if d == RetryNo || s.Retry == RetryDefault {
		s.Retry = d
	}
}

// SetScope records what a throttling response is about. When readers
// disagree the more cautious word wins: ScopeBilling over ScopeQuota over
// ScopeOther over ScopeUnknown. An unknown value is ignored.
func (s *Signal) SetScope(sc Scope) {
	if sc > ScopeBilling {
		return
	}
	if scopeRank(sc) > scopeRank(s.Scope) {
		s.Scope = sc
	}
}

func scopeRank(sc Scope) int {
	switch sc {
	case ScopeOther:
		return 1
	case ScopeQuota:
		return 2
	case ScopeBilling:
		return 3
	}
	return 0
}

// AddQuota records one quota the response reported. Its fields are checked
// first: a Limit, Remaining or Used that is negative, NaN or infinite, a
// negative Reset and a Window <= 0 are dropped (their Has flag cleared), a
// Reset above MaxWait is capped, a field whose Has flag is false is zeroed,
// and a quota with nothing left, or with an unknown Dimension, is ignored.
//
// A quota with the same Dimension, Name and Window (or both without one) as
// one already recorded is merged into it: a field only one of them has is
// kept, and where both have it, the more restrictive value wins (the lower
// Limit and Remaining, the higher Used, the later Reset). So Quotas holds
// one Quota per dimension, name and window.
func (s *Signal) AddQuota(q Quota) {
	if q.Dimension > Points {
		return
	}
	q.Limit, q.HasLimit = checkAmount(q.Limit, q.HasLimit)
	q.Remaining, q.HasRemaining = checkAmount(q.Remaining, q.HasRemaining)
	q.Used, q.HasUsed = checkAmount(q.Used, q.HasUsed)
	if !q.HasReset || q.Reset < 0 {
		q.Reset, q.HasReset = 0, false
	}
	q.Reset = min(q.Reset, s.maxWait())
	if !q.HasWindow || q.Window <= 0 {
		q.Window, q.HasWindow = 0, false
	}
	if !q.HasLimit && !q.HasRemaining && !q.HasUsed && !q.HasReset {
		return
	}
	if q.Kind > ResetKindBucket {
		q.Kind = ResetKindUnknown
	}
	for i := range s.Quotas {
		e := &s.Quotas[i]
		if e.Dimension == q.Dimension && e.Name == q.Name && e.HasWindow == q.HasWindow && e.Window == q.Window {
			e.merge(q)
			return
		}
	}
	s.Quotas = append(s.Quotas, q)
}

// merge folds q, a quota of the same dimension, name and window, into e.
func (e *Quota) merge(q Quota) {
	if q.HasLimit && (!e.HasLimit || q.Limit < e.Limit) {
		e.Limit, e.HasLimit = q.Limit, true
	}
	if q.HasRemaining && (!e.HasRemaining || q.Remaining < e.Remaining) {
		e.Remaining, e.HasRemaining = q.Remaining, true
	}
	if q.HasUsed && (!e.HasUsed || q.Used > e.Used) {
		e.Used, e.HasUsed = q.Used, true
	}
	if q.HasReset && (!e.HasReset || q.Reset > e.Reset) {
		e.Reset, e.HasReset = q.Reset, true
	}
	if e.Kind == ResetKindUnknown {
		e.Kind = q.Kind
	}
}

// checkAmount returns v when has is set and v is a finite number >= 0.
func checkAmount(v float64, has bool) (float64, bool) {
	if !has || v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

// setReason records the provider's reason, the first one read.
func (s *Signal) setReason(r string) {
	if s.Reason == "" && r != "" {
		s.Reason = r
	}
}

// readBuiltin runs the built-in readers over resp, into s: Retry-After
// and its kin (retryafter.go), then the providers' dialects
// (internal/dialect), whose findings it adds. Its caller runs it only on
// a response they read (see signalConfig.reads).
func readBuiltin(resp *http.Response, s *Signal) {
	retryReader{}.ReadSignal(resp, s)
	var r dialect.Reading
	r.Begin(s.Now, s.maxWait(), s.parseCap(), s.Host, s.cfg)
	dialect.Read(resp, &r)
	s.found(&r)
}

// found adds to s what internal/dialect's readers found, through the
// methods that validate, cap and merge: the same Signal as if each had
// been added as it was read (each merge keeps the most cautious value,
// whatever the order).
func (s *Signal) found(r *dialect.Reading) {
	for i := range r.Quotas() {
		q := r.Quota(i)
		s.AddQuota(Quota{
			Dimension: Dimension(q.Dimension), Name: q.Name,
			Limit: q.Limit, HasLimit: q.HasLimit,
			Remaining: q.Remaining, HasRemaining: q.HasRemaining,
			Reset: q.Reset, HasReset: q.HasReset,
			Window: q.Window, HasWindow: q.HasWindow,
			Used: q.Used, HasUsed: q.HasUsed,
			Kind: ResetKind(q.Kind),
		})
	}
	if r.HasRetryAfter {
		s.AddRetryAfter(r.RetryAfter)
	}
	for sc := ScopeUnknown; r.Scopes != 0 && sc <= ScopeBilling; sc++ {
		if r.Scopes&(1<<sc) != 0 {
			s.SetScope(sc)
		}
	}
	for d := RetryDefault; r.Retries != 0 && d <= RetryNo; d++ {
		if r.Retries&(1<<d) != 0 {
			s.SetRetry(d)
		}
	}
	s.setReason(r.Reason)
	s.NearLimit = s.NearLimit || r.NearLimit
}
