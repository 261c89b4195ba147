// Command stripe-like-metrics runs a small fleet of egress clients against a
// fake rate-limited payments API and serves what they do as OpenTelemetry
// metrics on a Prometheus /metrics endpoint (through the OpenTelemetry
// Prometheus exporter).
//
// The provider accepts -provider-rate charges per second (burst -burst)
// over all its callers and answers 429 with Retry-After-Ms beyond that. The
// fleet is -instances pods, each with its own egress Transport holding
// -rate/instances per second, and -workers goroutines charging as fast as
// they are let. When -provider-rate is below -rate (the provider enforces
// less than it documents), the metrics show the 429s, the pauses and the
// retries.
//
//	cd otel && go run ./examples/stripe-like-metrics
//	cd otel && go run ./examples/stripe-like-metrics -provider-rate 15 -linger
//	curl -s http://127.0.0.1:9464/metrics | grep ^egress_
//
// With -linger it keeps serving /metrics after the run until interrupted.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/egress-go/egress"
	egressotel "github.com/egress-go/egress/otel"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := realMain(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "stripe-like-metrics:", err)
		stop()
		os.Exit(1)
	}
}

// settings are the flags.
type settings struct {
	listen       string
	rate         float64 // documented: what the fleet's limiters hold
	providerRate float64 // enforced by the provider
	burst        int
	instances    int
	workers      int
	duration     time.Duration
	requests     int64 // the most charges the fleet makes; 0: no limit but the duration
	linger       bool
}

func parse(args []string) (settings, error) {
	var s settings
	fs := flag.NewFlagSet("stripe-like-metrics", flag.ContinueOnError)
	fs.StringVar(&s.listen, "listen", "127.0.0.1:9464", "address of the /metrics endpoint")
	fs.Float64Var(&s.rate, "rate", 25, "the provider's documented limit, charges per second, split over the instances")
	fs.Float64Var(&s.providerRate, "provider-rate", 20, "the limit the provider enforces, charges per second")
	fs.IntVar(&s.burst, "burst", 5, "the provider's burst")
	fs.IntVar(&s.instances, "instances", 3, "pods in the fleet")
	fs.IntVar(&s.workers, "workers", 4, "goroutines charging in each pod")
	fs.DurationVar(&s.duration, "duration", 10*time.Second, "how long the fleet runs")
	fs.Int64Var(&s.requests, "requests", 0, "the most charges the fleet makes (0: no limit but -duration)")
	fs.BoolVar(&s.linger, "linger", false, "keep serving /metrics after the run until interrupted")
	if err := fs.Parse(args); err != nil {
		return s, err
	}
	if !(s.rate > 0) || !(s.providerRate > 0) || s.burst < 1 || s.instances < 1 || s.workers < 1 || s.duration <= 0 || s.requests < 0 {
		return s, errors.New("-rate, -provider-rate, -burst, -instances, -workers and -duration must be positive, -requests not negative")
	}
	return s, nil
}

func realMain(ctx context.Context, args []string, out io.Writer) error {
	s, err := parse(args)
	if err != nil {
		return err
	}
	d, err := newDemo(s, slog.Default())
	if err != nil {
		return err
	}
	defer d.Close()
	ln, err := net.Listen("tcp", s.listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: d.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	fmt.Fprintf(out, "metrics on http://%s/metrics; the fleet runs for %v\n", ln.Addr(), s.duration)

	r := d.Run(ctx)
	fmt.Fprintf(out, "fleet: %d charges, %d succeeded, %d ended in 429, %d refused by egress, %d failed\n",
		r.calls, r.ok, r.throttled, r.refused, r.failed)
	fmt.Fprintf(out, "provider: %d received, %d accepted, %d answered 429\n",
		d.provider.received.Load(), d.provider.accepted.Load(), d.provider.throttled.Load())
	if s.linger {
		fmt.Fprintln(out, "serving /metrics until interrupted")
		<-ctx.Done()
	}
	return nil
}

// demo is the provider, the fleet and the metrics they share.
type demo struct {
	s        settings
	provider *provider
	api      *http.Server
	apiURL   string
	mp       *sdkmetric.MeterProvider
	registry *prometheus.Registry
	clients  []*http.Client
}

// newDemo starts the provider on a loopback port and makes the fleet's
// clients, all recording into one Metrics exported to a Prometheus
// registry, and logging to logger.
func newDemo(s settings, logger *slog.Logger) (*demo, error) {
	d := &demo{s: s, provider: newProvider(s.providerRate, s.burst), registry: prometheus.NewRegistry()}
	exp, err := otelprom.New(otelprom.WithRegisterer(d.registry), otelprom.WithoutTargetInfo())
	if err != nil {
		return nil, err
	}
	d.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	m, err := egressotel.NewMetrics(d.mp, egressotel.WithMaxKeys(10))
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	d.api = &http.Server{Handler: d.provider, ReadHeaderTimeout: 5 * time.Second}
	go d.api.Serve(ln)
	d.apiURL = "http://" + ln.Addr().String()

	log := egress.SlogObserver(logger) // at Info: refusals, pauses, rate changes
	for i := range s.instances {
		lim, err := egress.NewTokenBucket(egress.PerSecond(s.rate/float64(s.instances)), 1)
		if err != nil {
			return nil, err
		}
		if err := m.ObserveRates(fmt.Sprintf("pod-%d", i), lim); err != nil {
			return nil, err
		}
		base := &http.Transport{MaxIdleConnsPerHost: s.workers}
		tr, err := egress.New(m.InFlight(base),
			egress.WithLimiter(m.Limiter(lim)),
			egress.WithMaxWait(2*time.Second),
			egress.WithRetry(egress.RetryPolicy{MaxAttempts: 4}),
			egress.WithObserver(egress.Observers(m.Observer(), log)))
		if err != nil {
			return nil, err
		}
		d.clients = append(d.clients, &http.Client{Transport: tr, Timeout: 10 * time.Second})
	}
	return d, nil
}

// Handler serves the metrics at /metrics.
func (d *demo) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(d.registry, promhttp.HandlerOpts{}))
	return mux
}

// Close stops the provider and the metrics.
func (d *demo) Close() {
	d.api.Close()
	d.mp.Shutdown(context.Background())
	for _, c := range d.clients {
		c.CloseIdleConnections()
	}
}

// report is what the fleet saw.
type report struct {
	calls, ok, throttled, refused, failed int64
}

// Run has every pod's workers charge until the duration ends, ctx ends or
// the fleet has made s.requests charges. A charge has its own deadline, not
// the run's: the charges under way when the run ends are finished.
func (d *demo) Run(ctx context.Context) report {
	run, cancel := context.WithTimeout(ctx, d.s.duration)
	defer cancel()
	var r struct{ calls, ok, throttled, refused, failed atomic.Int64 }
	var wg sync.WaitGroup
	for _, c := range d.clients {
		for range d.s.workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for run.Err() == nil {
					if n := r.calls.Add(1); d.s.requests > 0 && n > d.s.requests {
						r.calls.Add(-1)
						return
					}
					switch status, err := charge(ctx, c, d.apiURL, 5*time.Second); {
					case errors.Is(err, egress.ErrRateLimited):
						r.refused.Add(1)
					case err != nil:
						r.failed.Add(1)
					case status == http.StatusTooManyRequests:
						r.throttled.Add(1)
					default:
						r.ok.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	return report{r.calls.Load(), r.ok.Load(), r.throttled.Load(), r.refused.Load(), r.failed.Load()}
}

// charge posts one charge with the given timeout and returns the
// response's status.
func charge(ctx context.Context, c *http.Client, api string, timeout time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, api+"/v1/charges", strings.NewReader("amount=2000&currency=usd"))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}
