package egress

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ---- New ----

func TestNewNilBaseIsDefaultTransport(t *testing.T) {
	closed := make(chan struct{}, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			select {
			case closed <- struct{}{}:
			default:
			}
		}
	}
	srv.Start()
	defer srv.Close()

	tb, err := NewTokenBucket(PerSecond(1000), 10)
	require.NoError(t, err)
	tr := mustNewTransport(t, nil, WithLimiter(tb))
	status, err := checkedRoundTrip(t, tr, newPlainGet(t, context.Background(), srv.URL))
	require.NoError(t, err)
	assert.Equal(t, http.StatusNoContent, status)

	// The connection sits idle in http.DefaultTransport's pool: closing that
	// pool's idle connections closes it. (The connection reaches the pool
	// just after the body is closed, hence the retries.)
	dt, ok := http.DefaultTransport.(*http.Transport)
	require.True(t, ok)
	deadline := time.After(5 * time.Second)
	for {
		dt.CloseIdleConnections()
		select {
		case <-closed:
			return
		case <-deadline:
			t.Fatal("the request did not go through http.DefaultTransport: its idle connection was not there to close")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func TestNewRejectsInvalidOptions(t *testing.T) {
	tb, err := NewTokenBucket(PerSecond(1), 1)
	require.NoError(t, err)
	valid := []Option{WithLimiter(tb), WithMaxWait(time.Second)}

	for _, tc := range []struct {
		name string
		opts []Option
		want []string // each must appear in the error: the option and the value
		errs int      // how many errors are reported, when more than one
	}{
		{"nil limiter", []Option{WithLimiter(nil)}, []string{"WithLimiter", "nil"}, 0},
		{"nil key func", []Option{WithKeyFunc(nil)}, []string{"WithKeyFunc", "nil"}, 0},
		{"nil cost func", []Option{WithCostFunc(nil)}, []string{"WithCostFunc", "nil"}, 0},
		{"zero max wait", []Option{WithMaxWait(0)}, []string{"WithMaxWait", "0s"}, 0},
		{"negative max wait", []Option{WithMaxWait(-time.Second)}, []string{"WithMaxWait", "-1s"}, 0},
		{"nil option", []Option{nil}, []string{"option", "nil"}, 0},
		{"bad among good", append(valid[:len(valid):len(valid)], WithMaxWait(-2*time.Second)), []string{"WithMaxWait", "-2s"}, 0},
		{
			"several bad, all reported",
			[]Option{WithLimiter(nil), WithKeyFunc(nil), WithCostFunc(nil), WithMaxWait(-3 * time.Second), nil},
			[]string{"WithLimiter", "WithKeyFunc", "WithCostFunc", "WithMaxWait", "-3s", "option"},
			5,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := New(http.DefaultTransport, tc.opts...)
			require.Error(t, err)
			assert.Nil(t, tr)
			assert.ErrorIs(t, err, ErrInvalidConfig)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			if tc.errs > 1 {
				joined, ok := err.(interface{ Unwrap() []error })
				require.True(t, ok, "several errors are joined")
				assert.Len(t, joined.Unwrap(), tc.errs)
				for _, e := range joined.Unwrap() {
					assert.ErrorIs(t, e, ErrInvalidConfig)
				}
			}
		})
	}

	t.Run("valid", func(t *testing.T) {
		tr, err := New(nil, append(valid,
			WithKeyFunc(func(*http.Request) string { return "k" }),
			WithCostFunc(func(*http.Request) int { return 1 }),
			WithObserver(Observer{}),
		)...)
		require.NoError(t, err)
		assert.NotNil(t, tr)
	})
}

// ---- pass-through ----

func TestWithoutLimiterPassesThroughUnthrottled(t *testing.T) {
	const n = 50
	srv := newRecServer(t, nil)
	tr := mustNewTransport(t, srv.base())

	start := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			req, err := http.NewRequest(http.MethodGet, srv.URL+"/"+strconv.Itoa(i), nil)
			if err != nil {
				errs <- err
				return
			}
			resp, err := tr.RoundTrip(req)
			if err != nil {
				errs <- err
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	began := time.Now()
	close(start)
	wg.Wait()
	elapsed := time.Since(began)
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	assert.Equal(t, n, srv.count())
	// No limiter: nothing waits. The bound only says "no throttling"; 50
	// loopback requests take milliseconds.
	assert.Less(t, elapsed, 3*time.Second)
	t.Logf("%d concurrent requests without a limiter took %v", n, elapsed)
}

// ---- the RoundTripper contract ----

// callerView is a deep copy of what the caller can see of a request.
type callerView struct {
	Method        string
	URL           string
	Host          string
	Header        http.Header
	ContentLength int64
	Body          io.ReadCloser
	Context       context.Context
}

func callerViewOf(r *http.Request) callerView {
	return callerView{
		Method: r.Method, URL: r.URL.String(), Host: r.Host, Header: r.Header.Clone(),
		ContentLength: r.ContentLength, Body: r.Body, Context: r.Context(),
	}
}

func TestRoundTripDeliversRequestUnchanged(t *testing.T) {
	const payload = `{"amount":1200,"currency":"eur"}`
	for _, lc := range append([]limiterShape{{name: "no limiter"}}, limiterShapes...) {
		t.Run(lc.name, func(t *testing.T) {
			srv := newRecServer(t, nil)
			var opts []Option
			if lc.make != nil {
				opts = append(opts, WithLimiter(lc.make(t, PerSecond(100), 10)))
			}
			tr := mustNewTransport(t, srv.base(), opts...)

			req, body := newSpyPost(t, context.Background(), srv.URL+"/v1/charges?expand=customer&limit=3", payload)
			req.Header.Set("Authorization", "Bearer sk_test_123")
			req.Header.Set("Idempotency-Key", "0f8fad5b")
			req.Header.Add("X-Multi", "a")
			req.Header.Add("X-Multi", "b")
			req.Header.Set("Content-Type", "application/json")
			header := req.Header
			url := req.URL
			before := callerViewOf(req)

			mustSend200(t, tr, req)

			// The caller's request is as it was.
			assert.Equal(t, before, callerViewOf(req))
			assert.Same(t, url, req.URL)
			assert.Equal(t, header, req.Header)
			assert.True(t, body.closed(), "the base transport closes a body it sent")

			// The server got what was sent.
			got := srv.arrivals()
			require.Len(t, got, 1)
			a := got[0]
			assert.Equal(t, http.MethodPost, a.method)
			assert.Equal(t, "/v1/charges?expand=customer&limit=3", a.uri)
			assert.Equal(t, srv.host(), a.host)
			assert.Equal(t, payload, string(a.body))
			for _, h := range []string{"Authorization", "Idempotency-Key", "X-Multi", "Content-Type"} {
				assert.Equal(t, before.Header.Values(h), a.header.Values(h), "header %s", h)
			}
			assert.Equal(t, strconv.Itoa(len(payload)), a.header.Get("Content-Length"))
		})
	}
}

func TestRoundTripRefusalClosesBodyAndSendsNothing(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()

	for _, tc := range []struct {
		name    string
		limiter func(t *testing.T, key string) Limiter
		opts    []Option
		ctx     func() (context.Context, context.CancelFunc)
		want    error  // errors.Is target; nil: any error that is not ErrRateLimited
		reason  Reason // for a *LimitError
		// noHook: OnReject is not checked here (see
		// TestObserverOnRejectCalledForNegativeCost).
		noHook bool
	}{
		{
			name: "tokenbucket cost above burst",
			limiter: func(t *testing.T, _ string) Limiter {
				l, err := NewTokenBucket(PerSecond(1), 2)
				require.NoError(t, err)
				return l
			},
			opts: []Option{WithCostFunc(func(*http.Request) int { return 3 })},
			want: ErrCostTooHigh, reason: ReasonCostTooHigh,
		},
		{
			name: "leakybucket cost above depth",
			limiter: func(t *testing.T, _ string) Limiter {
				l, err := NewLeakyBucket(PerSecond(1), 2)
				require.NoError(t, err)
				return l
			},
			opts: []Option{WithCostFunc(func(*http.Request) int { return 3 })},
			want: ErrCostTooHigh, reason: ReasonCostTooHigh,
		},
		{
			name: "leakybucket queue full",
			limiter: func(t *testing.T, key string) Limiter {
				l, err := NewLeakyBucket(PerSecond(1), 0)
				require.NoError(t, err)
				takeOneUnit(t, l, key)
				return l
			},
			want: ErrQueueFull, reason: ReasonQueueFull,
		},
		{
			name: "deadline",
			limiter: func(t *testing.T, key string) Limiter {
				l, err := NewTokenBucket(PerSecond(1), 1)
				require.NoError(t, err)
				takeOneUnit(t, l, key)
				return l
			},
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 100*time.Millisecond)
			},
			want: ErrRateLimited, reason: ReasonDeadline,
		},
		{
			name: "max wait",
			limiter: func(t *testing.T, key string) Limiter {
				l, err := NewTokenBucket(PerSecond(1), 1)
				require.NoError(t, err)
				takeOneUnit(t, l, key)
				return l
			},
			opts: []Option{WithMaxWait(100 * time.Millisecond)},
			want: ErrRateLimited, reason: ReasonMaxWait,
		},
		{
			name: "negative cost",
			limiter: func(t *testing.T, _ string) Limiter {
				l, err := NewTokenBucket(PerSecond(1), 1)
				require.NoError(t, err)
				return l
			},
			opts:   []Option{WithCostFunc(func(*http.Request) int { return -1 })},
			noHook: true,
		},
		{
			name: "context already cancelled",
			limiter: func(t *testing.T, _ string) Limiter {
				l, err := NewTokenBucket(PerSecond(1), 1)
				require.NoError(t, err)
				return l
			},
			ctx:  func() (context.Context, context.CancelFunc) { return cancelled, func() {} },
			want: context.Canceled,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newRecServer(t, nil)
			var obs obsRecorder
			opts := append([]Option{WithLimiter(tc.limiter(t, srv.host())), WithObserver(obs.observer())}, tc.opts...)
			tr := mustNewTransport(t, srv.base(), opts...)
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if tc.ctx != nil {
				ctx, cancel = tc.ctx()
			}
			defer cancel()
			req, body := newSpyPost(t, ctx, srv.URL+"/v1/charges", "amount=1200")
			before := callerViewOf(req)

			start := time.Now()
			resp, err := tr.RoundTrip(req)
			elapsed := time.Since(start)

			require.Error(t, err)
			assert.Nil(t, resp, "a response together with an error")
			assert.Less(t, elapsed, promptBound, "a refusal is immediate")
			assert.True(t, body.closed(), "the body of a request that is not sent must be closed")
			assert.Zero(t, srv.count(), "the server saw a refused request")
			assert.Equal(t, before, callerViewOf(req), "the caller's request was modified")
			if tc.want != nil {
				assert.ErrorIs(t, err, tc.want)
			} else {
				assert.NotErrorIs(t, err, ErrRateLimited)
			}
			if tc.reason != 0 {
				var le *LimitError
				require.ErrorAs(t, err, &le)
				assert.Equal(t, tc.reason, le.Reason)
				assert.Equal(t, srv.host(), le.Key)
			}
			waits, rejects, sents := obs.snapshot()
			assert.Empty(t, waits)
			assert.Empty(t, sents)
			if !tc.noHook && assert.Len(t, rejects, 1) {
				assert.Equal(t, srv.host(), rejects[0].key)
				assert.Equal(t, err, rejects[0].err)
			}
		})
	}
}

// ---- keys and costs ----

func TestKeyFunc(t *testing.T) {
	for _, lc := range limiterShapes {
		t.Run(lc.name+"/default is the host", func(t *testing.T) {
			a, b := newRecServer(t, nil), newRecServer(t, nil)
			require.NotEqual(t, a.host(), b.host())
			tr := mustNewTransport(t, a.base(), WithLimiter(lc.make(t, PerSecond(1), 1)), WithMaxWait(50*time.Millisecond))

			// One request to each host goes at once: the buckets are independent.
			mustSend200(t, tr, newPlainGet(t, context.Background(), a.URL+"/x"))
			mustSend200(t, tr, newPlainGet(t, context.Background(), b.URL+"/x"))
			for _, s := range []*recServer{a, b} {
				_, err := checkedRoundTrip(t, tr, newPlainGet(t, context.Background(), s.URL+"/y"))
				var le *LimitError
				require.ErrorAs(t, err, &le)
				assert.Equal(t, s.host(), le.Key)
				assert.Equal(t, 1, s.count())
			}
		})

		t.Run(lc.name+"/custom key splits one host", func(t *testing.T) {
			srv := newRecServer(t, nil)
			byAccount := func(r *http.Request) string { return "acct:" + r.Header.Get("X-Account") }
			tr := mustNewTransport(t, srv.base(), WithLimiter(lc.make(t, PerSecond(1), 1)),
				WithKeyFunc(byAccount), WithMaxWait(50*time.Millisecond))
			send := func(account string) error {
				req := newPlainGet(t, context.Background(), srv.URL)
				req.Header.Set("X-Account", account)
				_, err := checkedRoundTrip(t, tr, req)
				return err
			}
			require.NoError(t, send("a"))
			require.NoError(t, send("b"))
			err := send("a")
			var le *LimitError
			require.ErrorAs(t, err, &le)
			assert.Equal(t, "acct:a", le.Key)
			assert.Equal(t, 2, srv.count())
		})

		t.Run(lc.name+"/custom key joins two hosts", func(t *testing.T) {
			a, b := newRecServer(t, nil), newRecServer(t, nil)
			tr := mustNewTransport(t, a.base(), WithLimiter(lc.make(t, PerSecond(1), 1)),
				WithKeyFunc(func(*http.Request) string { return "provider" }), WithMaxWait(50*time.Millisecond))
			mustSend200(t, tr, newPlainGet(t, context.Background(), a.URL))
			_, err := checkedRoundTrip(t, tr, newPlainGet(t, context.Background(), b.URL))
			var le *LimitError
			require.ErrorAs(t, err, &le)
			assert.Equal(t, "provider", le.Key)
			assert.Equal(t, 0, b.count())
		})
	}
}

func TestCostFunc(t *testing.T) {
	costOf := func(r *http.Request) int {
		c, err := strconv.Atoi(r.Header.Get("X-Cost"))
		if err != nil {
			return 1
		}
		return c
	}
	newCostReq := func(t *testing.T, target string, cost int) (*http.Request, *spyBody) {
		req, body := newSpyPost(t, context.Background(), target, "x")
		req.Header.Set("X-Cost", strconv.Itoa(cost))
		return req, body
	}

	t.Run("tokenbucket cost 3 takes 3 tokens", func(t *testing.T) {
		srv := newRecServer(t, nil)
		tb, err := NewTokenBucket(PerSecond(1), 5, WithTransitMargin(0)) // the cost arithmetic alone
		require.NoError(t, err)
		var obs obsRecorder
		tr := mustNewTransport(t, srv.base(), WithLimiter(tb), WithCostFunc(costOf),
			WithMaxWait(100*time.Millisecond), WithObserver(obs.observer()))

		req, _ := newCostReq(t, srv.URL, 3)
		mustSend200(t, tr, req) // 5 → 2 tokens
		req, _ = newCostReq(t, srv.URL, 3)
		_, err = checkedRoundTrip(t, tr, req) // 2 tokens: 1 missing, a second's refill
		var le *LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, 3, le.Cost)
		assert.InDelta(t, time.Second, le.Wait, float64(100*time.Millisecond))
		req, _ = newCostReq(t, srv.URL, 2)
		mustSend200(t, tr, req) // 2 → 0 tokens
		req, _ = newCostReq(t, srv.URL, 1)
		_, err = checkedRoundTrip(t, tr, req)
		require.ErrorAs(t, err, &le)
		assert.Equal(t, 1, le.Cost)
		assert.InDelta(t, time.Second, le.Wait, float64(100*time.Millisecond))

		// Cost 0 passes at once though the bucket is empty.
		req, _ = newCostReq(t, srv.URL, 0)
		start := time.Now()
		mustSend200(t, tr, req)
		assert.Less(t, time.Since(start), promptBound)
		assert.Equal(t, 3, srv.count())
		waits, _, _ := obs.snapshot()
		assert.Empty(t, waits)
	})

	t.Run("leakybucket cost 3 takes 3 intervals", func(t *testing.T) {
		srv := newRecServer(t, nil)
		lb, err := NewLeakyBucket(PerSecond(10), 5)
		require.NoError(t, err)
		tr := mustNewTransport(t, srv.base(), WithLimiter(lb), WithCostFunc(costOf), WithMaxWait(50*time.Millisecond))

		req, _ := newCostReq(t, srv.URL, 3)
		mustSend200(t, tr, req) // the next release is 300 ms away
		req, _ = newCostReq(t, srv.URL, 1)
		_, err = checkedRoundTrip(t, tr, req)
		var le *LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, ReasonMaxWait, le.Reason)
		assert.InDelta(t, 300*time.Millisecond, le.Wait, float64(50*time.Millisecond))

		req, _ = newCostReq(t, srv.URL, 0)
		start := time.Now()
		mustSend200(t, tr, req)
		assert.Less(t, time.Since(start), promptBound)
		assert.Equal(t, 2, srv.count())
	})

	for _, lc := range limiterShapes {
		t.Run(lc.name+"/negative cost fails", func(t *testing.T) {
			srv := newRecServer(t, nil)
			tr := mustNewTransport(t, srv.base(), WithLimiter(lc.make(t, PerSecond(10), 5)), WithCostFunc(costOf))
			req, body := newCostReq(t, srv.URL, -1)
			_, err := checkedRoundTrip(t, tr, req)
			require.Error(t, err)
			assert.NotErrorIs(t, err, ErrRateLimited)
			assert.Contains(t, err.Error(), "-1")
			assert.True(t, body.closed())
			assert.Zero(t, srv.count())
		})
	}
}

// ---- deadlines and cancellation ----

func TestDeadlineHonesty(t *testing.T) {
	for _, lc := range limiterShapes {
		for _, tc := range []struct {
			name    string
			opts    []Option
			timeout time.Duration // of the request's context; 0 for none
			reason  Reason
		}{
			{"context deadline", nil, 100 * time.Millisecond, ReasonDeadline},
			{"max wait", []Option{WithMaxWait(100 * time.Millisecond)}, 0, ReasonMaxWait},
			{"max wait shorter than deadline", []Option{WithMaxWait(100 * time.Millisecond)}, 500 * time.Millisecond, ReasonMaxWait},
		} {
			t.Run(lc.name+"/"+tc.name, func(t *testing.T) {
				srv := newRecServer(t, nil)
				tr := mustNewTransport(t, srv.base(), append([]Option{WithLimiter(lc.make(t, PerSecond(1), 1))}, tc.opts...)...)
				mustSend200(t, tr, newPlainGet(t, context.Background(), srv.URL))

				ctx := context.Background()
				if tc.timeout > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.timeout)
					defer cancel()
				}
				req, body := newSpyPost(t, ctx, srv.URL, "x")
				start := time.Now()
				_, err := checkedRoundTrip(t, tr, req)
				elapsed := time.Since(start)

				assert.Less(t, elapsed, promptBound, "a wait that cannot fit must fail at once, not at the deadline")
				require.ErrorIs(t, err, ErrRateLimited)
				var le *LimitError
				require.ErrorAs(t, err, &le)
				assert.Equal(t, srv.host(), le.Key)
				assert.Equal(t, 1, le.Cost)
				assert.Equal(t, tc.reason, le.Reason)
				assert.Greater(t, le.Wait, 800*time.Millisecond)
				assert.LessOrEqual(t, le.Wait, time.Second+time.Millisecond)
				assert.Contains(t, le.Error(), srv.host())
				assert.True(t, body.closed())
				assert.Equal(t, 1, srv.count())
			})
		}
	}
}

func TestCancelWhileWaiting(t *testing.T) {
	for _, lc := range limiterShapes {
		t.Run(lc.name, func(t *testing.T) {
			srv := newRecServer(t, nil)
			lim := lc.make(t, PerSecond(1), 1)
			var obs obsRecorder
			tr := mustNewTransport(t, srv.base(), WithLimiter(lim), WithObserver(obs.observer()))
			mustSend200(t, tr, newPlainGet(t, context.Background(), srv.URL))

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cancelledAt := make(chan time.Time, 1)
			timer := time.AfterFunc(30*time.Millisecond, func() {
				cancelledAt <- time.Now()
				cancel()
			})
			defer timer.Stop()

			req, body := newSpyPost(t, ctx, srv.URL, "x")
			_, err := checkedRoundTrip(t, tr, req)
			returned := time.Now()

			require.ErrorIs(t, err, context.Canceled)
			assert.NotErrorIs(t, err, ErrRateLimited)
			lag := returned.Sub(<-cancelledAt)
			assert.Less(t, lag, promptBound, "RoundTrip must return as soon as the context is cancelled")
			assert.True(t, body.closed())
			assert.Equal(t, 1, srv.count(), "the cancelled request reached the server")
			_, rejects, _ := obs.snapshot()
			if assert.Len(t, rejects, 1) {
				assert.ErrorIs(t, rejects[0].err, context.Canceled)
			}

			// The cancelled request gave its capacity back: the next one
			// waits for the first request's interval only, not two.
			assert.LessOrEqual(t, probeWouldWait(t, lim, srv.host()), time.Second)
			t.Logf("returned %v after the cancel", lag)
		})
	}
}

func TestAlreadyCancelledContext(t *testing.T) {
	for _, lc := range limiterShapes {
		for _, drained := range []bool{false, true} {
			t.Run(lc.name+"/drained="+strconv.FormatBool(drained), func(t *testing.T) {
				srv := newRecServer(t, nil)
				lim := lc.make(t, PerSecond(1), 1)
				if drained {
					takeOneUnit(t, lim, srv.host())
				}
				tr := mustNewTransport(t, srv.base(), WithLimiter(lim))
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				req, body := newSpyPost(t, ctx, srv.URL, "x")
				start := time.Now()
				_, err := checkedRoundTrip(t, tr, req)
				assert.Less(t, time.Since(start), promptBound)
				assert.ErrorIs(t, err, context.Canceled)
				assert.True(t, body.closed())
				assert.Zero(t, srv.count())
			})
		}
	}
}

// ---- Observer ----

func TestObserverOnWait(t *testing.T) {
	for _, lc := range limiterShapes {
		t.Run(lc.name, func(t *testing.T) {
			srv := newRecServer(t, nil)
			var obs obsRecorder
			tr := mustNewTransport(t, srv.base(), WithLimiter(lc.make(t, PerSecond(50), 1)), WithObserver(obs.observer()))

			mustSend200(t, tr, newPlainGet(t, context.Background(), srv.URL))
			waits, _, _ := obs.snapshot()
			assert.Empty(t, waits, "a request granted at once did not wait")

			mustSend200(t, tr, newPlainGet(t, context.Background(), srv.URL)) // waits ≤ 20 ms
			waits, rejects, sents := obs.snapshot()
			if assert.Len(t, waits, 1) {
				assert.Equal(t, srv.host(), waits[0].key)
				assert.Positive(t, waits[0].waited)
				assert.LessOrEqual(t, waits[0].waited, 20*time.Millisecond+promptBound)
			}
			assert.Empty(t, rejects)
			assert.Len(t, sents, 2)
		})
	}
}

func TestObserverOnReject(t *testing.T) {
	srv := newRecServer(t, nil)
	tb, err := NewTokenBucket(PerSecond(1), 1)
	require.NoError(t, err)
	var obs obsRecorder
	tr := mustNewTransport(t, srv.base(), WithLimiter(tb), WithMaxWait(10*time.Millisecond), WithObserver(obs.observer()))
	mustSend200(t, tr, newPlainGet(t, context.Background(), srv.URL))
	_, err = checkedRoundTrip(t, tr, newPlainGet(t, context.Background(), srv.URL))
	require.ErrorIs(t, err, ErrRateLimited)

	waits, rejects, sents := obs.snapshot()
	assert.Empty(t, waits)
	require.Len(t, rejects, 1)
	assert.Equal(t, srv.host(), rejects[0].key)
	var got, returned *LimitError
	require.ErrorAs(t, rejects[0].err, &got)
	require.ErrorAs(t, err, &returned)
	assert.Same(t, returned, got, "OnReject gets the error RoundTrip returns")
	assert.Len(t, sents, 1, "a refused request is not sent")
}

// TestObserverOnRejectCalledForNegativeCost: a request whose CostFunc
// returns a negative cost is refused without being sent, so OnReject must
// see it ("OnReject is called when a request is refused without being sent;
// err is the *LimitError (or other error) that RoundTrip returns").
func TestObserverOnRejectCalledForNegativeCost(t *testing.T) {
	srv := newRecServer(t, nil)
	tb, err := NewTokenBucket(PerSecond(10), 5)
	require.NoError(t, err)
	var obs obsRecorder
	tr := mustNewTransport(t, srv.base(), WithLimiter(tb), WithObserver(obs.observer()),
		WithCostFunc(func(*http.Request) int { return -1 }))
	req, body := newSpyPost(t, context.Background(), srv.URL, "x")
	_, err = checkedRoundTrip(t, tr, req)
	require.Error(t, err)
	assert.True(t, body.closed())
	assert.Zero(t, srv.count())
	_, rejects, sents := obs.snapshot()
	assert.Empty(t, sents)
	if assert.Len(t, rejects, 1, "OnReject was not called for a request refused for its negative cost") {
		assert.Equal(t, srv.host(), rejects[0].key)
		assert.Equal(t, err, rejects[0].err)
	}
}

func TestObserverOnSent(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
	}{
		// Statuses that no retry policy retries: OnSent is called once.
		{"ok", http.StatusOK},
		{"client error is a response, not an error", http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newRecServer(t, nil)
			srv.status.Store(int32(tc.status))
			tb, err := NewTokenBucket(PerSecond(100), 10)
			require.NoError(t, err)
			var obs obsRecorder
			tr := mustNewTransport(t, srv.base(), WithLimiter(tb), WithObserver(obs.observer()))
			status, err := checkedRoundTrip(t, tr, newPlainGet(t, context.Background(), srv.URL))
			require.NoError(t, err)
			assert.Equal(t, tc.status, status)
			_, rejects, sents := obs.snapshot()
			assert.Empty(t, rejects)
			assert.Equal(t, []obsSent{{key: srv.host(), attempt: 1, status: tc.status}}, sents)
		})
	}

	t.Run("transport error", func(t *testing.T) {
		srv := httptest.NewServer(http.NotFoundHandler())
		target, host := srv.URL, srv.Listener.Addr().String()
		srv.Close() // nothing listens there now

		base := &http.Transport{}
		defer base.CloseIdleConnections()
		tb, err := NewTokenBucket(PerSecond(100), 10)
		require.NoError(t, err)
		var obs obsRecorder
		tr := mustNewTransport(t, base, WithLimiter(tb), WithObserver(obs.observer()))
		// A POST without an Idempotency-Key: not retried on a network error.
		req, body := newSpyPost(t, context.Background(), target, "x")
		_, err = checkedRoundTrip(t, tr, req)
		require.Error(t, err)
		assert.True(t, body.closed())
		assert.NotErrorIs(t, err, ErrRateLimited)
		_, rejects, sents := obs.snapshot()
		assert.Empty(t, rejects, "a request that was sent is not a rejection")
		require.Len(t, sents, 1)
		assert.Equal(t, host, sents[0].key)
		assert.Equal(t, 1, sents[0].attempt)
		assert.Zero(t, sents[0].status)
		assert.Equal(t, err, sents[0].err)
	})
}

func TestRoundTripAllocs(t *testing.T) {
	tb, err := NewTokenBucket(PerSecond(benchRate), benchBurst)
	require.NoError(t, err)
	lb, err := NewLeakyBucket(PerSecond(benchRate), benchBurst)
	require.NoError(t, err)
	hooks := Observer{
		OnWait:   func(string, time.Duration) {},
		OnReject: func(string, error) {},
		OnSent:   func(string, int, int, error) {},
	}
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{"no limiter", nil},
		{"tokenbucket", []Option{WithLimiter(tb)}},
		{"tokenbucket+observer", []Option{WithLimiter(tb), WithObserver(hooks)}},
		{"leakybucket", []Option{WithLimiter(lb)}},
		{"leakybucket+observer", []Option{WithLimiter(lb), WithObserver(hooks)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := mustNewTransport(t, newNop(), tc.opts...)
			req := newPlainGet(t, context.Background(), "https://api.example.com/v1/charges")
			var failed error
			allocs := testing.AllocsPerRun(200, func() {
				if _, err := tr.RoundTrip(req); err != nil && failed == nil {
					failed = err
				}
			})
			require.NoError(t, failed)
			assert.Zero(t, allocs, "allocations per RoundTrip on the allowed path")
		})
	}
}

// ---- CloseIdleConnections ----

// idleCloseCounter is a base RoundTripper that counts CloseIdleConnections calls.
type idleCloseCounter struct {
	nopTransport
	closes atomic.Int32
}

func (c *idleCloseCounter) CloseIdleConnections() { c.closes.Add(1) }

func TestCloseIdleConnections(t *testing.T) {
	t.Run("forwards to the base", func(t *testing.T) {
		base := &idleCloseCounter{nopTransport: newNop()}
		tr := mustNewTransport(t, base)
		tr.CloseIdleConnections()
		assert.Equal(t, int32(1), base.closes.Load())

		// And so through an http.Client.
		(&http.Client{Transport: tr}).CloseIdleConnections()
		assert.Equal(t, int32(2), base.closes.Load())
	})
	t.Run("base without the method", func(t *testing.T) {
		tr := mustNewTransport(t, newNop())
		assert.NotPanics(t, tr.CloseIdleConnections)
	})
}
