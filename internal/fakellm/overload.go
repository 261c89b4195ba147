package fakellm

import (
	"io"
	"net/http"
	"strconv"
	"time"
)

// StatusOverloaded is Anthropic's 529, "overloaded_error": the API is
// overloaded for every caller, whatever their limits.
const StatusOverloaded = 529

// Outage is a provider that serves nothing: an http.Handler that answers
// every request to either endpoint with the same error status, in the
// endpoint's dialect, whatever its limits, as a provider does while it is
// overloaded or throttles every call. It spends and counts nothing; a test
// counts the attempts itself. Any other path is answered 404, as by a
// Server. The zero Outage answers 503 on ChatCompletionsPath (OpenAI's
// "The server is overloaded or not ready yet.") and 529 on MessagesPath
// (Anthropic's overloaded_error), without Retry-After. It is safe for
// concurrent use.
type Outage struct {
	// Status is the status of every answer: 429 is the dialect's rate-limit
	// error, 503 and 529 its overload error, any other 4xx or 5xx a
	// server error. Zero: 503 (OpenAI) or 529 (Anthropic); a status outside
	// 400 to 599 counts as 500.
	Status int
	// RetryAfter is sent as retry-after, in whole seconds rounded up (at
	// least 1), and on the OpenAI endpoint also as retry-after-ms. Zero:
	// neither.
	RetryAfter time.Duration
}

// ServeHTTP answers r with the outage's status and the dialect's error
// body, after reading (and discarding) the request body.
func (o Outage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d, ok := dialectFor(r.URL.Path)
	if !ok {
		writeNotFound(w, r)
		return
	}
	io.Copy(io.Discard, io.LimitReader(r.Body, maxBody))
	status := o.status(d)
	if o.RetryAfter > 0 {
		if _, ok := d.(openAI); ok {
			d.writeRetry(w.Header(), o.RetryAfter) // retry-after-ms and retry-after
		} else {
			w.Header().Set("retry-after", retrySeconds(o.RetryAfter))
		}
	}
	writeJSON(w, status, outageBody(d, status))
}

// status is the status of every answer on the endpoint of d.
func (o Outage) status(d dialect) int {
	switch {
	case o.Status == 0:
		if _, ok := d.(anthropic); ok {
			return StatusOverloaded
		}
		return http.StatusServiceUnavailable
	case o.Status < 400 || o.Status > 599:
		return http.StatusInternalServerError
	}
	return o.Status
}

// outageBody is the error body of status in dialect d.
func outageBody(d dialect, status int) []byte {
	if _, ok := d.(anthropic); ok {
		switch status {
		case http.StatusTooManyRequests:
			return anthropicErrorBody("rate_limit_error", "Number of requests has exceeded your rate limit. Please try again later.")
		case http.StatusServiceUnavailable, StatusOverloaded:
			return anthropicErrorBody("overloaded_error", "Overloaded")
		}
		if status < 500 {
			return anthropicErrorBody("invalid_request_error", "Status "+strconv.Itoa(status)+".")
		}
		return anthropicErrorBody("api_error", "Internal server error")
	}
	switch status {
	case http.StatusTooManyRequests:
		code := "rate_limit_exceeded"
		return openAIErrorBody("Rate limit reached for requests. Please try again later.", "requests", &code)
	case http.StatusServiceUnavailable, StatusOverloaded:
		return openAIErrorBody("The server is overloaded or not ready yet.", "server_error", nil)
	}
	if status < 500 {
		return openAIErrorBody("Status "+strconv.Itoa(status)+".", "invalid_request_error", nil)
	}
	return openAIErrorBody("The server had an error while processing your request. Sorry about that!", "server_error", nil)
}
