package fakeapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"
)

// maxBody is the most of a JSON body the API reads.
const maxBody = 1 << 20

// ServeHTTP answers a request: 429 insufficient_quota for a drawn billing
// error, else 429 (or the dialect's refusal status) over a limit, else
// maybe a storm's 429 or 503, else maybe an injected 503, else 400 for a
// charge without an amount, else 200.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c, valid := a.read(r)
	ans := a.decide(c, valid)
	if !pause(r.Context(), a.cfg.Latency) {
		return // the caller has gone
	}
	a.writeHeaders(w.Header(), &ans)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(ans.status)
	fmt.Fprintln(w, a.body(&ans))
}

// read returns the request's cost and whether it is valid: a POST must
// carry either a form with an amount (a charge) or a JSON object (a
// completion, whose max_tokens is its output cost).
func (a *API) read(r *http.Request) (cost, bool) {
	var c cost
	valid := true
	maxTokens := -1
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt == "application/json" {
		var req struct {
			MaxTokens *int `json:"max_tokens"`
		}
		err := json.NewDecoder(io.LimitReader(r.Body, maxBody)).Decode(&req)
		valid = r.Method != http.MethodPost || err == nil
		if err == nil && req.MaxTokens != nil {
			maxTokens = *req.MaxTokens
		}
	} else if r.Method == http.MethodPost {
		valid = r.PostFormValue("amount") != ""
	}
	if a.tokens {
		c.input = headerCount(r.Header, InputTokensHeader, 0)
		c.output = headerCount(r.Header, OutputTokensHeader, max(0, maxTokens))
	}
	return c, valid
}

// headerCount is the non-negative integer in header name, or def.
func headerCount(h http.Header, name string, def int) int {
	n, err := strconv.Atoi(h.Get(name))
	if err != nil || n < 0 {
		return def
	}
	return n
}

// decide draws a billing error, fits the request to the limits, draws a
// storm or an injected 503, charges the limits, and counts the outcome,
// all at one instant.
func (a *API) decide(c cost, valid bool) answer {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now() // under mu, so that the limits see time in order
	ans := answer{now: now, status: http.StatusOK, cause: causeAccepted, by: -1}
	billing := a.draw(a.cfg.InsufficientQuota)
	fits, by, wait := a.limits.fit(now, c)
	switch {
	case billing:
		ans.status, ans.cause = http.StatusTooManyRequests, causeBilling
	case !fits:
		ans.status, ans.cause, ans.by, ans.retryAfter = a.cfg.Dialect.refusalStatus(), causeRefused, by, wait
	case a.draw(a.cfg.Storm.Share):
		ans.status, ans.cause, ans.retryAfter = a.cfg.Storm.status(), causeStorm, a.cfg.Storm.RetryAfter
	default:
		a.limits.charge(c)
		switch {
		case a.draw(a.cfg.Unavailable):
			ans.status, ans.cause = http.StatusServiceUnavailable, causeUnavailable
		case !valid:
			ans.status = http.StatusBadRequest
		}
	}
	ans.readings = a.limits.read(a.cfg.BucketReset)
	a.counts.add(now, ans.status, ans.cause)
	return ans
}

// draw reports whether an event of probability share happens; it draws
// from the generator only for a positive share, so that a share of 0
// leaves the other draws as they were. Call it with mu held.
func (a *API) draw(share float64) bool {
	return share > 0 && a.rng.Float64() < share
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
