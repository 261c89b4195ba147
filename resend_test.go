package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/clock"
)

// countingBase answers every request with answer and counts the requests
// that reached it.
type countingBase struct {
	n      atomic.Int32
	answer func(*http.Request) (*http.Response, error)
}

func (b *countingBase) RoundTrip(req *http.Request) (*http.Response, error) {
	b.n.Add(1)
	if req.Body != nil {
		io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
	return b.answer(req)
}

func statusAnswer(status int, header ...string) func(*http.Request) (*http.Response, error) {
	return func(req *http.Request) (*http.Response, error) {
		h := make(http.Header)
		for i := 0; i+1 < len(header); i += 2 {
			h.Set(header[i], header[i+1])
		}
		return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(strings.NewReader("")), Request: req}, nil
	}
}

func TestSDKResponsesAreMarkedFinal(t *testing.T) {
	tests := []struct {
		name      string
		policy    *RetryPolicy // nil: no WithRetry
		status    int
		wantFinal bool
	}{
		{"429 after egress's attempts", &RetryPolicy{MaxAttempts: 2}, 429, true},
		{"500 to a POST egress would not retry", &RetryPolicy{}, 500, true},
		{"a success is left as it is", &RetryPolicy{}, 200, false},
		{"SDKRetries leaves the SDK its say", &RetryPolicy{MaxAttempts: 2, SDKRetries: true}, 429, false},
		{"without WithRetry egress retries nothing and says nothing", nil, 429, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := &countingBase{answer: statusAnswer(tt.status, "X-Should-Retry", "true")}
			var opts []Option
			if tt.policy != nil {
				opts = append(opts, WithRetry(*tt.policy))
			}
			tr := mustNewTransport(t, base, opts...)
			tr.rand = func() float64 { return 0 }
			resp, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodPost, "http://api.example/v1/chat", "{}"))
			require.NoError(t, err)
			defer resp.Body.Close()
			if tt.wantFinal {
				assert.Equal(t, "false", resp.Header.Get("X-Should-Retry"))
				assert.Equal(t, "false", resp.Header.Get("Stripe-Should-Retry"))
				return
			}
			assert.Empty(t, resp.Header.Get("Stripe-Should-Retry"))
			if tt.status >= 400 {
				assert.Equal(t, "true", resp.Header.Get("X-Should-Retry"), "the provider's word is left alone")
			}
		})
	}
}

// refusingTransport returns a Transport whose limiter grants key one
// request a minute and whose maximum wait is a second, over base: its
// second request is refused at once.
func refusingTransport(t *testing.T, base http.RoundTripper, p RetryPolicy) *Transport {
	t.Helper()
	lim, err := NewTokenBucket(PerMinute(1), 1)
	require.NoError(t, err)
	return mustNewTransport(t, base, WithLimiter(lim), WithMaxWait(time.Second), WithRetry(p))
}

func TestSDKResendOfARefusalIsNotSent(t *testing.T) {
	base := &countingBase{answer: statusAnswer(200)}
	tr := refusingTransport(t, base, RetryPolicy{})
	fc := clock.NewFake(time.Unix(1_700_000_000, 0))
	tr.clock = fc
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	const url = "http://api.example/v1/chat/completions"
	body := `{"max_tokens":10}`
	call := func(ctx context.Context, attempt string) error {
		resp, err := tr.RoundTrip(rtyRequest(t, ctx, http.MethodPost, url, body, "X-Stainless-Retry-Count", attempt))
		if resp != nil {
			resp.Body.Close()
		}
		return err
	}

	require.NoError(t, call(ctx, "0"))
	first := call(ctx, "0")
	var le *LimitError
	require.ErrorAs(t, first, &le, "the second call is refused")
	require.EqualValues(t, 1, base.n.Load())

	resend := call(ctx, "1")
	assert.Same(t, first, resend, "the SDK's resend gets the refusal it resends, at once")
	assert.ErrorIs(t, resend, ErrRateLimited)
	assert.Same(t, first, call(ctx, "2"))
	assert.EqualValues(t, 1, base.n.Load(), "a refused call never reaches the provider")

	// With option.WithRequestTimeout each attempt has a deadline of its
	// own: the call is its request.
	perAttempt, cancelAttempt := context.WithTimeout(context.Background(), 2*time.Hour)
	defer cancelAttempt()
	assert.Same(t, first, call(perAttempt, "1"), "a resend with its own deadline is the same call")
	body = `{"max_tokens":11}`
	fresh := call(ctx, "1")
	assert.ErrorAs(t, fresh, &le)
	assert.NotSame(t, first, fresh, "another call (another body) is decided anew")
	body = `{"max_tokens":10}`
	assert.NotSame(t, first, call(ctx, "0"), "a first attempt is decided anew")

	fc.Advance(resendMemory)
	assert.NotSame(t, first, call(ctx, "1"), "past the memory a resend is decided anew")
	assert.EqualValues(t, 1, base.n.Load())
}

func TestSDKResendOfANetworkErrorIsNotSent(t *testing.T) {
	refused := &countingBase{answer: func(*http.Request) (*http.Response, error) { return nil, fmt.Errorf("read: %w", syscall.ECONNRESET) }}
	tr := mustNewTransport(t, refused, WithRetry(RetryPolicy{MaxAttempts: 3}))
	post := func() error {
		// stripe-go sends a POST again with its Idempotency-Key, and no
		// attempt number.
		_, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodPost, "http://api.example/v1/charges", "amount=1", "Idempotency-Key", "k-1"))
		return err
	}
	first := post()
	require.ErrorIs(t, first, syscall.ECONNRESET)
	require.EqualValues(t, 3, refused.n.Load(), "egress's own attempts (an Idempotency-Key makes a POST safe to retry)")
	again := post()
	assert.Same(t, first, again)
	assert.EqualValues(t, 3, refused.n.Load(), "the SDK's resend is not sent")

	_, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodPost, "http://api.example/v1/charges", "amount=1", "Idempotency-Key", "k-2"))
	assert.Error(t, err)
	assert.EqualValues(t, 6, refused.n.Load(), "another key is another call")
}

func TestSDKRetriesLeavesResendsAlone(t *testing.T) {
	base := &countingBase{answer: statusAnswer(200)}
	tr := refusingTransport(t, base, RetryPolicy{SDKRetries: true})
	ctx := context.Background()
	send := func(attempt string) error {
		resp, err := tr.RoundTrip(rtyRequest(t, ctx, http.MethodGet, "http://api.example/v1/x", "", "X-Stainless-Retry-Count", attempt))
		if resp != nil {
			resp.Body.Close()
		}
		return err
	}
	require.NoError(t, send("0"))
	first := send("0")
	require.ErrorIs(t, first, ErrRateLimited)
	assert.NotSame(t, first, send("1"), "each attempt of the SDK is decided anew")
}

func TestResendMemoryIsBounded(t *testing.T) {
	var r resends
	now := time.Unix(1_700_000_000, 0)
	errA := errors.New("a")
	for i := range maxRemembered + 10 {
		req, err := http.NewRequest(http.MethodPost, "http://h/p", nil)
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", strings.Repeat("k", 1+i%7)+string(rune('a'+i%26))+time.Duration(i).String())
		r.remember(req, remembered{err: errA}, now)
	}
	assert.LessOrEqual(t, len(r.calls), maxRemembered)
	assert.Equal(t, len(r.calls), len(r.order))
	req, err := http.NewRequest(http.MethodPost, "http://h/p", nil)
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "late")
	r.remember(req, remembered{err: errA}, now.Add(resendMemory))
	assert.Len(t, r.calls, 1, "the calls past their time are forgotten")
	assert.EqualValues(t, 1, r.n.Load())
}

func TestRetryBudgetAskedThrottles(t *testing.T) {
	b := retryBudget{ratio: 0.2, floor: 1}
	now := time.Unix(1_700_000_000, 0)
	for range 10 {
		b.deposit(now)
	}
	assert.True(t, b.withdraw(now, false))
	assert.True(t, b.withdraw(now, false))
	assert.False(t, b.withdraw(now, false), "the budget: a fifth of the first attempts")
	for i := range 10 {
		assert.True(t, b.withdraw(now, true), "asked-for retry %d", i+1)
	}
	assert.False(t, b.withdraw(now, true), "asked-for retries: one per first attempt")
	assert.False(t, b.withdraw(now, false))
	assert.True(t, b.withdraw(now.Add(10*time.Second), true), "the allowance comes back with the window (the floor)")
}

func TestAskedRetry(t *testing.T) {
	room := Quota{Dimension: Requests, Remaining: 5, HasRemaining: true, Limit: 10, HasLimit: true}
	empty := Quota{Dimension: Requests, Remaining: 0, HasRemaining: true, Limit: 10, HasLimit: true}
	tests := []struct {
		name string
		s    Signal
		want bool
	}{
		{"lock_timeout: ScopeOther, Should-Retry true", Signal{Status: 429, Scope: ScopeOther, Retry: RetryYes}, true},
		{"429 with Retry-After and room in the count", Signal{Status: 429, HasRetryAfter: true, RetryAfter: 2 * time.Second, Quotas: []Quota{room}}, true},
		{"429 with Retry-After and nothing left", Signal{Status: 429, HasRetryAfter: true, RetryAfter: 2 * time.Second, Quotas: []Quota{empty}}, false},
		{"429 with room that says it is the quota", Signal{Status: 429, HasRetryAfter: true, Scope: ScopeQuota, Quotas: []Quota{room}}, false},
		{"ScopeOther that does not ask for a retry", Signal{Status: 429, Scope: ScopeOther}, false},
		{"a 429 that says nothing", Signal{Status: 429, HasRetryAfter: true}, false},
		{"503 overload with room", Signal{Status: 503, Quotas: []Quota{room}, Retry: RetryYes}, false},
		{"billing", Signal{Status: 429, Scope: ScopeBilling, HasRetryAfter: true}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, askedRetry(&tt.s))
		})
	}
}

func TestRetryOverloadIsNotQuota(t *testing.T) {
	tests := []struct {
		name   string
		method string
		answer rtyAnswer
	}{
		{"529 to a POST", http.MethodPost, rtyA(529, "Content-Type", "application/json")},
		{"503 without Retry-After to a GET", http.MethodGet, rtyA(503)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newRecServer(t, rtyScript(tt.answer, rtyA(200)))
			lim, err := NewTokenBucket(PerSecond(50), 5)
			require.NoError(t, err)
			rec := &obsRecorder{}
			tr := newRtyTransport(t, srv.pooled(t), RetryPolicy{}, WithLimiter(lim), WithObserver(rec.observer()))
			body := ""
			if tt.method == http.MethodPost {
				body = `{"max_tokens":10}`
			}
			resp, err := tr.RoundTrip(rtyRequest(t, context.Background(), tt.method, srv.URL+"/v1/messages", body))
			require.NoError(t, err)
			assert.Equal(t, "attempt 2: 200", rtyRead(t, resp))
			retries, _, _ := rec.retryLog()
			require.Len(t, retries, 1)
			assert.Equal(t, overloadPause, retries[0].delay, "the request waits the fixed pause, not the backoff (0 here)")
			pauses, _, _ := rec.coolLog()
			assert.Empty(t, pauses, "the key is not held")
			assert.Empty(t, rec.rateLog(), "nor its rate lowered")
			assert.Equal(t, 50.0, lim.EffectiveRate(srv.host()).PerSecond())
		})
	}
}

func TestSDKResendOfAFinalResponseIsAnsweredWithIt(t *testing.T) {
	// stripe-go sends a 429 lock_timeout again, by its body, whatever the
	// headers say: the resend (its Idempotency-Key) gets the response again.
	const body = `{"error":{"code":"lock_timeout","type":"invalid_request_error"}}`
	base := &countingBase{answer: func(req *http.Request) (*http.Response, error) {
		h := http.Header{"Stripe-Should-Retry": {"true"}, "Content-Type": {"application/json"}}
		return &http.Response{StatusCode: 429, Header: h, Body: io.NopCloser(strings.NewReader(body)), Request: req}, nil
	}}
	tr := mustNewTransport(t, base, WithRetry(RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond}))
	post := func(idem string) *http.Response {
		resp, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodPost, "http://api.example/v1/charges", "amount=1", "Idempotency-Key", idem))
		require.NoError(t, err)
		return resp
	}
	first := post("k-1")
	assert.Equal(t, body, rtyRead(t, first), "the caller reads the body in full")
	assert.EqualValues(t, 2, base.n.Load(), "egress's attempts")
	again := post("k-1")
	assert.Equal(t, 429, again.StatusCode)
	assert.Equal(t, "false", again.Header.Get("Stripe-Should-Retry"))
	assert.Equal(t, "application/json", again.Header.Get("Content-Type"))
	assert.Equal(t, body, rtyRead(t, again))
	assert.EqualValues(t, 2, base.n.Load(), "the resend is not sent")

	long := strings.Repeat("x", replayLimit+1)
	base.answer = statusAnswerBody(500, long)
	assert.Equal(t, long, rtyRead(t, post("k-2")), "a body too long to keep reads in full")
	n := base.n.Load()
	rtyRead(t, post("k-2"))
	assert.Equal(t, n+1, base.n.Load(), "and its call is not kept: the resend is sent")
}

func statusAnswerBody(status int, body string) func(*http.Request) (*http.Response, error) {
	return func(req *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: status, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(body)), Request: req}, nil
	}
}

func TestResendKeepsOnlyWhatCouldBeResent(t *testing.T) {
	base := &countingBase{answer: statusAnswer(200)}
	tr := refusingTransport(t, base, RetryPolicy{})
	send := func(header ...string) {
		resp, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodGet, "http://api.example/v1/x", "", header...))
		if resp != nil {
			resp.Body.Close()
		}
		_ = err
	}
	send()
	send() // refused: a plain request, which nothing would tell a resend of
	assert.Zero(t, tr.resends.n.Load(), "a plain request's refusal is not kept")
	send("X-Stainless-Retry-Count", "0")
	assert.EqualValues(t, 1, tr.resends.n.Load(), "an SDK's is")
}
