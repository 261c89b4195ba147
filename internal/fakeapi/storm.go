package fakeapi

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Storm makes the API throttle requests that its limits would accept, the
// way a lock timeout or load shedding does: a share of them is answered
// Status with a fixed Retry-After, whatever the rate. A throttled request
// spends nothing from the limits. The zero Storm throttles nothing.
type Storm struct {
	// Share is the share, in [0, 1], of the requests within the limits
	// that are throttled, drawn from the API's seeded generator. Zero: none.
	Share float64
	// Status is the status of a throttled request: 429 Too Many Requests
	// or 503 Service Unavailable. Zero: 429.
	Status int
	// RetryAfter is the Retry-After sent with a throttled request, written
	// the dialect's way (whole seconds rounded up in most). Zero: none.
	RetryAfter time.Duration
	// Bare leaves the rate-limit headers off throttled responses. When
	// false, they show the limits' real state (remaining > 0), as on any
	// other response.
	Bare bool
	// LockTimeout answers with Stripe's lock_timeout body,
	// {"error":{"code":"lock_timeout",...}}, instead of the dialect's
	// rate-limit body.
	LockTimeout bool
}

// status is the status a throttled request is answered with.
func (s Storm) status() int {
	if s.Status == 0 {
		return http.StatusTooManyRequests
	}
	return s.Status
}

func (s Storm) validate() error {
	var errs []error
	if !(s.Share >= 0 && s.Share <= 1) {
		errs = append(errs, fmt.Errorf("fakeapi: Storm.Share %v: must be a share in [0, 1]", s.Share))
	}
	if s.Status != 0 && s.Status != http.StatusTooManyRequests && s.Status != http.StatusServiceUnavailable {
		errs = append(errs, fmt.Errorf("fakeapi: Storm.Status %d: must be 429 or 503", s.Status))
	}
	if s.RetryAfter < 0 {
		errs = append(errs, fmt.Errorf("fakeapi: Storm.RetryAfter %v: must not be negative", s.RetryAfter))
	}
	return errors.Join(errs...)
}

// cause is why the API answered a request the way it did.
type cause int

const (
	causeNone        cause = iota // not known: counted by status alone
	causeAccepted                 // within the limits; 200, or 400 if invalid
	causeRefused                  // over a limit: 429, or 403 in some dialects
	causeStorm                    // throttled by the storm: 429 or 503
	causeBilling                  // insufficient_quota: 429
	causeUnavailable              // an injected 503
)
