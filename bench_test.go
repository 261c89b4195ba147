package egress

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// nopTransport answers every request with one shared response and does no
// I/O, so that a benchmark measures what sits in front of it.
type nopTransport struct{ resp *http.Response }

func (n nopTransport) RoundTrip(*http.Request) (*http.Response, error) { return n.resp, nil }

func newNop() nopTransport {
	return nopTransport{resp: &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader(""))}}
}

func benchRequest(b *testing.B) *http.Request {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "https://api.example.com/v1/charges", nil)
	if err != nil {
		b.Fatal(err)
	}
	return req
}

// plainHeaders are the headers of a response that says nothing of a
// limit, as an API answers a success: what the learning step reads of
// every response, to find none of its own.
func plainHeaders() http.Header {
	return http.Header{
		"Content-Type":              {"application/json"},
		"Content-Length":            {"512"},
		"Date":                      {"Sun, 29 Nov 2026 00:00:00 GMT"},
		"Server":                    {"nginx"},
		"Cache-Control":             {"no-cache, no-store"},
		"Request-Id":                {"req_8f3a2c"},
		"Vary":                      {"Accept-Encoding"},
		"Strict-Transport-Security": {"max-age=63072000"},
	}
}

// A rate and burst so high that every request is allowed: the benchmarks
// measure the allowed path.
const benchRate, benchBurst = 1e12, 1 << 30

func BenchmarkRoundTrip(b *testing.B) {
	tb, err := NewTokenBucket(PerSecond(benchRate), benchBurst)
	if err != nil {
		b.Fatal(err)
	}
	lb, err := NewLeakyBucket(PerSecond(benchRate), benchBurst)
	if err != nil {
		b.Fatal(err)
	}
	// Requests per second and tokens per minute, kept together; a request
	// costs only requests (the window on tokens is passed over).
	lims, err := NewLimits(BucketOf(Requests, PerSecond(benchRate), benchBurst), WindowOf(Tokens, 1<<30, time.Nanosecond))
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		opts []Option
	}{
		{"base", nil},
		{"tokenbucket", []Option{WithLimiter(tb)}},
		{"leakybucket", []Option{WithLimiter(lb)}},
		{"limits", []Option{WithLimiter(lims)}},
		{"tokenbucket+retry", []Option{WithLimiter(tb), WithRetry(RetryPolicy{})}},
		{"tokenbucket+retry+headers", []Option{WithLimiter(tb), WithRetry(RetryPolicy{})}},
		{"tokenbucket+priorities", []Option{WithLimiter(tb), WithPriorities(Priorities{})}},
		{"tokenbucket+observer", []Option{WithLimiter(tb), WithObserver(Observer{
			OnWait:   func(string, time.Duration) {},
			OnReject: func(string, error) {},
			OnSent:   func(string, int, int, error) {},
		})}},
	} {
		var rt http.RoundTripper = newNop()
		if strings.HasSuffix(bc.name, "+headers") {
			rt = nopTransport{resp: &http.Response{StatusCode: 200, Header: plainHeaders(), Body: io.NopCloser(strings.NewReader(""))}}
		}
		if bc.opts != nil {
			tr, err := New(rt, bc.opts...)
			if err != nil {
				b.Fatal(err)
			}
			rt = tr
		}
		req := benchRequest(b)
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := rt.RoundTrip(req); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(bc.name+"/parallel64", func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(32) // 2 cores × 32 = 64 goroutines
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := rt.RoundTrip(req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkRateAllow is x/time/rate alone, the floor the Transport is
// compared with.
func BenchmarkRateAllow(b *testing.B) {
	lim := rate.NewLimiter(rate.Limit(benchRate), benchBurst)
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			lim.Allow()
		}
	})
	b.Run("parallel64", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(32)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				lim.Allow()
			}
		})
	})
}
