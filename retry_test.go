package egress

// Tests of the retry policy (retry.go) and of the retry loop in RoundTrip.
// The helpers of this file carry an rty prefix; the recording server, the
// observer recorder and the body spy are in helpers_test.go. The tests in
// this file barely wait on
// the wall clock: backoffs are 0 or a few milliseconds, and Retry-After
// waits run on a fake clock. Real-time retries, measured at the server, are
// in retry_timing_test.go.

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/clock"
)

// rtyHangUp is a script step that reads the request and closes the
// connection without answering: the client sees a network error.
func rtyHangUp(w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		conn.Close()
	}
}

// newRtyTransport returns a Transport with WithRetry(p) and opts whose
// backoff is always 0, so that only Retry-After makes it wait.
func newRtyTransport(t *testing.T, base http.RoundTripper, p RetryPolicy, opts ...Option) *Transport {
	t.Helper()
	tr, err := New(base, append([]Option{WithRetry(p)}, opts...)...)
	require.NoError(t, err)
	tr.rand = func() float64 { return 0 }
	return tr
}

// rtyRequest returns a request to target with the test's marker header and,
// when body is not empty, a strings.Reader body (which sets GetBody).
func rtyRequest(t *testing.T, ctx context.Context, method, target, body string, header ...string) *http.Request {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, r)
	require.NoError(t, err)
	req.Header.Set("X-Test", "retry-marker")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return req
}

// rtyRead reads and closes the body of resp.
func rtyRead(t *testing.T, resp *http.Response) string {
	t.Helper()
	require.NotNil(t, resp)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return string(b)
}

// rtyAssertUnchanged checks that every attempt arrived at the server as the
// caller wrote req, with body.
func rtyAssertUnchanged(t *testing.T, s *recServer, req *http.Request, body string) {
	t.Helper()
	for i, h := range s.arrivals() {
		assert.Equal(t, req.Method, h.method, "attempt %d: method", i+1)
		assert.Equal(t, req.URL.RequestURI(), h.uri, "attempt %d: path and query", i+1)
		for _, k := range []string{"X-Test", "Idempotency-Key", "Content-Type"} {
			assert.Equal(t, req.Header.Values(k), h.header.Values(k), "attempt %d: header %s", i+1, k)
		}
		assert.Equal(t, body, h.body, "attempt %d: body", i+1)
	}
}

// rtyClosedAddr returns a 127.0.0.1 address nothing listens on: dialing it
// fails at once with "connection refused".
func rtyClosedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

func TestRetryPolicyValidation(t *testing.T) {
	tests := []struct {
		name   string
		policy RetryPolicy
		field  string // the field the error must name
		value  string // and the value it must quote
	}{
		{"negative MaxAttempts", RetryPolicy{MaxAttempts: -1}, "RetryPolicy.MaxAttempts", "-1"},
		{"negative BaseDelay", RetryPolicy{BaseDelay: -time.Millisecond}, "RetryPolicy.BaseDelay", "-1ms"},
		{"negative MaxDelay", RetryPolicy{MaxDelay: -time.Second}, "RetryPolicy.MaxDelay", "-1s"},
		{"negative MaxElapsed", RetryPolicy{MaxElapsed: -time.Minute}, "RetryPolicy.MaxElapsed", "-1m0s"},
		{"negative MaxRetryAfter", RetryPolicy{MaxRetryAfter: -2 * time.Second}, "RetryPolicy.MaxRetryAfter", "-2s"},
		{"negative BudgetRatio", RetryPolicy{BudgetRatio: -0.5}, "RetryPolicy.BudgetRatio", "-0.5"},
		{"NaN BudgetRatio", RetryPolicy{BudgetRatio: math.NaN()}, "RetryPolicy.BudgetRatio", "NaN"},
		{"negative BudgetFloor", RetryPolicy{BudgetFloor: -3}, "RetryPolicy.BudgetFloor", "-3"},
		{"status 42", RetryPolicy{RetryableStatuses: []int{429, 42}}, "RetryPolicy.RetryableStatuses", "42"},
		{"status 600", RetryPolicy{RetryableStatuses: []int{600}}, "RetryPolicy.RetryableStatuses", "600"},
		{"status 0", RetryPolicy{RetryableStatuses: []int{0}}, "RetryPolicy.RetryableStatuses", "0"},
		{"MaxDelay below BaseDelay", RetryPolicy{BaseDelay: time.Second, MaxDelay: 100 * time.Millisecond}, "RetryPolicy.MaxDelay", "100ms"},
		{"MaxDelay below a BaseDelay above the default MaxDelay", RetryPolicy{BaseDelay: 20 * time.Second, MaxDelay: 15 * time.Second}, "RetryPolicy.MaxDelay", "15s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := New(nil, WithRetry(tt.policy))
			require.Error(t, err)
			assert.Nil(t, tr)
			assert.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), tt.field)
			assert.Contains(t, err.Error(), " "+tt.value+":", "the error quotes the value")
		})
	}
}

func TestRetryPolicyDefaults(t *testing.T) {
	tests := []struct {
		name   string
		policy RetryPolicy
		want   RetryPolicy // without Classify
	}{
		{
			name:   "zero policy takes every default",
			policy: RetryPolicy{},
			want: RetryPolicy{
				MaxAttempts: 3, BaseDelay: 200 * time.Millisecond, MaxDelay: 10 * time.Second,
				MaxElapsed: time.Minute, MaxRetryAfter: time.Minute,
				RetryableStatuses: []int{429, 502, 503, 504, 529}, BudgetRatio: 0.2, BudgetFloor: 10,
			},
		},
		{
			name: "set fields are kept",
			policy: RetryPolicy{
				MaxAttempts: 7, BaseDelay: time.Millisecond, MaxDelay: time.Second,
				MaxElapsed: 5 * time.Second, MaxRetryAfter: 3 * time.Second,
				RetryableStatuses: []int{500}, BudgetRatio: 0.5, BudgetFloor: 1, ErrorOnExhausted: true,
			},
			want: RetryPolicy{
				MaxAttempts: 7, BaseDelay: time.Millisecond, MaxDelay: time.Second,
				MaxElapsed: 5 * time.Second, MaxRetryAfter: 3 * time.Second,
				RetryableStatuses: []int{500}, BudgetRatio: 0.5, BudgetFloor: 1, ErrorOnExhausted: true,
			},
		},
		{
			name:   "a BaseDelay above the default MaxDelay raises MaxDelay to it",
			policy: RetryPolicy{BaseDelay: 20 * time.Second},
			want: RetryPolicy{
				MaxAttempts: 3, BaseDelay: 20 * time.Second, MaxDelay: 20 * time.Second,
				MaxElapsed: time.Minute, MaxRetryAfter: time.Minute,
				RetryableStatuses: []int{429, 502, 503, 504, 529}, BudgetRatio: 0.2, BudgetFloor: 10,
			},
		},
		{
			name:   "an empty, non-nil status list is kept: no status is retried",
			policy: RetryPolicy{RetryableStatuses: []int{}},
			want: RetryPolicy{
				MaxAttempts: 3, BaseDelay: 200 * time.Millisecond, MaxDelay: 10 * time.Second,
				MaxElapsed: time.Minute, MaxRetryAfter: time.Minute,
				RetryableStatuses: []int{}, BudgetRatio: 0.2, BudgetFloor: 10,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := New(nil, WithRetry(tt.policy))
			require.NoError(t, err)
			require.NotNil(t, tr.retry)
			assert.Equal(t, tt.want, *tr.retry)
			assert.Equal(t, tt.want.BudgetRatio, tr.budget.ratio)
			assert.Equal(t, tt.want.BudgetFloor, tr.budget.floor)
		})
	}

	t.Run("holds are capped at two minutes, or WithMaxPause", func(t *testing.T) {
		tr, err := New(nil)
		require.NoError(t, err)
		assert.Nil(t, tr.retry)
		assert.Equal(t, 2*time.Minute, tr.maxPause)
		tr, err = New(nil, WithRetry(RetryPolicy{MaxRetryAfter: time.Hour}), WithMaxPause(5*time.Second))
		require.NoError(t, err)
		assert.Equal(t, 5*time.Second, tr.maxPause, "MaxRetryAfter does not set the pause cap")
		_, err = New(nil, WithMaxPause(0))
		require.ErrorIs(t, err, ErrInvalidConfig)
		assert.Contains(t, err.Error(), "WithMaxPause")
	})

	t.Run("the caller's status list is copied", func(t *testing.T) {
		statuses := []int{503}
		tr, err := New(nil, WithRetry(RetryPolicy{RetryableStatuses: statuses}))
		require.NoError(t, err)
		statuses[0] = 500
		assert.Equal(t, []int{503}, tr.retry.RetryableStatuses)
	})
}

func TestRetryBudgetSteps(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	type step struct {
		at       time.Duration // from t0
		deposits int           // first attempts recorded at this time, before the withdrawal
		want     []bool        // the outcome of each withdrawal, in order
	}
	tests := []struct {
		name  string
		ratio float64
		floor int
		steps []step
	}{
		{
			name: "the floor while the first attempts are few, ratio times them once that is more (not both)", ratio: 0.5, floor: 2,
			steps: []step{
				{at: 0, want: []bool{true, true, false}},                                          // floor 2
				{at: 0, deposits: 2, want: []bool{false}},                                         // max(0.5·2, 2) = 2, 2 spent
				{at: 5 * time.Second, deposits: 4, want: []bool{true, false}},                     // max(0.5·6, 2) = 3
				{at: 9*time.Second + 999*time.Millisecond, want: []bool{false}},                   // t0's second still counts
				{at: 10 * time.Second, want: []bool{true, false}},                                 // t0's slot expired: max(0.5·4, 2) = 2, 1 spent
				{at: 15 * time.Second, deposits: 10, want: []bool{true, true, true, true, false}}, // t0+5s expired: max(0.5·10, 2) = 5, 1 spent at t0+10s
				{at: 20 * time.Second, want: []bool{true, false}},                                 // t0+10s expired: 5, 4 spent at t0+15s
				{at: 25 * time.Second, want: []bool{true, false}},                                 // t0+15s expired: the floor, 1 spent at t0+20s
			},
		},
		{
			name: "no floor: a fraction of a retry is not a retry", ratio: 0.2, floor: 0,
			steps: []step{
				{at: 0, want: []bool{false}},
				{at: 0, deposits: 4, want: []bool{false}},       // 0.8
				{at: 0, deposits: 1, want: []bool{true, false}}, // 1.0
				{at: time.Second, deposits: 5, want: []bool{true, false}},
			},
		},
		{
			name: "a slot reused ten seconds later starts empty", ratio: 1, floor: 0,
			steps: []step{
				{at: 3 * time.Second, deposits: 3, want: []bool{true, true, true, false}},
				{at: 13 * time.Second, want: []bool{false}},
				{at: 13 * time.Second, deposits: 1, want: []bool{true, false}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := retryBudget{ratio: tt.ratio, floor: tt.floor}
			for i, s := range tt.steps {
				now := t0.Add(s.at)
				for range s.deposits {
					b.deposit(now)
				}
				for j, want := range s.want {
					assert.Equal(t, want, b.withdraw(now, false), "step %d (t0+%v), withdrawal %d", i, s.at, j)
				}
			}
		})
	}
}

func TestRetryWhatIsRetried(t *testing.T) {
	ok := rtyA(http.StatusOK)
	tests := []struct {
		name       string
		method     string
		header     []string // request headers
		first      rtyAnswer
		wantSent   int
		wantStatus int
	}{
		{"GET 503 is retried", http.MethodGet, nil, rtyA(503), 2, 200},
		{"GET 502 is retried", http.MethodGet, nil, rtyA(502), 2, 200},
		{"GET 504 is retried", http.MethodGet, nil, rtyA(504), 2, 200},
		{"HEAD 503 is retried", http.MethodHead, nil, rtyA(503), 2, 200},
		{"PUT 502 is retried", http.MethodPut, nil, rtyA(502), 2, 200},
		{"DELETE 504 is retried", http.MethodDelete, nil, rtyA(504), 2, 200},
		{"OPTIONS 503 is retried", http.MethodOptions, nil, rtyA(503), 2, 200},
		{"GET 500 is not a retryable status", http.MethodGet, nil, rtyA(500), 1, 500},
		{"GET 404 is not retried", http.MethodGet, nil, rtyA(404), 1, 404},
		{"GET 200 is not retried", http.MethodGet, nil, rtyA(200), 1, 200},
		{"POST 503 without Retry-After is retried: overload, not processed", http.MethodPost, nil, rtyA(503), 2, 200},
		{"POST 529 is retried: overload, not processed", http.MethodPost, nil, rtyA(529), 2, 200},
		{"POST 502 is not retried", http.MethodPost, nil, rtyA(502), 1, 502},
		{"PATCH 504 is not retried", http.MethodPatch, nil, rtyA(504), 1, 504},
		{"POST 429 is retried", http.MethodPost, nil, rtyA(429), 2, 200},
		{"POST 429 with Retry-After is retried", http.MethodPost, nil, rtyA(429, "Retry-After", "0"), 2, 200},
		{"POST 503 with Retry-After is retried", http.MethodPost, nil, rtyA(503, "Retry-After", "0"), 2, 200},
		{"POST 503 with a past HTTP-date Retry-After is retried", http.MethodPost, nil,
			rtyA(503, "Retry-After", "Sun, 06 Nov 1994 08:49:37 GMT"), 2, 200},
		{"POST 503 with an unusable Retry-After is retried as overload", http.MethodPost, nil, rtyA(503, "Retry-After", "soon"), 2, 200},
		{"POST 503 with Idempotency-Key is retried", http.MethodPost, []string{"Idempotency-Key", "k-1"}, rtyA(503), 2, 200},
		{"PATCH 502 with Idempotency-Key is retried", http.MethodPatch, []string{"Idempotency-Key", "k-2"}, rtyA(502), 2, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // each waits out its retry's pause on the real clock
			srv := newRecServer(t, rtyScript(tt.first, ok))
			tr := newRtyTransport(t, srv.pooled(t), RetryPolicy{})
			body := ""
			if tt.method != http.MethodHead && tt.method != http.MethodOptions && tt.method != http.MethodDelete {
				body = "amount=100&currency=eur"
			}
			req := rtyRequest(t, context.Background(), tt.method, srv.URL+"/v1/charges?expand=true", body, tt.header...)
			before := req.Header.Clone()

			resp, err := tr.RoundTrip(req)
			require.NoError(t, err)
			got := rtyRead(t, resp)

			assert.Equal(t, tt.wantStatus, resp.StatusCode)
			if tt.method != http.MethodHead {
				assert.Equal(t, fmt.Sprintf("attempt %d: %d", tt.wantSent, tt.wantStatus), got, "the caller reads the last response's body")
			}
			assert.Equal(t, tt.wantSent, srv.count(), "attempts seen by the server")
			rtyAssertUnchanged(t, srv, req, body)
			assert.Equal(t, before, req.Header, "the caller's request is not modified")
		})
	}
}

func TestRetryResendsTheSameBody(t *testing.T) {
	payload := `{"amount":1999,"currency":"eur","description":"` + strings.Repeat("é", 300) + `"}`
	tests := []struct {
		name string
		body func() io.Reader
	}{
		{"strings.Reader", func() io.Reader { return strings.NewReader(payload) }},
		{"bytes.Reader", func() io.Reader { return bytes.NewReader([]byte(payload)) }},
		{"bytes.Buffer", func() io.Reader { return bytes.NewBufferString(payload) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newRecServer(t, rtyScript(rtyA(429), rtyA(429, "Retry-After", "0"), rtyA(201)))
			tr := newRtyTransport(t, srv.pooled(t), RetryPolicy{MaxAttempts: 5})
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", tt.body())
			require.NoError(t, err)
			require.NotNil(t, req.GetBody, "http.NewRequest sets GetBody for in-memory bodies")
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Test", "retry-marker")
			callerBody := req.Body

			resp, err := tr.RoundTrip(req)
			require.NoError(t, err)
			assert.Equal(t, "attempt 3: 201", rtyRead(t, resp))
			assert.Equal(t, http.StatusCreated, resp.StatusCode)

			hits := srv.arrivals()
			require.Len(t, hits, 3)
			for i, h := range hits {
				assert.Equal(t, payload, h.body, "attempt %d carries the same bytes", i+1)
				assert.Equal(t, fmt.Sprint(len(payload)), h.header.Get("Content-Length"), "attempt %d", i+1)
			}
			rtyAssertUnchanged(t, srv, req, payload)
			assert.True(t, callerBody == req.Body, "the caller's request keeps its own body")
		})
	}
}

// rtyBodyReader is a base RoundTripper that reads each request's body itself
// (as a base other than net/http's might, which would not rewind it) and
// answers with statuses in turn, the last one from then on.
type rtyBodyReader struct {
	statuses []int

	mu     sync.Mutex
	bodies []string // guarded by mu
	reqs   []*http.Request
}

func (b *rtyBodyReader) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req.Body.Close()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.bodies = append(b.bodies, string(body))
	b.reqs = append(b.reqs, req)
	status := b.statuses[min(len(b.bodies), len(b.statuses))-1]
	return &http.Response{StatusCode: status, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("")), Request: req}, nil
}

func TestRetryRewindsTheBodyWithGetBody(t *testing.T) {
	const payload = `{"amount":1999}`
	base := &rtyBodyReader{statuses: []int{429, 503, 201}}
	tr := newRtyTransport(t, base, RetryPolicy{MaxAttempts: 5})
	req := rtyRequest(t, context.Background(), http.MethodPut, "http://api.test/v1/charges/7", payload)
	before := req.Header.Clone()

	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	require.NoError(t, resp.Body.Close())

	base.mu.Lock()
	defer base.mu.Unlock()
	assert.Equal(t, []string{payload, payload, payload}, base.bodies, "every attempt carries the whole body")
	require.Len(t, base.reqs, 3)
	for i, r := range base.reqs[1:] {
		assert.NotSame(t, req, r, "retry %d is sent as a copy of the caller's request", i+1)
		assert.Equal(t, before, r.Header)
		assert.Equal(t, req.URL.String(), r.URL.String())
	}
	assert.Equal(t, before, req.Header, "the caller's request is not modified")
}

// rtyOneShotReader is a reader that http.NewRequest does not know, so the
// request it makes has no GetBody.
type rtyOneShotReader struct{ r io.Reader }

func (o *rtyOneShotReader) Read(p []byte) (int, error) { return o.r.Read(p) }

func TestRetryBodyWithoutGetBodyIsNotRetried(t *testing.T) {
	const payload = "amount=100"
	tests := []struct {
		name     string
		request  func(t *testing.T, target string) *http.Request
		classify func(*http.Request, *http.Response, error) RetryDecision
	}{
		{
			name: "unknown reader",
			request: func(t *testing.T, target string) *http.Request {
				req, err := http.NewRequest(http.MethodPost, target, io.NopCloser(&rtyOneShotReader{strings.NewReader(payload)}))
				require.NoError(t, err)
				return req
			},
		},
		{
			name: "GetBody cleared",
			request: func(t *testing.T, target string) *http.Request {
				req, err := http.NewRequest(http.MethodPost, target, strings.NewReader(payload))
				require.NoError(t, err)
				req.GetBody = nil
				return req
			},
		},
		{
			name: "GET with a one-shot body",
			request: func(t *testing.T, target string) *http.Request {
				req, err := http.NewRequest(http.MethodGet, target, &rtyOneShotReader{strings.NewReader(payload)})
				require.NoError(t, err)
				return req
			},
		},
		{
			name: "Classify says RetryYes",
			request: func(t *testing.T, target string) *http.Request {
				req, err := http.NewRequest(http.MethodPost, target, io.NopCloser(&rtyOneShotReader{strings.NewReader(payload)}))
				require.NoError(t, err)
				return req
			},
			classify: func(*http.Request, *http.Response, error) RetryDecision { return RetryYes },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newRecServer(t, rtyScript(rtyA(429, "Retry-After", "0", "X-Reason", "slow down"), rtyA(200)))
			rec := &obsRecorder{}
			tr := newRtyTransport(t, srv.pooled(t), RetryPolicy{MaxAttempts: 5, Classify: tt.classify}, WithObserver(rec.observer()))
			req := tt.request(t, srv.URL+"/v1/charges")
			require.Nil(t, req.GetBody)

			resp, err := tr.RoundTrip(req)
			require.NoError(t, err)
			assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "the 429 comes back as it is")
			assert.Equal(t, "slow down", resp.Header.Get("X-Reason"))
			assert.Equal(t, "attempt 1: 429", rtyRead(t, resp))
			assert.Equal(t, 1, srv.count())
			assert.Equal(t, payload, srv.arrivals()[0].body)
			retries, _, _ := rec.retryLog()
			assert.Empty(t, retries)
		})
	}
}

func TestRetryClassify(t *testing.T) {
	type call struct {
		status int
		err    bool
	}
	tests := []struct {
		name       string
		method     string
		answers    []rtyAnswer
		decide     func(resp *http.Response, err error) RetryDecision
		wantSent   int
		wantStatus int
		wantCalls  []call
	}{
		{
			name: "RetryNo stops a 429 retry", method: http.MethodGet,
			answers:  []rtyAnswer{rtyA(429, "Retry-After", "0"), rtyA(200)},
			decide:   func(*http.Response, error) RetryDecision { return RetryNo },
			wantSent: 1, wantStatus: 429, wantCalls: []call{{429, false}},
		},
		{
			name: "RetryYes retries a POST 500", method: http.MethodPost,
			answers: []rtyAnswer{rtyA(500), rtyA(200)},
			decide: func(resp *http.Response, _ error) RetryDecision {
				if resp != nil && resp.StatusCode == 500 {
					return RetryYes
				}
				return RetryDefault
			},
			wantSent: 2, wantStatus: 200, wantCalls: []call{{500, false}, {200, false}},
		},
		{
			name: "RetryYes on a 400 retries up to MaxAttempts", method: http.MethodPost,
			answers:  []rtyAnswer{rtyA(400)},
			decide:   func(*http.Response, error) RetryDecision { return RetryYes },
			wantSent: 3, wantStatus: 400, wantCalls: []call{{400, false}, {400, false}, {400, false}},
		},
		{
			name: "RetryDefault keeps the rules: a POST 502 is not retried", method: http.MethodPost,
			answers:  []rtyAnswer{rtyA(502), rtyA(200)},
			decide:   func(*http.Response, error) RetryDecision { return RetryDefault },
			wantSent: 1, wantStatus: 502, wantCalls: []call{{502, false}},
		},
		{
			name: "RetryDefault keeps the rules: a GET 503 is retried", method: http.MethodGet,
			answers:  []rtyAnswer{rtyA(503), rtyA(200)},
			decide:   func(*http.Response, error) RetryDecision { return RetryDefault },
			wantSent: 2, wantStatus: 200, wantCalls: []call{{503, false}, {200, false}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newRecServer(t, rtyScript(tt.answers...))
			var (
				mu    sync.Mutex
				calls []call
			)
			classify := func(req *http.Request, resp *http.Response, err error) RetryDecision {
				mu.Lock()
				calls = append(calls, call{statusOf(resp, err), err != nil})
				mu.Unlock()
				assert.Equal(t, "retry-marker", req.Header.Get("X-Test"), "Classify sees the caller's request")
				return tt.decide(resp, err)
			}
			tr := newRtyTransport(t, srv.pooled(t), RetryPolicy{Classify: classify})
			req := rtyRequest(t, context.Background(), tt.method, srv.URL+"/v1/x", "")

			resp, err := tr.RoundTrip(req)
			require.NoError(t, err)
			assert.Equal(t, tt.wantStatus, resp.StatusCode)
			assert.Equal(t, fmt.Sprintf("attempt %d: %d", tt.wantSent, tt.wantStatus), rtyRead(t, resp))
			assert.Equal(t, tt.wantSent, srv.count())
			mu.Lock()
			defer mu.Unlock()
			assert.Equal(t, tt.wantCalls, calls)
		})
	}
}

func TestRetryNetworkErrors(t *testing.T) {
	hangUpFirst := func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			rtyHangUp(w)
			return
		}
		rtyScript(rtyA(200))(n, w, r)
	}
	tests := []struct {
		name     string
		method   string
		header   []string
		wantSent int
		wantOK   bool
	}{
		{"GET is retried", http.MethodGet, nil, 2, true},
		{"PUT is retried", http.MethodPut, nil, 2, true},
		{"POST without Idempotency-Key is not retried", http.MethodPost, nil, 1, false},
		{"PATCH without Idempotency-Key is not retried", http.MethodPatch, nil, 1, false},
		{"POST with Idempotency-Key is retried", http.MethodPost, []string{"Idempotency-Key", "k-42"}, 2, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newRecServer(t, hangUpFirst)
			base := srv.pooled(t)
			// A new connection per attempt: net/http itself retries some
			// requests on a reused connection that the server closed, and
			// those retries must not be counted as the Transport's.
			base.DisableKeepAlives = true
			rec := &obsRecorder{}
			tr := newRtyTransport(t, base, RetryPolicy{}, WithObserver(rec.observer()))
			req := rtyRequest(t, context.Background(), tt.method, srv.URL+"/v1/orders/7", "qty=1", tt.header...)

			resp, err := tr.RoundTrip(req)
			assert.Equal(t, tt.wantSent, srv.count(), "attempts seen by the server")
			rtyAssertUnchanged(t, srv, req, "qty=1")
			retries, _, _ := rec.retryLog()
			if !tt.wantOK {
				require.Error(t, err)
				assert.Nil(t, resp, "a response or an error, never both")
				assert.Empty(t, retries)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, "attempt 2: 200", rtyRead(t, resp))
			require.Len(t, retries, 1)
			assert.Equal(t, obsRetry{key: srv.host(), attempt: 2, delay: 0, status: 0, err: true}, retries[0])
		})
	}
}

func TestRetryCertificateErrorIsNotRetried(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		hits.Add(1)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the failed handshakes are expected
	srv.StartTLS()
	defer srv.Close()
	// A transport that does not trust the test server's certificate.
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	rec := &obsRecorder{}
	tr := newRtyTransport(t, base, RetryPolicy{MaxAttempts: 5}, WithObserver(rec.observer()))

	resp, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodGet, srv.URL, ""))
	require.Error(t, err)
	assert.Nil(t, resp)
	var verr *tls.CertificateVerificationError
	assert.ErrorAs(t, err, &verr)
	retries, sent, _ := rec.retryLog()
	assert.Len(t, sent, 1, "a certificate error is sent once")
	assert.Empty(t, retries)
	assert.Zero(t, hits.Load())
}

// rtyFakeBase is a base RoundTripper that answers with statuses in turn
// (the last one from then on), each with a body of size bytes, and records,
// at each call, what had been done to the previous response's body.
type rtyFakeBase struct {
	statuses []int
	size     int

	mu     sync.Mutex
	bodies []*spyBody // guarded by mu
	atSend []rtyBodyState
}

type rtyBodyState struct {
	read        int64
	eof, closed bool
}

func (f *rtyFakeBase) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		req.Body.Close()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := len(f.bodies); n > 0 {
		prev := f.bodies[n-1]
		f.atSend = append(f.atSend, rtyBodyState{prev.read.Load(), prev.eof.Load(), prev.closed()})
	}
	b := &spyBody{r: strings.NewReader(strings.Repeat("x", f.size))}
	f.bodies = append(f.bodies, b)
	status := f.statuses[min(len(f.bodies), len(f.statuses))-1]
	return &http.Response{
		StatusCode: status, Status: http.StatusText(status), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{}, Body: b, ContentLength: int64(f.size), Request: req,
	}, nil
}

func TestRetryDrainsTheBodyBeforeTheNextAttempt(t *testing.T) {
	t.Run("each discarded body is read and closed before the next send", func(t *testing.T) {
		t.Parallel()
		const size = 10 << 10
		base := &rtyFakeBase{statuses: []int{503, 502, 200}, size: size}
		tr := newRtyTransport(t, base, RetryPolicy{})

		resp, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodGet, "http://api.test/v1", ""))
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, resp.StatusCode)

		base.mu.Lock()
		defer base.mu.Unlock()
		require.Len(t, base.atSend, 2)
		for i, s := range base.atSend {
			assert.Equal(t, rtyBodyState{read: size, eof: true, closed: true}, s, "body of attempt %d when attempt %d was sent", i+1, i+2)
		}
		last := base.bodies[2]
		assert.False(t, last.closed(), "the caller's body is left to the caller")
		assert.Zero(t, last.read.Load())
	})

	t.Run("a huge body is read up to a bound, then closed", func(t *testing.T) {
		t.Parallel()
		base := &rtyFakeBase{statuses: []int{503, 200}, size: 1 << 20}
		tr := newRtyTransport(t, base, RetryPolicy{})

		resp, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodGet, "http://api.test/v1", ""))
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())

		base.mu.Lock()
		defer base.mu.Unlock()
		require.Len(t, base.atSend, 1)
		assert.True(t, base.atSend[0].closed)
		assert.False(t, base.atSend[0].eof)
		assert.LessOrEqual(t, base.atSend[0].read, int64(drainLimit))
	})

	t.Run("the retry reuses the connection", func(t *testing.T) {
		t.Parallel()
		srv := newRecServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
			if n == 1 {
				w.WriteHeader(http.StatusServiceUnavailable)
				io.WriteString(w, strings.Repeat("busy ", 2000))
				return
			}
			rtyScript(rtyA(200))(n, w, r)
		})
		tr := newRtyTransport(t, srv.pooled(t), RetryPolicy{BaseDelay: 50 * time.Millisecond})
		// A short pause before the retry, so that the drained connection is
		// surely back in the idle pool when the retry asks for one.
		tr.rand = func() float64 { return 0.999 }
		var (
			mu     sync.Mutex
			reused []bool
		)
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) {
				mu.Lock()
				reused = append(reused, info.Reused)
				mu.Unlock()
			},
		})

		resp, err := tr.RoundTrip(rtyRequest(t, ctx, http.MethodGet, srv.URL+"/v1", ""))
		require.NoError(t, err)
		assert.Equal(t, "attempt 2: 200", rtyRead(t, resp))
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, []bool{false, true}, reused, "the first response was drained, so its connection served the retry")
	})
}

func TestRetryAttemptsRunOut(t *testing.T) {
	t.Run("the caller gets the last response", func(t *testing.T) {
		t.Parallel()
		srv := newRecServer(t, rtyScript(rtyA(503, "X-Attempt", "first"), rtyA(502), rtyA(503, "X-Attempt", "last")))
		tr := newRtyTransport(t, srv.pooled(t), RetryPolicy{MaxAttempts: 3})

		resp, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodGet, srv.URL+"/v1", ""))
		require.NoError(t, err)
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		assert.Equal(t, "last", resp.Header.Get("X-Attempt"))
		assert.Equal(t, "attempt 3: 503", rtyRead(t, resp))
		assert.Equal(t, 3, srv.count())
	})

	t.Run("ErrorOnExhausted: a RetryError with the facts", func(t *testing.T) {
		t.Parallel()
		srv := newRecServer(t, rtyScript(rtyA(503)))
		tr := newRtyTransport(t, srv.pooled(t), RetryPolicy{MaxAttempts: 4, ErrorOnExhausted: true})

		resp, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodGet, srv.URL+"/v1", ""))
		require.Error(t, err)
		assert.Nil(t, resp)
		assert.ErrorIs(t, err, ErrRetriesExhausted)
		var re *RetryError
		require.ErrorAs(t, err, &re)
		assert.Equal(t, RetryError{Key: srv.host(), Attempts: 4, Status: 503}, *re)
		assert.Equal(t, fmt.Sprintf("egress: key %q: gave up after 4 attempts: status 503", srv.host()), err.Error())
		assert.Equal(t, 4, srv.count())
	})

	t.Run("ErrorOnExhausted through http.Client", func(t *testing.T) {
		t.Parallel()
		srv := newRecServer(t, rtyScript(rtyA(429)))
		tr := newRtyTransport(t, srv.pooled(t), RetryPolicy{MaxAttempts: 2, ErrorOnExhausted: true})

		resp, err := (&http.Client{Transport: tr}).Get(srv.URL + "/v1")
		require.Error(t, err)
		assert.Nil(t, resp)
		var re *RetryError
		require.ErrorAs(t, err, &re, "http.Client wraps it in a *url.Error, which unwraps to it")
		assert.Equal(t, 429, re.Status)
		assert.Equal(t, 2, re.Attempts)
		assert.ErrorIs(t, err, ErrRetriesExhausted)
	})

	t.Run("network errors: the last one, as it is", func(t *testing.T) {
		t.Parallel()
		target := "http://" + rtyClosedAddr(t) + "/v1"
		base := &http.Transport{}
		defer base.CloseIdleConnections()
		rec := &obsRecorder{}
		tr := newRtyTransport(t, base, RetryPolicy{MaxAttempts: 3}, WithObserver(rec.observer()))

		resp, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodGet, target, ""))
		require.Error(t, err)
		assert.Nil(t, resp)
		var oe *net.OpError
		assert.ErrorAs(t, err, &oe)
		assert.ErrorIs(t, err, syscall.ECONNREFUSED)
		assert.NotErrorIs(t, err, ErrRetriesExhausted)
		_, sent, _ := rec.retryLog()
		assert.Equal(t, [][2]int{{1, 0}, {2, 0}, {3, 0}}, sent)
	})

	t.Run("ErrorOnExhausted with network errors unwraps to the net error", func(t *testing.T) {
		t.Parallel()
		addr := rtyClosedAddr(t)
		base := &http.Transport{}
		defer base.CloseIdleConnections()
		tr := newRtyTransport(t, base, RetryPolicy{MaxAttempts: 3, ErrorOnExhausted: true})

		resp, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodGet, "http://"+addr+"/v1", ""))
		require.Error(t, err)
		assert.Nil(t, resp)
		var re *RetryError
		require.ErrorAs(t, err, &re)
		assert.Equal(t, addr, re.Key)
		assert.Equal(t, 3, re.Attempts)
		assert.Zero(t, re.Status)
		require.Error(t, re.Err)
		assert.ErrorIs(t, err, ErrRetriesExhausted)
		var oe *net.OpError
		assert.ErrorAs(t, err, &oe, "it unwraps to the net error")
		assert.ErrorIs(t, err, syscall.ECONNREFUSED)
		assert.Contains(t, err.Error(), "gave up after 3 attempts")
	})
}

func TestRetryObserverOnRetry(t *testing.T) {
	t.Run("attempt number, backoff delay and the status that caused it", func(t *testing.T) {
		// (A 502: a 503 without Retry-After is overload, and waits its
		// fixed pause; see TestRetryOverloadIsNotQuota.)
		srv := newRecServer(t, rtyScript(rtyA(502), rtyA(429), rtyA(200)))
		rec := &obsRecorder{}
		tr := newRtyTransport(t, srv.pooled(t), RetryPolicy{BaseDelay: 4 * time.Millisecond, MaxDelay: time.Second}, WithObserver(rec.observer()))
		tr.rand = func() float64 { return 0.5 } // half of each ceiling: 2ms, then 4ms

		resp, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodGet, srv.URL+"/v1", ""))
		require.NoError(t, err)
		assert.Equal(t, "attempt 3: 200", rtyRead(t, resp))

		retries, sent, exhausted := rec.retryLog()
		key := srv.host()
		assert.Equal(t, []obsRetry{
			{key: key, attempt: 2, delay: 2 * time.Millisecond, status: 502},
			{key: key, attempt: 3, delay: 4 * time.Millisecond, status: 429},
		}, retries)
		assert.Equal(t, [][2]int{{1, 502}, {2, 429}, {3, 200}}, sent)
		assert.Empty(t, exhausted)
	})

	t.Run("Retry-After longer than the backoff is the delay", func(t *testing.T) {
		srv := newRecServer(t, rtyScript(rtyA(429, "Retry-After", "7"), rtyA(200)))
		rec := &obsRecorder{}
		tr := newRtyTransport(t, srv.pooled(t), RetryPolicy{BaseDelay: 4 * time.Millisecond}, WithObserver(rec.observer()))
		fc := clock.NewFake(time.Now())
		tr.clock = fc

		type result struct {
			resp *http.Response
			err  error
		}
		done := make(chan result, 1)
		go func() {
			resp, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodGet, srv.URL+"/v1", ""))
			done <- result{resp, err}
		}()
		waited := timersPending(fc, 1) // the retry's sleep
		if !waited {
			fc.Advance(time.Hour) // release it, so that the goroutine ends
			<-done
			t.Fatal("the retry did not sleep on the clock")
		}
		retries, _, _ := rec.retryLog()
		assert.Equal(t, []obsRetry{{key: srv.host(), attempt: 2, delay: 7 * time.Second, status: 429}}, retries)
		assert.Equal(t, 1, srv.count(), "the retry waits for the clock")
		fc.Advance(7 * time.Second)

		select {
		case r := <-done:
			require.NoError(t, r.err)
			assert.Equal(t, "attempt 2: 200", rtyRead(t, r.resp))
		case <-time.After(10 * time.Second):
			fc.Advance(time.Hour)
			<-done
			t.Fatal("the retry did not go out when the fake clock reached Retry-After")
		}
		assert.Equal(t, 2, srv.count())
	})
}

func TestRetryBudgetCapsAnOutage(t *testing.T) {
	const (
		firsts  = 30
		workers = 6
		floor   = 3
		ratio   = 0.2
	)
	srv := newRecServer(t, rtyScript(rtyA(503)))
	rec := &obsRecorder{}
	tr := newRtyTransport(t, srv.pooled(t),
		RetryPolicy{MaxAttempts: 10, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond, BudgetRatio: ratio, BudgetFloor: floor},
		WithObserver(rec.observer()))

	var (
		next atomic.Int32
		wg   sync.WaitGroup
		bad  atomic.Int32
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= firsts {
				req, err := http.NewRequest(http.MethodGet, srv.URL+"/v1", nil)
				if err != nil {
					bad.Add(1)
					return
				}
				resp, err := tr.RoundTrip(req)
				if err != nil {
					bad.Add(1)
					continue
				}
				if resp.StatusCode != http.StatusServiceUnavailable {
					bad.Add(1)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()

	assert.Zero(t, bad.Load(), "every caller gets the last 503")
	total := srv.count()
	bound := firsts + max(int(ratio*firsts), floor)
	assert.LessOrEqual(t, total, bound, "attempts at the server: %d first attempts, ratio %v, floor %d", firsts, ratio, floor)
	assert.GreaterOrEqual(t, total, firsts+floor, "the floor's retries were made")
	retries, _, exhausted := rec.retryLog()
	assert.Len(t, retries, total-firsts)
	assert.NotEmpty(t, exhausted, "OnBudgetExhausted is called")
	for _, k := range exhausted {
		assert.Equal(t, srv.host(), k)
	}
	assert.Less(t, total, firsts*10, "without the budget it would be 10 attempts each")
}

func TestRetryMaxAttemptsOneDisablesRetries(t *testing.T) {
	srv := newRecServer(t, rtyScript(rtyA(503), rtyA(200)))
	tr := newRtyTransport(t, srv.pooled(t), RetryPolicy{MaxAttempts: 1})

	resp, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodGet, srv.URL+"/v1", ""))
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, "attempt 1: 503", rtyRead(t, resp))
	assert.Equal(t, 1, srv.count())
}

func TestRetryWithoutWithRetrySendsOnce(t *testing.T) {
	srv := newRecServer(t, rtyScript(rtyA(503), rtyA(200)))
	tr, err := New(srv.pooled(t))
	require.NoError(t, err)

	resp, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodGet, srv.URL+"/v1", ""))
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, "attempt 1: 503", rtyRead(t, resp))
	assert.Equal(t, 1, srv.count())
}

func TestRetryErrorStatesTheWaitAskedFor(t *testing.T) {
	srv := newRecServer(t, rtyScript(rtyA(429, "Retry-After", "300")))
	tr := newRtyTransport(t, srv.pooled(t), RetryPolicy{ErrorOnExhausted: true})
	start := time.Now()
	_, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodGet, srv.URL+"/v1", ""))
	var re *RetryError
	require.ErrorAs(t, err, &re)
	assert.Less(t, time.Since(start), 5*time.Second, "given up at once: 300 s is past MaxRetryAfter")
	assert.Equal(t, 1, re.Attempts)
	assert.Equal(t, 300*time.Second, re.RetryAfter, "the real wait, past the 2-minute pause cap")
	assert.Contains(t, err.Error(), "asked to wait 5m0s")
	assert.Equal(t, 1, srv.count())
}

// TestRetryBudgetBefore1970: a second before the epoch has its slot too
// (a caller's clock may say so): counted, not out of range.
func TestRetryBudgetBefore1970(t *testing.T) {
	for _, sec := range []int64{-1, -16, -17, -3_000_000_001} {
		b := &retryBudget{ratio: 1}
		at := time.Unix(sec, 0)
		b.deposit(at)
		assert.True(t, b.withdraw(at, false), "second %d: one first attempt, one retry", sec)
		assert.False(t, b.withdraw(at, false), "second %d: no second retry", sec)
	}
}
