package main

import (
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// provider is a tiny rate-limited payments API: a token bucket of burst
// tokens refilled at rate per second over all its callers. An accepted
// charge gets 200; beyond the limit it answers 429 with Retry-After-Ms (the
// time until the next token). Every answer reports the quota as
// X-RateLimit-Limit (the burst) and X-RateLimit-Remaining (whole tokens
// left). It counts what it received and what it answered.
type provider struct {
	rate  float64
	burst float64

	mu     sync.Mutex
	tokens float64   // guarded by mu
	last   time.Time // guarded by mu; when tokens was computed

	received, accepted, throttled atomic.Int64
}

func newProvider(rate float64, burst int) *provider {
	return &provider{rate: rate, burst: float64(burst), tokens: float64(burst), last: time.Now()}
}

// take takes a token if there is one, and returns the tokens left and the
// wait until the next one.
func (p *provider) take(now time.Time) (ok bool, left float64, next time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tokens = math.Min(p.burst, p.tokens+now.Sub(p.last).Seconds()*p.rate)
	p.last = now
	if p.tokens >= 1 {
		p.tokens--
		return true, p.tokens, 0
	}
	return false, p.tokens, time.Duration((1 - p.tokens) / p.rate * float64(time.Second))
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.received.Add(1)
	ok, left, next := p.take(time.Now())
	h := w.Header()
	h.Set("X-RateLimit-Limit", strconv.Itoa(int(p.burst)))
	h.Set("X-RateLimit-Remaining", strconv.Itoa(int(left)))
	if !ok {
		p.throttled.Add(1)
		h.Set("Retry-After-Ms", strconv.FormatInt(max(1, next.Milliseconds()+1), 10))
		http.Error(w, `{"error":{"type":"rate_limit_error"}}`, http.StatusTooManyRequests)
		return
	}
	p.accepted.Add(1)
	h.Set("Content-Type", "application/json")
	w.Write([]byte(`{"object":"charge","status":"succeeded"}`))
}
