package fakeapi

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// decision is how the API answers one request, and the state of its limit
// right after.
type decision struct {
	status     int
	rate       float64       // enforced now
	remaining  int           // whole tokens left
	retryAfter time.Duration // until a token is back; for a 429
	reset      time.Duration // until the bucket is full again
}

// ServeHTTP answers a request: 429 over the limit, else maybe an injected
// 503, else 400 for a charge without an amount, else 200.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	valid := r.Method != http.MethodPost || r.PostFormValue("amount") != ""
	d := a.decide(valid)
	if !pause(r.Context(), a.cfg.Latency) {
		return // the caller has gone
	}
	a.writeHeaders(w.Header(), d)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(d.status)
	fmt.Fprintln(w, body(d.status))
}

// decide takes a token, draws an injected 503, and counts the outcome, all
// at one instant.
func (a *API) decide(valid bool) decision {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now() // under mu, so that the bucket sees time in order
	d := decision{status: http.StatusOK}
	switch {
	case !a.bucket.take(now):
		d.status = http.StatusTooManyRequests
		d.retryAfter = a.bucket.untilNext()
	case a.cfg.Unavailable > 0 && a.rng.Float64() < a.cfg.Unavailable:
		d.status = http.StatusServiceUnavailable
	case !valid:
		d.status = http.StatusBadRequest
	}
	d.rate, d.remaining, d.reset = a.bucket.rate, a.bucket.remaining(), a.bucket.untilFull()
	a.counts.Add(now, d.status)
	return d
}

// writeHeaders sets Retry-After on a 429 and, when the API advertises its
// limit, the rate-limit headers on every response.
func (a *API) writeHeaders(h http.Header, d decision) {
	if d.status == http.StatusTooManyRequests {
		h.Set("Retry-After", strconv.FormatInt(max(1, ceilSeconds(d.retryAfter)), 10))
	}
	if !a.cfg.Advertise {
		return
	}
	q := strconv.FormatFloat(d.rate, 'f', -1, 64)
	h.Set("RateLimit-Policy", `"default";q=`+q+`;w=1`)
	h.Set("RateLimit", fmt.Sprintf(`"default";r=%d;t=%d`, d.remaining, ceilSeconds(d.reset)))
	h.Set("X-RateLimit-Limit", q)
	h.Set("X-RateLimit-Remaining", strconv.Itoa(d.remaining))
}

// body is a Stripe-like JSON body for status.
func body(status int) string {
	switch status {
	case http.StatusOK:
		return `{"object":"charge","status":"succeeded"}`
	case http.StatusTooManyRequests:
		return `{"error":{"type":"rate_limit_error","message":"Too many requests hit the API too quickly."}}`
	case http.StatusServiceUnavailable:
		return `{"error":{"type":"api_error","message":"The service is temporarily unavailable."}}`
	default:
		return `{"error":{"type":"invalid_request_error","message":"Missing required param: amount."}}`
	}
}

// pause waits d, or less if ctx ends first; it reports whether it waited
// all of d.
func pause(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
