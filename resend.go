package egress

import (
	"bytes"
	"context"
	"errors"
	"hash/fnv"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/dialect"
)

// A provider's SDK (openai-go, anthropic-sdk-go, stripe-go) that has a
// Transport as its HTTP client retries on its own: a response with a
// retryable status, and any error of the HTTP client, which it takes for a
// connection error; stripe-go also a 429 whose body says lock_timeout,
// whatever its headers say. When the Transport retries too (WithRetry), the
// two layers' attempts multiply, and a request egress refused without
// sending it is sent by the SDK's retry. resends is what keeps the
// Transport the one layer that retries (see RetryPolicy.SDKRetries): it
// marks the responses it returns as final, in the words the SDKs honour;
// it answers an SDK's resend of a call it ended with an error with that
// same error, without sending it; and it answers the resend of a call
// that carries an Idempotency-Key, which it ended with an error status,
// with a copy of that response (its body kept, up to replayLimit), again
// without sending it.

// The request headers that tell a resend: the attempt number the Stainless
// SDKs send (0 on a call's first attempt), and the key stripe-go sends
// again with every attempt of a POST. (The response headers that tell an
// SDK not to retry, x-should-retry and Stripe-Should-Retry, are read by
// the dialects too: retryafter.go and internal/dialect.)
const (
	hStainlessRetry = "X-Stainless-Retry-Count"
	hIdempotencyKey = "Idempotency-Key"
)

// resendMemory is how long a call's error is kept for its SDK's resends:
// the SDKs' own retries come within a few seconds (openai-go and
// anthropic-sdk-go after 0.5 and 1 s, stripe-go after 0.5 s and more),
// and a caller's own retry after longer is a new decision.
const resendMemory = 10 * time.Second

// maxRemembered bounds the calls remembered; past it the oldest goes.
const maxRemembered = 4096

// callID names a call across its SDK's attempts: the same method, host,
// path and Idempotency-Key (empty when none), and either the same context
// deadline (zero when none: stripe-go resends a call with its context) or,
// for the Stainless SDKs, the same body (with WithRequestTimeout they give
// each attempt a deadline of its own).
type callID struct {
	method, host, path, idem string
	deadline                 time.Time
	body                     uint64 // FNV-1a of the body, through GetBody; 0 when none
}

type remembered struct {
	err   error
	resp  *replay // the final response, when the call ended with one
	until time.Time
}

// replay is a final response kept to answer a resend with.
type replay struct {
	status int
	proto  string
	major  int
	minor  int
	header http.Header
	body   []byte
}

// replayLimit is the largest body a final response is kept with: an error
// body (Stripe's lock_timeout is about 300 bytes). A longer one is not
// kept, and its call's resend is sent.
const replayLimit = 16 << 10

// response returns a copy of the kept response, as the answer to req.
func (p *replay) response(req *http.Request) *http.Response {
	return &http.Response{
		Status: strconv.Itoa(p.status) + " " + http.StatusText(p.status), StatusCode: p.status,
		Proto: p.proto, ProtoMajor: p.major, ProtoMinor: p.minor,
		Header: p.header.Clone(), Body: io.NopCloser(bytes.NewReader(p.body)),
		ContentLength: int64(len(p.body)), Request: req,
	}
}

// resends remembers, for resendMemory, the errors a Transport ended calls
// with. It is safe for concurrent use; its zero value is ready.
type resends struct {
	n     atomic.Int32 // len(calls), read without mu on every request
	mu    sync.Mutex
	calls map[callID]remembered // guarded by mu
	order []callID              // guarded by mu; oldest first
}

// resent reports whether req may be an SDK's resend of a call: its
// Stainless attempt number is above 0, or it carries an Idempotency-Key.
// It allocates nothing.
func resent(req *http.Request) bool {
	if v := req.Header[hStainlessRetry]; len(v) > 0 && v[0] != "" && v[0] != "0" {
		return true
	}
	return len(req.Header[hIdempotencyKey]) > 0
}

// idOf returns req's call. It reads the body (a copy, through GetBody) of
// a Stainless SDK's request: it is called only when a call ends with an
// error and on a resend.
func idOf(req *http.Request) callID {
	id := callID{method: req.Method, host: req.URL.Host, path: req.URL.Path}
	if v := req.Header[hIdempotencyKey]; len(v) > 0 {
		id.idem = v[0]
	}
	if _, ok := req.Header[hStainlessRetry]; ok {
		id.body = bodyHash(req)
	} else {
		id.deadline, _ = req.Context().Deadline()
	}
	return id
}

// bodyHash returns the FNV-1a hash of a copy of req's body, or 0 when it
// has none that can be read again.
func bodyHash(req *http.Request) uint64 {
	if req.GetBody == nil {
		return 0
	}
	body, err := req.GetBody()
	if err != nil {
		return 0
	}
	defer body.Close()
	h := fnv.New64a()
	if _, err := io.Copy(h, body); err != nil {
		return 0
	}
	return h.Sum64()
}

// recall returns how the Transport ended req's call — its error, or a copy
// of its final response — when req is a resend of it within
// resendMemory; ok is false otherwise.
// It reads the clock only then: the allowed path pays nothing for it.
func (r *resends) recall(req *http.Request, clk clock.Clock) (resp *http.Response, err error, ok bool) {
	if r.n.Load() == 0 || !resent(req) {
		return nil, nil, false
	}
	now := clk.Now()
	id := idOf(req)
	r.mu.Lock()
	c, found := r.calls[id]
	r.mu.Unlock()
	switch {
	case !found || !now.Before(c.until):
		return nil, nil, false
	case c.resp != nil:
		return c.resp.response(req), nil, true
	}
	return nil, c.err, true
}

// end keeps how the Transport ended req's call, for its SDK's resends: an
// error, unless the call's own context ended it (its SDK does not resend
// that); or, when req carries an Idempotency-Key, a response with an error
// status whose body fits replayLimit (the body is read here, and resp's
// body replaced with what was read).
func (r *resends) end(req *http.Request, resp *http.Response, err error, c clock.Clock) {
	if _, stainless := req.Header[hStainlessRetry]; !stainless && len(req.Header[hIdempotencyKey]) == 0 {
		return // nothing would tell its resend (see resent): not kept
	}
	switch {
	case err != nil:
		if req.Context().Err() == nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			r.remember(req, remembered{err: err}, c.Now())
		}
	case resp.StatusCode >= 400 && len(req.Header[hIdempotencyKey]) > 0:
		if p := keep(resp); p != nil {
			r.remember(req, remembered{resp: p}, c.Now())
		}
	}
}

// keep reads resp's body, when it fits replayLimit, and returns the
// response to replay; resp keeps a body that reads the same.
func keep(resp *http.Response) *replay {
	if resp.Body == nil || resp.Body == http.NoBody {
		return &replay{status: resp.StatusCode, proto: resp.Proto, major: resp.ProtoMajor, minor: resp.ProtoMinor, header: resp.Header.Clone()}
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, replayLimit+1))
	if err != nil || len(body) > replayLimit {
		resp.Body = &prefixBody{Reader: io.MultiReader(bytes.NewReader(body), resp.Body), Closer: resp.Body}
		return nil
	}
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return &replay{status: resp.StatusCode, proto: resp.Proto, major: resp.ProtoMajor, minor: resp.ProtoMinor, header: resp.Header.Clone(), body: body}
}

// prefixBody is a body part of which was read ahead: the part, then the
// rest; closing it closes the original.
type prefixBody struct {
	io.Reader
	io.Closer
}

// remember keeps c as the end of req's call.
func (r *resends) remember(req *http.Request, c remembered, now time.Time) {
	id := idOf(req)
	c.until = now.Add(resendMemory)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.calls == nil {
		r.calls = make(map[callID]remembered)
	}
	r.forget(now)
	if _, ok := r.calls[id]; !ok {
		r.order = append(r.order, id)
	}
	r.calls[id] = c
	r.n.Store(int32(len(r.calls)))
}

// forget drops the calls remembered past their time, and the oldest when
// there are too many. (A call remembered again keeps its first place.)
// The caller holds mu.
func (r *resends) forget(now time.Time) {
	drop := 0
	for ; drop < len(r.order); drop++ {
		id := r.order[drop]
		if now.Before(r.calls[id].until) && len(r.order)-drop < maxRemembered {
			break
		}
		delete(r.calls, id)
	}
	if drop > 0 {
		r.order = append(r.order[:0], r.order[drop:]...)
	}
}

// markFinal tells an SDK above the Transport not to retry resp: egress
// already retried it as its policy allows, or decided it is not worth it.
// A response without an error status is left as it is (no SDK retries
// one), so that the allowed path costs nothing.
func markFinal(resp *http.Response) {
	if resp == nil || resp.StatusCode < 400 {
		return
	}
	if resp.Header == nil {
		resp.Header = make(http.Header, 2)
	}
	v := make([]string, 2) // one allocation for both
	v[0], v[1] = "false", "false"
	resp.Header[hShouldRetry] = v[0:1:1]
	resp.Header[dialect.StripeShouldRetry] = v[1:2:2]
}
