package fakellm

import (
	"context"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/egress-go/egress/internal/clock"
)

// The endpoints the Server answers; any other path is answered 404.
const (
	// ChatCompletionsPath is OpenAI's chat completions endpoint, answered
	// in OpenAI's dialect.
	ChatCompletionsPath = "/v1/chat/completions"
	// MessagesPath is Anthropic's messages endpoint, answered in
	// Anthropic's dialect. Both endpoints share the same limits.
	MessagesPath = "/v1/messages"
)

// Server is the fake provider: an http.Handler, to run with
// httptest.NewServer or http.Serve. It enforces its limits over all the
// requests it serves, from every caller. Its methods are safe for
// concurrent use by multiple goroutines.
type Server struct {
	cfg Config // defaults filled in
	clk clock.Clock

	mu     sync.Mutex
	limits limitSet   // guarded by mu
	rng    *rand.Rand // guarded by mu; draws the output tokens
	seq    int        // guarded by mu; numbers the admitted requests
	rec    recorder   // guarded by mu
}

// New validates cfg and returns a provider whose limits are whole.
func New(cfg Config) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	now := cfg.Clock.Now()
	return &Server{
		cfg:    cfg,
		clk:    cfg.Clock,
		limits: newLimitSet(cfg, now),
		rng:    rand.New(rand.NewPCG(cfg.Seed, cfg.Seed)),
		rec:    newRecorder(now, cfg.Minute),
	}, nil
}

// Stats returns what the provider answered and charged so far.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec.stats(&s.limits)
}

// ticket is the decision on one request, and what its completion needs.
type ticket struct {
	verdict
	now      time.Time // of the decision
	readings []reading // the limits after the decision
	upfront  cost
	id       int // admitted: the request's number, from 1
	output   int // admitted: its output tokens
}

// ServeHTTP answers a request to either endpoint: 404 for another path, 405
// for a method other than POST, 400 for an invalid body, 429 when a limit
// refuses it, else 200 with the completion, after the configured delays.
// A completion whose caller leaves before it ends is still charged its
// whole output.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d, ok := dialectFor(r.URL.Path)
	if !ok {
		writeNotFound(w, r)
		return
	}
	req, bad := parse(d, r, s.cfg.DefaultMaxTokens)
	if bad != nil {
		s.reject(w, d, bad)
		return
	}
	t := s.admit(req)
	switch {
	case !t.ok:
		s.refuse(w, d, req, &t)
	case req.stream:
		s.stream(r.Context(), w, d, req, &t)
	default:
		s.respond(r.Context(), w, d, req, &t)
	}
}

// admit decides on req under the limits and, when admitted, draws its
// output, all at one instant.
func (s *Server) admit(req request) ticket {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clk.Now() // under mu, so that the limits see time in order
	t := ticket{now: now, upfront: upfrontCost(s.cfg.Upfront, req.input, req.maxTokens)}
	t.verdict = s.limits.admit(now, t.upfront)
	if t.ok {
		s.seq++
		t.id = s.seq
		t.output = clamp(s.cfg.Output(s.rng.Float64(), req.maxTokens), 1, req.maxTokens)
	}
	t.readings = s.limits.read(now)
	s.rec.decided(now, t.verdict)
	return t
}

// settle charges an admitted request its actual tokens.
func (s *Server) settle(req request, t *ticket) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limits.settle(s.clk.Now(), t.marks, t.upfront, actualCost(req.input, t.output))
	s.rec.settled(t.now, req.input, t.output)
}

// reject answers an invalid request, which spends nothing.
func (s *Server) reject(w http.ResponseWriter, d dialect, bad *invalid) {
	s.mu.Lock()
	now := s.clk.Now()
	readings := s.limits.read(now)
	s.rec.invalid()
	s.mu.Unlock()
	if !s.cfg.OmitLimitHeaders {
		d.writeLimits(w.Header(), now, readings)
	}
	writeJSON(w, bad.status, d.invalidBody(bad))
}

// refuse answers 429 for a request a limit refused.
func (s *Server) refuse(w http.ResponseWriter, d dialect, req request, t *ticket) {
	h := w.Header()
	if !s.cfg.OmitLimitHeaders {
		d.writeLimits(h, t.now, t.readings)
	}
	if !s.cfg.OmitRetryAfter && !t.tooLarge {
		d.writeRetry(h, t.wait)
	}
	r := t.readings[t.by]
	writeJSON(w, http.StatusTooManyRequests, d.refusalBody(refusal{
		model:     req.model,
		reading:   r,
		requested: t.upfront[r.dim],
		wait:      t.wait,
		tooLarge:  t.tooLarge,
	}))
}

// respond answers a completion in one body, after Latency + PerToken ×
// output, and settles it first, so that a caller who has the response sees
// the actual charge in the next one's headers.
func (s *Server) respond(ctx context.Context, w http.ResponseWriter, d dialect, req request, t *ticket) {
	waited := s.pause(ctx, s.cfg.Latency+time.Duration(t.output)*s.cfg.PerToken)
	s.settle(req, t)
	if !waited {
		return // the caller has gone
	}
	if !s.cfg.OmitLimitHeaders {
		d.writeLimits(w.Header(), t.now, t.readings)
	}
	writeJSON(w, http.StatusOK, d.completionBody(s.completion(req, t)))
}

// completion is what the bodies say of an admitted request.
func (s *Server) completion(req request, t *ticket) completion {
	return completion{
		id:           t.id,
		model:        req.model,
		created:      t.now,
		input:        req.input,
		output:       t.output,
		maxTokens:    req.maxTokens,
		includeUsage: req.includeUsage || !s.cfg.StreamUsageOnRequest,
	}
}

// pause waits d on the clock, or less if ctx ends first; it reports
// whether it waited all of d.
func (s *Server) pause(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := s.clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-ctx.Done():
		return false
	}
}

// writeJSON writes a JSON body with status.
func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(body)
	w.Write([]byte("\n"))
}

// writeNotFound answers a path that is neither endpoint, as OpenAI does.
func writeNotFound(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusNotFound, openAI{}.invalidBody(&invalid{
		status: http.StatusNotFound,
		msg:    "Invalid URL (" + r.Method + " " + r.URL.Path + ")",
	}))
}
