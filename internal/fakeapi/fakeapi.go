// Package fakeapi is a Stripe-like payments API on 127.0.0.1 that enforces
// its own rate limit over all its callers, the way a provider does: a token
// bucket of Rate per second and Burst, and 429 Too Many Requests with
// Retry-After and rate-limit headers when it is crossed. It counts what it
// saw. Tests and the example use it as the upstream.
package fakeapi

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"sync"
	"time"
)

// Config sets the provider's limit.
type Config struct {
	Rate  float64       // accepted requests per second, over all callers; > 0
	Burst int           // bucket capacity; >= 1
	Delay time.Duration // latency added to every accepted request
}

// API is a running fake provider. It is safe for concurrent use.
type API struct {
	cfg Config
	srv *httptest.Server

	mu       sync.Mutex
	tokens   float64     // guarded by mu
	last     time.Time   // guarded by mu
	requests int         // guarded by mu
	rejected int         // guarded by mu; 429s sent
	accepted []time.Time // guarded by mu; arrival of each accepted request
}

// Start runs the API on a loopback port. Close it when done.
func Start(cfg Config) (*API, error) {
	if !(cfg.Rate > 0) || math.IsInf(cfg.Rate, 0) {
		return nil, fmt.Errorf("fakeapi: Rate %v must be positive", cfg.Rate)
	}
	if cfg.Burst < 1 {
		return nil, fmt.Errorf("fakeapi: Burst %d must be at least 1", cfg.Burst)
	}
	a := &API{cfg: cfg, tokens: float64(cfg.Burst), last: time.Now()}
	a.srv = httptest.NewServer(http.HandlerFunc(a.serve))
	return a, nil
}

// URL is the API's base URL, e.g. http://127.0.0.1:41234.
func (a *API) URL() string { return a.srv.URL }

// Close stops the server.
func (a *API) Close() { a.srv.Close() }

func (a *API) serve(w http.ResponseWriter, r *http.Request) {
	ok, retry := a.take()
	h := w.Header()
	h.Set("X-RateLimit-Limit", strconv.FormatFloat(a.cfg.Rate, 'f', -1, 64))
	if !ok {
		h.Set("Retry-After", strconv.Itoa(int(math.Ceil(retry.Seconds()))))
		h.Set("X-RateLimit-Remaining", "0")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprintln(w, `{"error":{"type":"rate_limit_error"}}`)
		return
	}
	if a.cfg.Delay > 0 {
		time.Sleep(a.cfg.Delay)
	}
	h.Set("Content-Type", "application/json")
	fmt.Fprintln(w, `{"object":"charge","status":"succeeded"}`)
}

// take spends a token, or says how long until one is there.
func (a *API) take() (bool, time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now() // under mu, so that the bucket sees time in order
	a.requests++
	a.tokens = math.Min(float64(a.cfg.Burst), a.tokens+now.Sub(a.last).Seconds()*a.cfg.Rate)
	a.last = now
	if a.tokens >= 1 {
		a.tokens--
		a.accepted = append(a.accepted, now)
		return true, 0
	}
	a.rejected++
	return false, time.Duration((1 - a.tokens) / a.cfg.Rate * float64(time.Second))
}

// Stats is what the API saw.
type Stats struct {
	Requests int // all requests
	Accepted int // answered 200
	Rejected int // answered 429
	// MaxPerSecond is the most requests accepted in any one-second window.
	MaxPerSecond int
	// PerSecond is the number accepted in each whole second since start.
	PerSecond []int
}

// Stats returns the counts so far, with windows measured from start.
func (a *API) Stats(start time.Time) Stats {
	a.mu.Lock()
	acc := append([]time.Time(nil), a.accepted...)
	s := Stats{Requests: a.requests, Accepted: len(a.accepted), Rejected: a.rejected}
	a.mu.Unlock()
	s.MaxPerSecond = MaxInWindow(acc, time.Second)
	for _, t := range acc {
		i := int(t.Sub(start) / time.Second)
		if i < 0 {
			continue
		}
		for len(s.PerSecond) <= i {
			s.PerSecond = append(s.PerSecond, 0)
		}
		s.PerSecond[i]++
	}
	return s
}

// MaxInWindow returns the most times that fall in any window [t, t+w).
func MaxInWindow(times []time.Time, w time.Duration) int {
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	best, lo := 0, 0
	for hi := range times {
		for times[hi].Sub(times[lo]) >= w {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}
