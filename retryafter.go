package egress

import (
	"net/http"

	"github.com/egress-go/egress/internal/field"
)

// This file reads the Retry-After header of a 403, 429 or 503 (RFC 9110
// §10.2.3) and its kin, with the parsers of internal/field (field.RetryAfter
// says which values are read, and how). The providers' own dialects are
// internal/dialect's.

// The headers retryReader reads, canonical (a lookup is a plain map index).
const (
	hRetryAfter   = "Retry-After"
	hRetryAfterMs = "Retry-After-Ms"
	hShouldRetry  = "X-Should-Retry"
)

// retryReader reads the waits and retry advice any provider may send:
// Retry-After (RFC 9110: delta-seconds, decimals accepted, or an
// HTTP-date) and retry-after-ms (OpenAI, Anthropic) on a 403, 429 or 503,
// and x-should-retry: true|false (OpenAI, Anthropic) on any response.
type retryReader struct{}

// ReadSignal implements SignalReader.
func (retryReader) ReadSignal(resp *http.Response, s *Signal) {
	h := resp.Header
	switch resp.StatusCode {
	case http.StatusForbidden, http.StatusTooManyRequests, http.StatusServiceUnavailable:
		// retry-after-ms is the same wait as Retry-After, to the
		// millisecond where Retry-After is rounded up to the second: when
		// it can be read it is the one read (as openai-go and
		// anthropic-sdk-go prefer it), so that a provider that asks for
		// 100 ms is not made to wait a second.
		if d, ok := field.MillisToWait(h[hRetryAfterMs], s.parseCap()); ok {
			s.AddRetryAfter(d)
		} else if d, ok := field.RetryAfter(h[hRetryAfter], s.Now, s.parseCap()); ok {
			s.AddRetryAfter(d)
		}
	}
	if yes, no := field.AnyBool(h[hShouldRetry]); no {
		s.SetRetry(RetryNo)
	} else if yes {
		s.SetRetry(RetryYes)
	}
}
