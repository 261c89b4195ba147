package benchpeers

import (
	"context"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/failsafe-go/failsafe-go/ratelimiter"
	"github.com/hashicorp/go-retryablehttp"
	"golang.org/x/time/rate"

	"github.com/egress-go/egress"
)

// nopTransport answers every request with one shared response and does no
// I/O, so that a benchmark measures what sits in front of it. It is the same
// base as the in-package BenchmarkRoundTrip.
type nopTransport struct{ resp *http.Response }

func (n nopTransport) RoundTrip(*http.Request) (*http.Response, error) { return n.resp, nil }

func newNop() nopTransport {
	return nopTransport{resp: &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader(""))}}
}

// freshNop answers every request with a new response. failsafehttp wraps the
// response's Body in place, so it cannot be given a shared response: under
// 64 goroutines that is a data race and the wrappers pile up.
type freshNop struct{}

func (freshNop) RoundTrip(*http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Body: http.NoBody}, nil
}

// A rate and burst so high that every request is allowed: the benchmarks
// measure the allowed path.
const benchRate, benchBurst = 1e12, 1 << 30

// parallel64 is the b.SetParallelism that gives 64 goroutines.
func parallel64() int { return max(1, 64/runtime.GOMAXPROCS(0)) }

// rateRoundTripper is the smallest rate-limited RoundTripper one could write
// with x/time/rate: Allow, then the base. A floor for the Transports.
type rateRoundTripper struct {
	lim  *rate.Limiter
	base http.RoundTripper
}

func (r rateRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	if !r.lim.Allow() {
		return nil, egress.ErrRateLimited
	}
	return r.base.RoundTrip(req)
}

// BenchmarkOverhead measures every RoundTripper over a no-op base in one run,
// so that the ratios between them are fair: the base alone, egress with each
// local limiter (and with retries on), a hand-written x/time/rate
// RoundTripper, go-retryablehttp and failsafe-go. Each runs serially, through
// an http.Client, and with 64 goroutines. RateAllow is x/time/rate's Allow
// with no RoundTrip at all.
func BenchmarkOverhead(b *testing.B) {
	tb, err := egress.NewTokenBucket(egress.PerSecond(benchRate), benchBurst)
	if err != nil {
		b.Fatal(err)
	}
	lb, err := egress.NewLeakyBucket(egress.PerSecond(benchRate), benchBurst)
	if err != nil {
		b.Fatal(err)
	}
	egressRT := func(opts ...egress.Option) http.RoundTripper {
		tr, err := egress.New(newNop(), opts...)
		if err != nil {
			b.Fatal(err)
		}
		return tr
	}
	retryable := retryablehttp.NewClient()
	retryable.Logger = nil
	retryable.HTTPClient = &http.Client{Transport: newNop()}
	failsafeLimiter := ratelimiter.NewBursty[*http.Response](benchBurst, time.Second)

	for _, bc := range []struct {
		name string
		rt   http.RoundTripper
	}{
		{"base", newNop()},
		{"egress-tokenbucket", egressRT(egress.WithLimiter(tb))},
		{"egress-leakybucket", egressRT(egress.WithLimiter(lb))},
		{"egress-tokenbucket+retry", egressRT(egress.WithLimiter(tb), egress.WithRetry(egress.RetryPolicy{}))},
		{"xrate-roundtripper", rateRoundTripper{lim: rate.NewLimiter(rate.Limit(benchRate), benchBurst), base: newNop()}},
		{"retryablehttp", &retryablehttp.RoundTripper{Client: retryable}},
		{"base-fresh", freshNop{}},
		{"failsafe-ratelimiter", failsafehttp.NewRoundTripper(freshNop{}, failsafeLimiter)},
	} {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "https://api.example.com/v1/charges", nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(bc.name+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := roundTrip(bc.rt, req); err != nil {
					b.Fatal(err)
				}
			}
		})
		// Through an http.Client, as callers use it: what the client adds
		// is the same for every row (its own checks, the request's copy for
		// redirects), so the differences are the RoundTripper's.
		client := &http.Client{Transport: bc.rt}
		b.Run(bc.name+"/client", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
			}
		})
		b.Run(bc.name+"/parallel64", func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(parallel64())
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := roundTrip(bc.rt, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}

	lim := rate.NewLimiter(rate.Limit(benchRate), benchBurst)
	b.Run("xrate-allow/serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			lim.Allow()
		}
	})
	b.Run("xrate-allow/parallel64", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(parallel64())
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				lim.Allow()
			}
		})
	})
}

// roundTrip sends req through rt and closes the response body, as a caller
// must (failsafehttp releases its contexts there).
func roundTrip(rt http.RoundTripper, req *http.Request) error {
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// BenchmarkTimeNow is one read of the clock, which every limiter here does
// at least once per decision: a reference for the figures above.
func BenchmarkTimeNow(b *testing.B) {
	b.ReportAllocs()
	var t time.Time
	for b.Loop() {
		t = time.Now()
	}
	_ = t
}
