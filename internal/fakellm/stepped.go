package fakellm

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/egress-go/egress/internal/clock"
)

// SteppedConfig is the behaviour of a Stepped provider. NewStepped
// validates it.
type SteppedConfig struct {
	// Capacity is the bucket's size B, in requests: it starts full and
	// never holds more. At least 1.
	Capacity int
	// Rate is how many requests a second the bucket gets back, in steps:
	// Rate × Step units at each step's start. Above 0.
	Rate float64
	// Step is the time between two refills, and steps start at the
	// multiples of Step since the zero time. At least a millisecond.
	Step time.Duration
	// TruncateReset states the reset truncated to the second, rather than
	// rounded up to it (the default).
	TruncateReset bool
	// Latency delays an accepted request's answer, after it was decided.
	// Refusals are answered at once. Zero: none.
	Latency time.Duration
	// Clock tells the time. Nil: clock.Real{}.
	Clock clock.Clock
}

// Stepped is a provider whose only limit is a bucket of requests refilled
// in steps rather than continuously: every Step it gets back Rate × Step
// units, up to Capacity, and a request is accepted when the bucket holds a
// whole unit or more. It answers POST MessagesPath in Anthropic's dialect:
// anthropic-ratelimit-requests-{limit,remaining,reset} on every answer,
// the reset the time (RFC 3339, to the second) at which the bucket is full
// again if nothing more is spent, remaining the whole units left after the
// decision; a refusal is a 429 with retry-after, the whole seconds
// (rounded up, at least 1) until the bucket holds a unit, and Anthropic's
// rate_limit_error body. Any other path is answered 404. The request's
// body is read and not parsed. It is safe for concurrent use.
type Stepped struct {
	cfg SteppedConfig
	per float64 // units back at each step

	mu       sync.Mutex
	level    float64   // guarded by mu; units in the bucket
	last     time.Time // guarded by mu; the start of the step the level is as of
	start    time.Time // guarded by mu; the start of the first step
	accepted int       // guarded by mu
	refused  int       // guarded by mu
}

// SteppedStats is what a Stepped provider decided so far.
type SteppedStats struct {
	Accepted, Refused int
	// Offered is how many units the bucket could have given so far: its
	// Capacity, and Rate × Step at each step since it was made.
	Offered float64
}

// NewStepped validates c and returns a provider whose bucket is full.
func NewStepped(c SteppedConfig) (*Stepped, error) {
	var errs []error
	if c.Capacity < 1 {
		errs = append(errs, fmt.Errorf("fakellm: Capacity %d: must be at least 1", c.Capacity))
	}
	if !(c.Rate > 0) || math.IsInf(c.Rate, 0) {
		errs = append(errs, fmt.Errorf("fakellm: Rate %v: must be above 0 and finite", c.Rate))
	}
	if c.Step < time.Millisecond {
		errs = append(errs, fmt.Errorf("fakellm: Step %v: must be at least 1ms", c.Step))
	}
	if c.Latency < 0 {
		errs = append(errs, fmt.Errorf("fakellm: Latency %v: must not be negative", c.Latency))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	start := c.Clock.Now().Truncate(c.Step)
	return &Stepped{cfg: c, per: c.Rate * c.Step.Seconds(), level: float64(c.Capacity), last: start, start: start}, nil
}

// Stats returns what the provider decided so far.
func (s *Stepped) Stats() SteppedStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	steps := s.cfg.Clock.Now().Truncate(s.cfg.Step).Sub(s.start) / s.cfg.Step
	return SteppedStats{Accepted: s.accepted, Refused: s.refused, Offered: float64(s.cfg.Capacity) + float64(steps)*s.per}
}

// steppedAnswer is the decision on one request and the headers it states.
type steppedAnswer struct {
	ok        bool
	remaining int
	reset     time.Time     // when the bucket is full again
	wait      time.Duration // refused: until it holds a unit
}

// decide takes a unit at now if there is one.
func (s *Stepped) decide(now time.Time) steppedAnswer {
	s.mu.Lock()
	defer s.mu.Unlock()
	if step := now.Truncate(s.cfg.Step); step.After(s.last) {
		n := float64(step.Sub(s.last) / s.cfg.Step)
		s.level = math.Min(float64(s.cfg.Capacity), s.level+n*s.per)
		s.last = step
	}
	a := steppedAnswer{ok: s.level >= 1}
	if a.ok {
		s.level--
		s.accepted++
	} else {
		s.refused++
		a.wait = s.until(1).Sub(now)
	}
	a.remaining = int(math.Floor(s.level))
	a.reset = now
	if s.level < float64(s.cfg.Capacity) {
		a.reset = s.until(float64(s.cfg.Capacity))
	}
	return a
}

// until is the start of the first step at which the bucket holds level
// units, if nothing more is spent. The caller holds mu.
func (s *Stepped) until(level float64) time.Time {
	// (A hair under whole steps: Rate × Step may not be exact in binary.)
	n := math.Ceil((level-s.level)/s.per - 1e-9)
	return s.last.Add(time.Duration(max(n, 0)) * s.cfg.Step)
}

// ServeHTTP answers POST MessagesPath as the type's comment says, 404 for
// another path, 405 for another method.
func (s *Stepped) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != MessagesPath {
		writeNotFound(w, r)
		return
	}
	io.Copy(io.Discard, io.LimitReader(r.Body, maxBody))
	if r.Method != http.MethodPost {
		writeJSON(w, http.StatusMethodNotAllowed, anthropicErrorBody("invalid_request_error", "Method Not Allowed"))
		return
	}
	now := s.cfg.Clock.Now()
	a := s.decide(now)
	h := w.Header()
	h.Set("anthropic-ratelimit-requests-limit", strconv.Itoa(s.cfg.Capacity))
	h.Set("anthropic-ratelimit-requests-remaining", strconv.Itoa(a.remaining))
	reset := rfc3339(a.reset, 0) // rounded up to the second
	if s.cfg.TruncateReset {
		reset = a.reset.UTC().Truncate(time.Second).Format(time.RFC3339)
	}
	h.Set("anthropic-ratelimit-requests-reset", reset)
	if !a.ok {
		h.Set("retry-after", retrySeconds(a.wait))
		writeJSON(w, http.StatusTooManyRequests, anthropicErrorBody("rate_limit_error",
			fmt.Sprintf("This request would exceed the rate limit for your organization (%s) of %d requests per %v.",
				organization, s.cfg.Capacity, time.Duration(float64(s.cfg.Capacity)/s.cfg.Rate*float64(time.Second)))))
		return
	}
	if s.cfg.Latency > 0 {
		t := s.cfg.Clock.NewTimer(s.cfg.Latency)
		select {
		case <-t.C():
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	writeJSON(w, http.StatusOK, mustJSON(anthropicMessage{
		ID: "msg_fakellm_stepped", Type: "message", Role: "assistant", Model: "stepped",
		Content: []anthropicText{{Type: "text", Text: "ok"}}, Usage: anthropicUsage{InputTokens: 1, OutputTokens: 1},
	}))
}
