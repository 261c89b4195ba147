// Package naive holds the client many services run without a rate limiter,
// which the demos and the benchmarks run beside egress: on a 429 it sends
// again at once.
package naive

import (
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
)

// Retry is what many clients do: on a 429, send again at once, up to three
// times. It counts the re-sends in Retries, when set.
type Retry struct {
	Base    http.RoundTripper
	Retries *atomic.Int64
}

// RoundTrip implements http.RoundTripper.
func (n Retry) RoundTrip(req *http.Request) (*http.Response, error) {
	for attempt := 1; ; attempt++ {
		r := req
		if attempt > 1 {
			var err error
			if r, err = Resend(req); err != nil {
				return nil, err
			}
			if n.Retries != nil {
				n.Retries.Add(1)
			}
		}
		resp, err := n.Base.RoundTrip(r)
		if err != nil || resp.StatusCode != http.StatusTooManyRequests || attempt == 4 {
			return resp, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// Resend returns a copy of req to send again, with a fresh body.
func Resend(req *http.Request) (*http.Request, error) {
	r := req.Clone(req.Context())
	if req.Body != nil && req.Body != http.NoBody {
		if req.GetBody == nil {
			return nil, fmt.Errorf("cannot resend %s %s: no GetBody", req.Method, req.URL)
		}
		body, err := req.GetBody()
		if err != nil {
			return nil, err
		}
		r.Body = body
	}
	return r, nil
}
