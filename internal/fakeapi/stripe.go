package fakeapi

import (
	"bytes"
	"net/http"
)

// StripeShouldRetry wraps h, an API or any handler that answers as one,
// so that a 429 whose body is Stripe's lock_timeout (Storm.LockTimeout)
// carries Stripe-Should-Retry: true, as Stripe advises a retry of a lock
// timeout; every other answer passes unchanged. It holds a 429's header
// until the first bytes of its body tell which it is.
func StripeShouldRetry(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &stripeWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		sw.flushHeader(nil)
	})
}

// lockTimeoutCode is what marks a lock_timeout body.
var lockTimeoutCode = []byte(`"code":"lock_timeout"`)

// stripeWriter holds back the header of a 429 until its body starts.
type stripeWriter struct {
	http.ResponseWriter
	held  int  // a 429 whose header is not written yet; 0 when none
	wrote bool // the header is written
}

func (w *stripeWriter) WriteHeader(status int) {
	if w.wrote || w.held != 0 {
		return
	}
	if status == http.StatusTooManyRequests {
		w.held = status
		return
	}
	w.wrote = true
	w.ResponseWriter.WriteHeader(status)
}

func (w *stripeWriter) Write(p []byte) (int, error) {
	if !w.wrote {
		w.flushHeader(p)
	}
	return w.ResponseWriter.Write(p)
}

// flushHeader writes a held 429's header, with Stripe-Should-Retry: true
// when body is a lock timeout's.
func (w *stripeWriter) flushHeader(body []byte) {
	if w.wrote {
		return
	}
	w.wrote = true
	if w.held == 0 {
		return // nothing held: Write writes the default 200
	}
	if bytes.Contains(body, lockTimeoutCode) {
		w.Header().Set("Stripe-Should-Retry", "true")
	}
	w.ResponseWriter.WriteHeader(w.held)
}

// Unwrap gives http.ResponseController the writer underneath.
func (w *stripeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
