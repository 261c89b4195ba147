package fakellm

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/clock"
)

func TestSteppedValidates(t *testing.T) {
	_, err := NewStepped(SteppedConfig{Capacity: 0, Rate: -1, Step: time.Microsecond, Latency: -ms})
	require.Error(t, err)
	for _, w := range []string{"Capacity 0", "Rate -1", "Step 1µs", "Latency -1ms"} {
		assert.Contains(t, err.Error(), w)
	}
}

// TestSteppedRefillsInSteps: a bucket of 5 that gets back 2 a second in
// steps of 0.5 s (one unit a step), stated in Anthropic's headers.
func TestSteppedRefillsInSteps(t *testing.T) {
	fc := clock.NewFake(t0.Add(100 * ms)) // steps start at t0 + k·500ms
	s, err := NewStepped(SteppedConfig{Capacity: 5, Rate: 2, Step: 500 * ms, Clock: fc})
	require.NoError(t, err)
	srv := httptest.NewServer(s)
	defer srv.Close()
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	type want struct {
		status    int
		remaining string
		reset     string
		retry     string
	}
	do := func() want {
		resp, err := c.Post(srv.URL+MessagesPath, "application/json", strings.NewReader(`{}`))
		require.NoError(t, err)
		resp.Body.Close()
		h := resp.Header
		assert.Equal(t, "5", h.Get("anthropic-ratelimit-requests-limit"))
		return want{resp.StatusCode, h.Get("anthropic-ratelimit-requests-remaining"), h.Get("anthropic-ratelimit-requests-reset"), h.Get("retry-after")}
	}
	// Five accepted at t0+100ms; after each, the bucket is full again
	// one step (a unit) a request later, stated rounded up to the second.
	for i, reset := range []string{"01", "01", "02", "02", "03"} {
		assert.Equal(t, want{200, strconv.Itoa(4 - i), "2026-11-22T12:00:" + reset + "Z", ""}, do(), "request %d", i+1)
	}
	// Empty: refused until the step at t0+500ms, 400 ms away: retry-after 1.
	assert.Equal(t, want{429, "0", "2026-11-22T12:00:03Z", "1"}, do())
	fc.Advance(390 * ms) // t0+490ms: still the first step
	assert.Equal(t, want{429, "0", "2026-11-22T12:00:03Z", "1"}, do())
	fc.Advance(10 * ms) // t0+500ms: one unit back
	assert.Equal(t, want{200, "0", "2026-11-22T12:00:03Z", ""}, do())
	fc.Advance(2 * time.Second) // t0+2.5s: four more steps, one a unit
	assert.Equal(t, want{200, "3", "2026-11-22T12:00:04Z", ""}, do())
	st := s.Stats()
	assert.Equal(t, 7, st.Accepted)
	assert.Equal(t, 2, st.Refused)
	assert.InDelta(t, 5+5, st.Offered, 1e-9) // five steps since t0
	resp, err := c.Get(srv.URL + "/v1/models")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
}

// TestSteppedFractionalSteps: at 2 a second in steps of 0.25 s, a step
// gives half a unit; remaining counts whole units, and a truncated reset
// states the second it falls in.
func TestSteppedFractionalSteps(t *testing.T) {
	fc := clock.NewFake(t0)
	s, err := NewStepped(SteppedConfig{Capacity: 2, Rate: 2, Step: 250 * ms, TruncateReset: true, Clock: fc})
	require.NoError(t, err)
	now := fc.Now()
	a := s.decide(now)
	assert.Equal(t, steppedAnswer{ok: true, remaining: 1, reset: t0.Add(500 * ms)}, a)
	a = s.decide(now)
	assert.Equal(t, steppedAnswer{ok: true, remaining: 0, reset: t0.Add(time.Second)}, a)
	fc.Advance(300 * ms) // one step: half a unit
	a = s.decide(fc.Now())
	assert.Equal(t, steppedAnswer{remaining: 0, reset: t0.Add(time.Second), wait: 200 * ms}, a)
	fc.Advance(200 * ms) // two steps: a unit
	a = s.decide(fc.Now())
	assert.Equal(t, steppedAnswer{ok: true, remaining: 0, reset: t0.Add(1500 * ms)}, a)

	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, MessagesPath, strings.NewReader(`{}`)))
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.Equal(t, "2026-11-22T12:00:01Z", rec.Header().Get("anthropic-ratelimit-requests-reset"))
	assert.Equal(t, "1", rec.Header().Get("retry-after"))
	assert.Contains(t, rec.Body.String(), "rate_limit_error")
}
