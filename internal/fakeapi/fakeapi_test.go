package fakeapi

import (
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// start runs an API for the test and a client whose connections are closed
// before the API is.
func start(t *testing.T, cfg Config) (*API, *http.Client) {
	t.Helper()
	api, err := Start(cfg)
	require.NoError(t, err)
	tr := &http.Transport{}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		api.Close()
	})
	return api, &http.Client{Transport: tr}
}

// charge POSTs one charge and returns the response, its body read.
func charge(t *testing.T, c *http.Client, api *API) *http.Response {
	t.Helper()
	form := url.Values{"amount": {"2000"}, "currency": {"usd"}}
	resp, err := c.PostForm(api.URL()+"/v1/charges", form)
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp
}

func statuses(t *testing.T, c *http.Client, api *API, n int) []int {
	var got []int
	for range n {
		got = append(got, charge(t, c, api).StatusCode)
	}
	return got
}

func TestConfigValidation(t *testing.T) {
	valid := Config{Rate: 10, Burst: 2}
	cases := []struct {
		name string
		edit func(*Config)
		want []string // each must appear in the error
	}{
		{"zero rate", func(c *Config) { c.Rate = 0 }, []string{"Rate 0"}},
		{"negative rate", func(c *Config) { c.Rate = -5 }, []string{"Rate -5"}},
		{"NaN rate", func(c *Config) { c.Rate = nan() }, []string{"Rate NaN"}},
		{"infinite rate", func(c *Config) { c.Rate = inf() }, []string{"Rate +Inf"}},
		{"zero burst", func(c *Config) { c.Burst = 0 }, []string{"Burst 0", "at least 1"}},
		{"negative share", func(c *Config) { c.Unavailable = -0.1 }, []string{"Unavailable -0.1", "[0, 1]"}},
		{"share above 1", func(c *Config) { c.Unavailable = 1.5 }, []string{"Unavailable 1.5"}},
		{"NaN share", func(c *Config) { c.Unavailable = nan() }, []string{"Unavailable NaN"}},
		{"negative latency", func(c *Config) { c.Latency = -time.Millisecond }, []string{"Latency -1ms"}},
		{"all at once", func(c *Config) { *c = Config{Rate: -1, Burst: -1, Unavailable: 2, Latency: -1} },
			[]string{"Rate -1", "Burst -1", "Unavailable 2", "Latency -1ns"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := valid
			c.edit(&cfg)
			api, err := Start(cfg)
			require.Error(t, err)
			assert.Nil(t, api)
			for _, w := range c.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
	t.Run("bad address", func(t *testing.T) {
		_, err := Start(Config{Rate: 1, Burst: 1, Addr: "127.0.0.1:notaport"})
		assert.ErrorContains(t, err, "fakeapi:")
	})
}

func nan() float64 { z := 0.0; return z / z }
func inf() float64 { z := 0.0; return 1 / z }

// TestLimitEnforcedWithBurst: a full bucket accepts Burst requests at once
// and refuses the rest with 429 and Retry-After; the counts follow.
func TestLimitEnforcedWithBurst(t *testing.T) {
	api, c := start(t, Config{Rate: 1, Burst: 5})
	begin := time.Now()
	got := statuses(t, c, api, 8)
	assert.Equal(t, []int{200, 200, 200, 200, 200, 429, 429, 429}, got)

	st := api.Stats(begin)
	assert.Equal(t, 8, st.Requests)
	assert.Equal(t, 5, st.Accepted)
	assert.Equal(t, 3, st.Limited)
	assert.Zero(t, st.Unavailable+st.Other)
	assert.Len(t, st.Arrivals, 5)
	assert.Equal(t, 5, st.MaxPerSecond)
	assert.Equal(t, []int{5}, st.PerSecond)
}

func TestTooManyRequestsHeaders(t *testing.T) {
	api, c := start(t, Config{Rate: 2, Burst: 3, Advertise: true})
	for _, code := range statuses(t, c, api, 3) {
		require.Equal(t, 200, code)
	}
	resp := charge(t, c, api)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	h := resp.Header
	ra, err := strconv.Atoi(h.Get("Retry-After"))
	require.NoError(t, err, "Retry-After %q", h.Get("Retry-After"))
	assert.GreaterOrEqual(t, ra, 1)
	assert.Equal(t, `"default";q=2;w=1`, h.Get("RateLimit-Policy"))
	assert.Equal(t, `"default";r=0;t=2`, h.Get("RateLimit"), "3 tokens at 2/s: 1.5 s to full, rounded up")
	assert.Equal(t, "2", h.Get("X-RateLimit-Limit"))
	assert.Equal(t, "0", h.Get("X-RateLimit-Remaining"))
	assert.Contains(t, h.Get("Content-Type"), "application/json")
}

func TestAdvertise(t *testing.T) {
	limitHeaders := []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining"}
	t.Run("on", func(t *testing.T) {
		api, c := start(t, Config{Rate: 50, Burst: 10, Advertise: true})
		resp := charge(t, c, api)
		require.Equal(t, 200, resp.StatusCode)
		assert.Equal(t, `"default";q=50;w=1`, resp.Header.Get("RateLimit-Policy"))
		assert.Equal(t, `"default";r=9;t=1`, resp.Header.Get("RateLimit"))
		assert.Equal(t, "50", resp.Header.Get("X-RateLimit-Limit"))
		assert.Equal(t, "9", resp.Header.Get("X-RateLimit-Remaining"))
		assert.Empty(t, resp.Header.Get("Retry-After"), "a 200 asks for no wait")
	})
	t.Run("off", func(t *testing.T) {
		api, c := start(t, Config{Rate: 1, Burst: 1})
		ok, limited := charge(t, c, api), charge(t, c, api)
		require.Equal(t, 200, ok.StatusCode)
		require.Equal(t, 429, limited.StatusCode)
		assert.Equal(t, "1", limited.Header.Get("Retry-After"))
		for _, name := range limitHeaders {
			assert.Empty(t, ok.Header.Values(name), "200: %s", name)
			assert.Empty(t, limited.Header.Values(name), "429: %s", name)
		}
	})
}

func TestSetRate(t *testing.T) {
	api, c := start(t, Config{Rate: 1, Burst: 1, Advertise: true})
	assert.Equal(t, []int{200, 429}, statuses(t, c, api, 2))
	assert.Equal(t, 1.0, api.Rate())

	require.NoError(t, api.SetRate(1000))
	assert.Equal(t, 1000.0, api.Rate())
	time.Sleep(5 * time.Millisecond) // 5 tokens at the new rate; the burst keeps 1
	resp := charge(t, c, api)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, `"default";q=1000;w=1`, resp.Header.Get("RateLimit-Policy"))
	assert.Equal(t, "1000", resp.Header.Get("X-RateLimit-Limit"))

	for _, bad := range []float64{0, -1, nan(), inf()} {
		assert.ErrorContains(t, api.SetRate(bad), "Rate", "SetRate(%v)", bad)
	}
	assert.Equal(t, 1000.0, api.Rate(), "a refused SetRate changes nothing")
}

// TestSetRateConcurrent changes the rate while requests arrive (for -race).
func TestSetRateConcurrent(t *testing.T) {
	api, c := start(t, Config{Rate: 100, Burst: 5})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				if g == 0 {
					assert.NoError(t, api.SetRate(float64(10+i)))
				}
				resp, err := c.PostForm(api.URL()+"/v1/charges", url.Values{"amount": {"1"}})
				if assert.NoError(t, err) {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		}()
	}
	wg.Wait()
	st := api.Stats(time.Time{})
	assert.Equal(t, 80, st.Requests)
	assert.Equal(t, st.Requests, st.Accepted+st.Limited)
}

// TestUnavailable: the injected 503s follow the seeded draws exactly, and
// their share is near the one configured.
func TestUnavailable(t *testing.T) {
	const n, share, seed = 400, 0.25, 7
	api, c := start(t, Config{Rate: 1e6, Burst: n, Unavailable: share, Seed: seed})
	got := statuses(t, c, api, n)

	rng := rand.New(rand.NewPCG(seed, seed))
	var want []int
	for range n {
		if rng.Float64() < share {
			want = append(want, 503)
		} else {
			want = append(want, 200)
		}
	}
	assert.Equal(t, want, got, "the same seed gives the same draws")
	st := api.Stats(time.Time{})
	assert.InDelta(t, share*n, st.Unavailable, 0.25*share*n)
	assert.Equal(t, n-st.Unavailable, st.Accepted)

	for _, s := range []float64{0, 1} {
		api, c := start(t, Config{Rate: 1e6, Burst: 50, Unavailable: s})
		codes := statuses(t, c, api, 50)
		want := 200
		if s == 1 {
			want = 503
		}
		for _, code := range codes {
			assert.Equal(t, want, code, "Unavailable %v", s)
		}
	}
}

func TestUnavailableHasNoRetryAfter(t *testing.T) {
	api, c := start(t, Config{Rate: 10, Burst: 1, Unavailable: 1})
	resp := charge(t, c, api)
	assert.Equal(t, 503, resp.StatusCode)
	assert.Empty(t, resp.Header.Get("Retry-After"))
}

// TestNoRetryAfter: with NoRetryAfter, a refusal carries no Retry-After
// (nginx's limit_req), in the IETF dialect without Advertise nothing at
// all, and in a dialect that states its limits, its counts still; a
// storm's 429 keeps the Retry-After Storm gives.
func TestNoRetryAfter(t *testing.T) {
	t.Run("bare", func(t *testing.T) {
		api, c := start(t, Config{Rate: 1, Burst: 1, NoRetryAfter: true})
		ok, limited := charge(t, c, api), charge(t, c, api)
		require.Equal(t, 200, ok.StatusCode)
		require.Equal(t, 429, limited.StatusCode)
		assert.Empty(t, limited.Header.Get("Retry-After"))
		assert.Empty(t, limited.Header.Get("RateLimit"))
	})
	t.Run("with counts", func(t *testing.T) {
		api, c := start(t, Config{Rate: 1, Burst: 1, Dialect: IETFDraft, NoRetryAfter: true})
		charge(t, c, api)
		limited := charge(t, c, api)
		require.Equal(t, 429, limited.StatusCode)
		assert.Empty(t, limited.Header.Get("Retry-After"))
		assert.Equal(t, "0", limited.Header.Get("RateLimit-Remaining"))
	})
	t.Run("a storm's", func(t *testing.T) {
		api, c := start(t, Config{Rate: 100, Burst: 10, NoRetryAfter: true, Storm: Storm{Share: 1, RetryAfter: 2 * time.Second}})
		resp := charge(t, c, api)
		require.Equal(t, 429, resp.StatusCode)
		assert.Equal(t, "2", resp.Header.Get("Retry-After"))
	})
}

func TestLatency(t *testing.T) {
	const latency = 50 * time.Millisecond
	api, c := start(t, Config{Rate: 1, Burst: 1, Latency: latency})
	for _, want := range []int{200, 429} { // every response is delayed
		t0 := time.Now()
		assert.Equal(t, want, charge(t, c, api).StatusCode)
		assert.GreaterOrEqual(t, time.Since(t0), latency)
	}
}

func TestChargeNeedsAmount(t *testing.T) {
	api, c := start(t, Config{Rate: 100, Burst: 10})
	resp, err := c.Post(api.URL()+"/v1/charges", "application/x-www-form-urlencoded", strings.NewReader("currency=usd"))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, string(b), "amount")

	resp, err = c.Get(api.URL() + "/v1/charges/ch_1") // reads need no form
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	st := api.Stats(time.Time{})
	assert.Equal(t, Stats{Requests: 2, Accepted: 1, Other: 1}, Stats{
		Requests: st.Requests, Accepted: st.Accepted, Limited: st.Limited, Unavailable: st.Unavailable, Other: st.Other,
	})
}

func TestMaxInWindow(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(ms ...int) []time.Time {
		var ts []time.Time
		for _, m := range ms {
			ts = append(ts, t0.Add(time.Duration(m)*time.Millisecond))
		}
		return ts
	}
	cases := []struct {
		name  string
		times []time.Time
		want  int
	}{
		{"none", nil, 0},
		{"one", at(5), 1},
		{"all in one second", at(0, 100, 999), 3},
		{"window is half open", at(0, 1000), 1},
		{"best window is not aligned", at(0, 900, 950, 1100, 1800, 2500), 4},
		{"unsorted", at(1800, 0, 1100, 950, 2500, 900), 4},
		{"same instant", at(7, 7, 7, 7), 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := append([]time.Time(nil), c.times...)
			assert.Equal(t, c.want, MaxInWindow(c.times, time.Second))
			assert.Equal(t, before, c.times, "MaxInWindow must not reorder its input")
		})
	}
}

func TestPerWindowAndCounter(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	var c Counter
	for i, ms := range []int{-200, 10, 500, 999, 1000, 3200} {
		c.Add(t0.Add(time.Duration(ms)*time.Millisecond), 200)
		c.Add(t0, []int{429, 503, 0, 400, 429, 429}[i])
	}
	st := c.Stats(t0)
	assert.Equal(t, 12, st.Requests)
	assert.Equal(t, 6, st.Accepted)
	assert.Equal(t, 3, st.Limited)
	assert.Equal(t, 1, st.Unavailable)
	assert.Equal(t, 2, st.Other)
	assert.Equal(t, []int{3, 1, 0, 1}, st.PerSecond, "the arrival before the start is left out")
	assert.Equal(t, 4, st.MaxPerSecond, "[-200ms, 800ms) holds 3; [10ms, 1010ms) holds 4")
	assert.Equal(t, []int{3, 2, 0, 1}, c.Stats(time.Time{}).PerSecond, "a zero start is the first arrival")
	assert.Nil(t, PerWindow(nil, time.Time{}, time.Second))
}
