//go:build go1.25

package egress

// Timing tests of retries and pauses, on the fake clock of a
// testing/synctest bubble: the requests go to an in-memory recServer
// (newMemServer), and the waits are measured where the provider would
// measure them, at the server, to the nanosecond. Time moves only when every
// goroutine of the test waits, so a load on the machine changes nothing.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTimedRetryAfterIsHonoured(t *testing.T) {
	const payload = "amount=1999&currency=eur"
	tests := []struct {
		name       string
		retryAfter func(now time.Time) string
		wantGap    func(sent time.Time) time.Duration // from a 429 to its retry
	}{
		{"delta-seconds", func(time.Time) string { return "1" }, func(time.Time) time.Duration { return time.Second }},
		// The date has whole seconds: the retry goes at the date, between
		// 1 s and 2 s after the 429.
		{"HTTP-date", func(now time.Time) string { return now.Add(2 * time.Second).Format(http.TimeFormat) },
			func(sent time.Time) time.Duration { return sent.Add(2 * time.Second).Truncate(time.Second).Sub(sent) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// Off the whole second, so that an HTTP-date rounds.
				time.Sleep(300 * time.Millisecond)
				srv := newMemServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
					if n <= 2 {
						w.Header().Set("Retry-After", tt.retryAfter(time.Now()))
						w.WriteHeader(http.StatusTooManyRequests)
						io.WriteString(w, "slow down")
						return
					}
					w.WriteHeader(http.StatusOK)
					io.WriteString(w, `{"id":"ch_1"}`)
				})
				rec := &obsRecorder{}
				tr := newRtyTransport(t, srv.memBase(), RetryPolicy{MaxAttempts: 3}, WithObserver(rec.observer()))
				req := rtyRequest(t, context.Background(), http.MethodPost, srv.URL+"/v1/charges", payload)

				resp, err := tr.RoundTrip(req)
				require.NoError(t, err)
				assert.Equal(t, http.StatusOK, resp.StatusCode)
				assert.Equal(t, `{"id":"ch_1"}`, rtyRead(t, resp), "the caller reads the 200's body")

				hits := srv.arrivals()
				require.Len(t, hits, 3)
				rtyAssertUnchanged(t, srv, req, payload)
				retries, _, _ := rec.retryLog()
				require.Len(t, retries, 2)
				for i := range 2 {
					want := tt.wantGap(hits[i].at)
					assert.Equal(t, want, hits[i+1].at.Sub(hits[i].at), "gap %d at the server", i+1)
					assert.Equal(t, i+2, retries[i].attempt)
					assert.Equal(t, http.StatusTooManyRequests, retries[i].status)
					assert.Equal(t, want, retries[i].delay, "the delay is Retry-After's")
				}
			})
		})
	}
}

func TestTimedRetryConcurrent429PausesTheKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			callers = 50
			pause   = 2 * time.Second
		)
		srv := newMemServer(t, rtyScript(rtyA(http.StatusTooManyRequests, "Retry-After", "2"), rtyA(http.StatusOK)))
		rec := &obsRecorder{}
		tr := newRtyTransport(t, srv.memBase(), RetryPolicy{MaxAttempts: 5}, WithObserver(rec.observer()))

		// The first caller meets the 429. The other 49 set off together
		// the moment the Transport has learnt the pause, while the first
		// caller's retry is waiting.
		type result struct {
			status int
			body   string
			err    error
		}
		results := make(chan result, callers)
		call := func() {
			req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, srv.URL+"/v1/balance", nil)
			if err != nil {
				results <- result{err: err}
				return
			}
			resp, err := tr.RoundTrip(req)
			if err != nil {
				results <- result{err: err}
				return
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			results <- result{status: resp.StatusCode, body: string(b), err: err}
		}
		go call()
		synctest.Wait()
		pauses, _, _ := rec.coolLog()
		require.Len(t, pauses, 1, "the first caller's 429 paused the key")
		require.Equal(t, 1, srv.count())
		for range callers - 1 {
			go call()
		}
		for range callers {
			r := <-results
			require.NoError(t, r.err)
			assert.Equal(t, http.StatusOK, r.status)
			assert.Regexp(t, `^attempt \d+: 200$`, r.body)
		}
		hits := srv.arrivals()
		require.Len(t, hits, callers+1, "one 429, its retry and 49 first attempts")
		t429 := hits[0].at
		for i, h := range hits[1:] {
			assert.Equal(t, pause, h.at.Sub(t429), "arrival %d", i+2)
		}
		pauses, _, _ = rec.coolLog()
		assert.Len(t, pauses, 1, "one pause, learnt once")
	})
}

// TestTimedRetryRequestsQueuedInTheLimiterHonourAPause: a request that was
// already waiting in the limiter when a 429 paused its key is not sent
// during the pause. 50 callers start together behind a token bucket of
// 25/s; the first gets a 429 with Retry-After: 2, and none of the others
// reaches the server for 2 s.
func TestTimedRetryRequestsQueuedInTheLimiterHonourAPause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			callers = 50
			pause   = 2 * time.Second
		)
		srv := newMemServer(t, rtyScript(rtyA(http.StatusTooManyRequests, "Retry-After", "2"), rtyA(http.StatusOK)))
		tb, err := NewTokenBucket(PerSecond(25), 1)
		require.NoError(t, err)
		tr := newRtyTransport(t, srv.memBase(), RetryPolicy{MaxAttempts: 5}, WithLimiter(tb))

		var (
			wg  sync.WaitGroup
			bad atomic.Int32
		)
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, srv.URL+"/v1/balance", nil)
				if err != nil {
					bad.Add(1)
					return
				}
				resp, err := tr.RoundTrip(req)
				if err != nil {
					bad.Add(1)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					bad.Add(1)
				}
			}()
		}
		wg.Wait()

		assert.Zero(t, bad.Load(), "every caller ends with a 200")
		hits := srv.arrivals()
		require.Len(t, hits, callers+1)
		t429 := hits[0].at
		var early []time.Duration
		for _, h := range hits[1:] {
			if d := h.at.Sub(t429); d < pause {
				early = append(early, d)
			}
		}
		assert.Empty(t, early, "requests reached the server this long after the 429 that paused their key for %v", pause)
	})
}

func TestTimedRetryDeadlineShorterThanTheWait(t *testing.T) {
	tests := []struct {
		name     string
		method   string
		answer   func() rtyAnswer
		policy   RetryPolicy
		deadline time.Duration
	}{
		{
			name: "429 with Retry-After: 5, deadline 500ms", method: http.MethodPost,
			answer:   func() rtyAnswer { return rtyA(429, "Retry-After", "5") },
			deadline: 500 * time.Millisecond,
		},
		{
			name: "503 with Retry-After: 5, deadline 500ms", method: http.MethodGet,
			answer:   func() rtyAnswer { return rtyA(503, "Retry-After", "5") },
			deadline: 500 * time.Millisecond,
		},
		{
			name: "429 with an HTTP-date 5s ahead, deadline 500ms", method: http.MethodGet,
			answer: func() rtyAnswer {
				return rtyA(429, "Retry-After", time.Now().Add(5*time.Second).Format(http.TimeFormat))
			},
			deadline: 500 * time.Millisecond,
		},
		{
			name: "429 with Retry-After: 2 beyond MaxElapsed 1s", method: http.MethodGet,
			answer:   func() rtyAnswer { return rtyA(429, "Retry-After", "2") },
			policy:   RetryPolicy{MaxElapsed: time.Second},
			deadline: 10 * time.Second,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := newMemServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
					rtyScript(tt.answer(), rtyA(200))(n, w, r)
				})
				rec := &obsRecorder{}
				tr := newRtyTransport(t, srv.memBase(), tt.policy, WithObserver(rec.observer()))
				ctx, cancel := context.WithTimeout(context.Background(), tt.deadline)
				defer cancel()
				body := ""
				if tt.method == http.MethodPost {
					body = "amount=5"
				}

				start := time.Now()
				resp, err := tr.RoundTrip(rtyRequest(t, ctx, tt.method, srv.URL+"/v1", body))
				require.NoError(t, err, "the response, not an error")
				assert.Zero(t, time.Since(start), "returned at once")
				status := tt.answer().status
				assert.Equal(t, status, resp.StatusCode)
				assert.Equal(t, fmt.Sprintf("attempt 1: %d", status), rtyRead(t, resp), "its body is readable")
				assert.Equal(t, 1, srv.count())
				retries, _, _ := rec.retryLog()
				assert.Empty(t, retries)

				// The key learnt the pause all the same: the next request
				// with a short deadline is refused at once, and not sent.
				ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel2()
				resp, err = tr.RoundTrip(rtyRequest(t, ctx2, http.MethodGet, srv.URL+"/v1", ""))
				assert.Zero(t, time.Since(start), "refused at once")
				assert.Nil(t, resp)
				var le *LimitError
				require.ErrorAs(t, err, &le)
				assert.Equal(t, ReasonDeadline, le.Reason)
				assert.Equal(t, 1, srv.count())
			})
		})
	}
}

func TestTimedRetryAfterAboveTheCap(t *testing.T) {
	const capWait = 2 * time.Second
	tests := []struct {
		name   string
		answer func() rtyAnswer
	}{
		{"429 with Retry-After: 86400", func() rtyAnswer { return rtyA(429, "Retry-After", "86400") }},
		{"503 with Retry-After: 86400", func() rtyAnswer { return rtyA(503, "Retry-After", "86400") }},
		{"429 with an HTTP-date a day ahead", func() rtyAnswer {
			return rtyA(429, "Retry-After", time.Now().Add(24*time.Hour).Format(http.TimeFormat))
		}},
		{"429 with an absurd Retry-After", func() rtyAnswer { return rtyA(429, "Retry-After", "99999999999999999999999") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := newMemServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
					rtyScript(tt.answer(), rtyA(200))(n, w, r)
				})
				rec := &obsRecorder{}
				tr := newRtyTransport(t, srv.memBase(), RetryPolicy{MaxAttempts: 5, MaxRetryAfter: capWait}, WithObserver(rec.observer()), WithMaxPause(capWait))

				start := time.Now()
				resp, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodGet, srv.URL+"/v1", ""))
				require.NoError(t, err)
				assert.Zero(t, time.Since(start), "not retried: returned at once")
				status := tt.answer().status
				assert.Equal(t, status, resp.StatusCode)
				assert.Equal(t, fmt.Sprintf("attempt 1: %d", status), rtyRead(t, resp))
				assert.Equal(t, 1, srv.count())
				retries, _, _ := rec.retryLog()
				assert.Empty(t, retries)

				pauses, _, _ := rec.coolLog()
				require.Len(t, pauses, 1)
				assert.Equal(t, obsCooldown{key: srv.host(), until: start.Add(capWait)}, pauses[0], "the key is paused for the cap")

				// The pause is the cap, not a day: the wait a request is
				// refused with is the cap.
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				_, err = tr.RoundTrip(rtyRequest(t, ctx, http.MethodGet, srv.URL+"/v1", ""))
				var le *LimitError
				require.ErrorAs(t, err, &le)
				assert.Equal(t, capWait, le.Wait)
			})
		})
	}
}

func TestTimedRetryCancelDuringTheBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := newMemServer(t, rtyScript(rtyA(503), rtyA(200)))
		rec := &obsRecorder{}
		tr := newRtyTransport(t, srv.memBase(), RetryPolicy{BaseDelay: 10 * time.Second}, WithObserver(rec.observer()))
		tr.rand = func() float64 { return 0.9 } // a 9 s backoff
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()

		type result struct {
			resp *http.Response
			err  error
			at   time.Time
		}
		done := make(chan result, 1)
		req := rtyRequest(t, ctx, http.MethodGet, srv.URL+"/v1", "")
		go func() {
			resp, err := tr.RoundTrip(req)
			done <- result{resp, err, time.Now()}
		}()
		synctest.Wait()
		retries, _, _ := rec.retryLog()
		require.Len(t, retries, 1, "a retry is planned")
		assert.Equal(t, 9*time.Second, retries[0].delay)

		time.Sleep(5 * time.Second) // well into the sleep
		cancelled := time.Now()
		cancel()
		r := <-done
		assert.Nil(t, r.resp)
		assert.ErrorIs(t, r.err, context.Canceled)
		assert.Equal(t, cancelled, r.at, "returned at once after the cancel")
		assert.Equal(t, 1, srv.count(), "the retry was never sent")
	})
}

func TestTimedRetriesPassTheLimiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval = 200 * time.Millisecond // 5/s
		// (A 502: a 503 without Retry-After waits the overload pause.)
		srv := newMemServer(t, rtyScript(rtyA(502), rtyA(200)))
		tb, err := NewTokenBucket(PerSecond(5), 1)
		require.NoError(t, err)
		rec := &obsRecorder{}
		tr := newRtyTransport(t, srv.memBase(), RetryPolicy{}, WithLimiter(tb), WithObserver(rec.observer()))

		resp, err := tr.RoundTrip(rtyRequest(t, context.Background(), http.MethodGet, srv.URL+"/v1", ""))
		require.NoError(t, err)
		assert.Equal(t, "attempt 2: 200", rtyRead(t, resp))

		hits := srv.arrivals()
		require.Len(t, hits, 2)
		// The retry leaves one interval after the first token was taken,
		// less the bucket's transit margin (see WithTransitMargin).
		gap := hits[1].at.Sub(hits[0].at)
		retries, _, _ := rec.retryLog()
		require.Len(t, retries, 1)
		assert.Zero(t, retries[0].delay, "the backoff itself was 0")
		_, _, waits := rec.coolLog()
		require.Len(t, waits, 1, "only the retry waited")
		assert.Equal(t, gap, waits[0], "the retry waited for the limiter, and only for it")
		assert.InDelta(t, interval, gap, float64(10*time.Millisecond))
	})
}
