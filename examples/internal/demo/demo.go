// Package demo holds what the examples share: the naive client they run
// beside egress, and the bars of their charts.
package demo

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
)

// NaiveRetry is what many clients do: on a 429, send again at once, up to
// three times. It counts the re-sends in Retries.
type NaiveRetry struct {
	Base    http.RoundTripper
	Retries *atomic.Int64
}

// RoundTrip implements http.RoundTripper.
func (n NaiveRetry) RoundTrip(req *http.Request) (*http.Response, error) {
	for attempt := 1; ; attempt++ {
		r := req
		if attempt > 1 {
			var err error
			if r, err = resend(req); err != nil {
				return nil, err
			}
			n.Retries.Add(1)
		}
		resp, err := n.Base.RoundTrip(r)
		if err != nil || resp.StatusCode != http.StatusTooManyRequests || attempt == 4 {
			return resp, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// resend returns a copy of req with a fresh body.
func resend(req *http.Request) (*http.Request, error) {
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

// BarWidth is the cells of a chart's bar at the chart's scale.
const BarWidth = 40

// Bar is a bar of n cells in a field of BarWidth, with the mark drawn where
// the bar does not reach it.
func Bar(n, mark int) string {
	var b strings.Builder
	for i := range BarWidth + 1 {
		switch {
		case i < n:
			b.WriteString("█")
		case i == mark:
			b.WriteString("│")
		default:
			b.WriteByte(' ')
		}
	}
	return b.String()
}
