// Command stripe-like shows what egress does for a fleet that calls a
// rate-limited provider. It starts a fake payments API on 127.0.0.1 that
// accepts -rate requests per second (burst -burst) over all its callers, then
// runs a fleet of -instances simulated pods, each with its own http.Client
// and -workers goroutines, twice: first without egress (a plain client that
// retries a 429 at once, up to three times: the 429 storm), then with egress
// (one token bucket for the whole fleet, set to the provider's limit; the
// provider's Retry-After pauses the whole fleet; polite retries).
//
//	go run ./examples/stripe-like
//	go run ./examples/stripe-like -rate 30 -instances 8 -duration 5s
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/egress-go/egress"
	"github.com/egress-go/egress/internal/fakeapi"
)

type settings struct {
	rate      float64
	burst     int
	instances int
	workers   int
	duration  time.Duration
}

func main() {
	var s settings
	fs := flag.NewFlagSet("stripe-like", flag.ContinueOnError)
	fs.Float64Var(&s.rate, "rate", 50, "the provider's limit, requests per second over the whole fleet")
	fs.IntVar(&s.burst, "burst", 10, "the provider's burst")
	fs.IntVar(&s.instances, "instances", 4, "simulated pods, each with its own http.Client")
	fs.IntVar(&s.workers, "workers", 8, "goroutines per pod")
	fs.DurationVar(&s.duration, "duration", 8*time.Second, "length of each run")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if err := s.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "stripe-like:", err)
		os.Exit(2)
	}
	if err := run(s, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "stripe-like:", err)
		os.Exit(1)
	}
}

func (s settings) validate() error {
	switch {
	case !(s.rate > 0):
		return fmt.Errorf("-rate %v: must be positive", s.rate)
	case s.burst < 1:
		return fmt.Errorf("-burst %d: must be at least 1", s.burst)
	case s.instances < 1:
		return fmt.Errorf("-instances %d: must be at least 1", s.instances)
	case s.workers < 1:
		return fmt.Errorf("-workers %d: must be at least 1", s.workers)
	case s.duration <= 0:
		return fmt.Errorf("-duration %v: must be positive", s.duration)
	}
	return nil
}

// result is what one run measured.
type result struct {
	name         string
	stats        fakeapi.Stats
	done, failed int
	p50, p99     time.Duration
}

func run(s settings, out io.Writer) error {
	fmt.Fprintf(out, "provider limit: %v req/s (burst %d); fleet: %d pods × %d workers; %v per run\n\n",
		s.rate, s.burst, s.instances, s.workers, s.duration)
	plain, err := runFleet(s, out, "without egress", func(base http.RoundTripper) http.RoundTripper {
		return naiveRetry{base}
	})
	if err != nil {
		return err
	}
	// One limiter for the whole fleet: in one process it is shared in memory;
	// across processes, the shared limiters do this through Redis.
	limiter, err := egress.NewTokenBucket(egress.PerSecond(s.rate), max(1, s.burst/2))
	if err != nil {
		return err
	}
	shaped, err := runFleet(s, out, "with egress", func(base http.RoundTripper) http.RoundTripper {
		tr, err := egress.New(base, egress.WithLimiter(limiter), egress.WithRetry(egress.RetryPolicy{MaxAttempts: 4}))
		if err != nil {
			panic(err) // the options are constants: a failure is a bug here
		}
		return tr
	})
	if err != nil {
		return err
	}
	report(out, s, plain, shaped)
	return nil
}

// runFleet runs the fleet against a fresh API for s.duration, printing one
// line a second.
func runFleet(s settings, out io.Writer, name string, wrap func(http.RoundTripper) http.RoundTripper) (result, error) {
	api, err := fakeapi.Start(fakeapi.Config{Rate: s.rate, Burst: s.burst})
	if err != nil {
		return result{}, err
	}
	defer api.Close()
	fmt.Fprintf(out, "— %s\n", name)
	start := time.Now()
	end := start.Add(s.duration)

	var (
		mu        sync.Mutex
		latencies []time.Duration
		failed    atomic.Int64
		wg        sync.WaitGroup
	)
	for range s.instances {
		base := &http.Transport{MaxIdleConnsPerHost: s.workers}
		defer base.CloseIdleConnections()
		client := &http.Client{Transport: wrap(base)}
		for range s.workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 100_000 && time.Now().Before(end); i++ {
					t0 := time.Now()
					if !pay(client, api.URL()) {
						failed.Add(1)
						continue
					}
					mu.Lock()
					latencies = append(latencies, time.Since(t0))
					mu.Unlock()
				}
			}()
		}
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	stop := make(chan struct{})
	go func() { wg.Wait(); close(stop) }()
	for sec := 1; ; sec++ {
		select {
		case <-tick.C:
			st := api.Stats(start)
			fmt.Fprintf(out, "  t=%2ds  upstream requests %5d  accepted %5d  429s %5d\n", sec, st.Requests, st.Accepted, st.Rejected)
			continue
		case <-stop:
		}
		break
	}
	slices.Sort(latencies)
	return result{
		name: name, stats: api.Stats(start), done: len(latencies), failed: int(failed.Load()),
		p50: quantile(latencies, 0.50), p99: quantile(latencies, 0.99),
	}, nil
}

// pay makes one charge, with the 5 s timeout a service would give it, and
// reports whether it succeeded.
func pay(client *http.Client, url string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/charges", strings.NewReader("amount=2000&currency=usd"))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// naiveRetry is what many clients do: on a 429, send again at once, up to
// three times.
type naiveRetry struct{ base http.RoundTripper }

func (n naiveRetry) RoundTrip(req *http.Request) (*http.Response, error) {
	for attempt := 1; ; attempt++ {
		r := req.Clone(req.Context())
		if req.GetBody != nil {
			body, err := req.GetBody()
			if err != nil {
				return nil, err
			}
			r.Body = body
		}
		resp, err := n.base.RoundTrip(r)
		if err != nil || resp.StatusCode != http.StatusTooManyRequests || attempt == 4 {
			return resp, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(q*float64(len(sorted)-1))]
}

func report(out io.Writer, s settings, runs ...result) {
	fmt.Fprintf(out, "\n%-34s", "")
	for _, r := range runs {
		fmt.Fprintf(out, "%16s", r.name)
	}
	row := func(label string, f func(result) string) {
		fmt.Fprintf(out, "\n%-34s", label)
		for _, r := range runs {
			fmt.Fprintf(out, "%16s", f(r))
		}
	}
	row("charges accepted", func(r result) string { return fmt.Sprint(r.stats.Accepted) })
	row("429s received", func(r result) string { return fmt.Sprint(r.stats.Rejected) })
	row("upstream requests", func(r result) string { return fmt.Sprint(r.stats.Requests) })
	row("failed charges", func(r result) string { return fmt.Sprint(r.failed) })
	row("p50 latency", func(r result) string { return r.p50.Round(time.Millisecond).String() })
	row("p99 latency", func(r result) string { return r.p99.Round(time.Millisecond).String() })
	row(fmt.Sprintf("max accepted in 1 s (limit %v)", s.rate), func(r result) string { return fmt.Sprint(r.stats.MaxPerSecond) })
	fmt.Fprintln(out)
	fmt.Fprintln(out, "\naccepted per second:")
	for _, r := range runs {
		fmt.Fprintf(out, "  %s\n", r.name)
		for i, n := range r.stats.PerSecond {
			bar := strings.Repeat("█", int(float64(n)/max(1, float64(s.rate)+float64(s.burst))*40))
			fmt.Fprintf(out, "  %3ds %4d %s\n", i, n, bar)
		}
	}
}
