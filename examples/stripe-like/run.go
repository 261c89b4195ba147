package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"sync"
	"time"

	"github.com/egress-go/egress/internal/fakeapi"
)

// Names of the two runs.
const (
	nameNaive  = "without egress"
	nameEgress = "with egress"
)

// run does what s.role says, printing to out, and returns the runs it made
// (none for -role api).
func run(ctx context.Context, s settings, out io.Writer) ([]result, error) {
	out = &lockedWriter{w: out}
	switch s.role {
	case "api":
		return nil, serveAPI(ctx, s, out)
	case "client":
		return runClients(ctx, s, out)
	default:
		return runAll(ctx, s, out)
	}
}

// apiConfig is the fake API's configuration.
func (s settings) apiConfig() fakeapi.Config {
	c := fakeapi.Config{
		Rate: s.providerRate, Burst: s.burst, Advertise: s.advertise,
		Unavailable: s.errors, Latency: s.latency, Seed: 1,
	}
	if s.apiURL != "" {
		u, _ := url.Parse(s.apiURL) // checked by validate
		c.Addr = u.Host
	}
	return c
}

// runAll runs the API and both fleets in this process, each fleet against
// a fresh API, and compares them.
func runAll(ctx context.Context, s settings, out io.Writer) ([]result, error) {
	fmt.Fprintf(out, "A fake payments API on 127.0.0.1 accepts %g charges/s (burst %d) over all its callers.\n", s.providerRate, s.burst)
	fmt.Fprintf(out, "A fleet of %d pods × %d workers charges as fast as it can, for %v: first without egress, then with it\n",
		s.instances, s.workers, s.duration)
	fmt.Fprintf(out, "(%s).\n", describeEgress(s))
	var runs []result
	for _, name := range []string{nameNaive, nameEgress} {
		api, err := fakeapi.Start(s.apiConfig())
		if err != nil {
			return nil, err
		}
		r, err := runOne(ctx, s, out, name, api.URL())
		if err == nil {
			r.upstream = api.Stats(r.start) // the provider's own count is the truth
		}
		api.Close()
		if err != nil {
			return nil, err
		}
		runs = append(runs, r)
	}
	report(out, s, "the provider's count", runs)
	return runs, nil
}

// runClients runs both fleets against the API at s.apiURL, coordinated
// through Redis with the other client processes.
func runClients(ctx context.Context, s settings, out io.Writer) ([]result, error) {
	fmt.Fprintf(out, "This process: %d pods × %d workers against %s, %v per run, without egress then with it\n",
		s.instances, s.workers, s.apiURL, s.duration)
	fmt.Fprintf(out, "(%s).\n", describeEgress(s))
	var runs []result
	for _, name := range []string{nameNaive, nameEgress} {
		if name == nameEgress {
			// The other processes were started by hand or by a script, not
			// quite together: let their first run end before this one's
			// second begins.
			fmt.Fprintf(out, "\n(%v for the other processes' first run to end)\n", settle)
			if err := sleep(ctx, settle); err != nil {
				return nil, err
			}
		}
		r, err := runOne(ctx, s, out, name, s.apiURL)
		if err != nil {
			return nil, err
		}
		runs = append(runs, r)
	}
	report(out, s, "what this process got back; the -role api process counts the whole fleet", runs)
	return runs, nil
}

// settle separates the two runs of a client process.
const settle = 2 * time.Second

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runOne builds the pods of a run, runs them against url and releases them.
func runOne(ctx context.Context, s settings, out io.Writer, name, url string) (result, error) {
	p := newNaivePods(s)
	if name == nameEgress {
		var err error
		if p, err = newEgressPods(s, func(f string, a ...any) { fmt.Fprintf(out, f+"\n", a...) }); err != nil {
			return result{}, err
		}
	}
	r := runFleet(ctx, s, out, name, p, url)
	return r, p.close()
}

// describeEgress says how the egress run is configured.
func describeEgress(s settings) string {
	where := "one limiter in this process, shared by every pod"
	if s.redisURL != "" {
		where = fmt.Sprintf("a limiter per pod, shared through Redis as %q", sharedName)
	}
	shape := fmt.Sprintf("token bucket %g/s, burst %d", s.rate, s.egressBurst())
	if s.mode == "leaky" {
		shape = fmt.Sprintf("leaky bucket %g/s, queue %d", s.rate, s.queueDepth())
	}
	return fmt.Sprintf("egress: %s, %s; up to 4 attempts", shape, where)
}

// serveAPI runs only the fake API until ctx ends or s.duration passes (when
// set), printing what it sees once a second and a summary at the end.
func serveAPI(ctx context.Context, s settings, out io.Writer) error {
	api, err := fakeapi.Start(s.apiConfig())
	if err != nil {
		return err
	}
	defer api.Close()
	fmt.Fprintf(out, "fake payments API at %s: %g charges/s, burst %d, over all its callers\n", api.URL(), s.providerRate, s.burst)
	fmt.Fprintf(out, "start the fleet in other terminals, e.g.\n  go run ./examples/stripe-like -role client -api %s -redis redis://127.0.0.1:6379\n", api.URL())
	if s.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.duration)
		defer cancel()
	}
	start := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var last fakeapi.Stats
	for sec := 1; ctx.Err() == nil; sec++ {
		select {
		case <-ctx.Done():
			continue
		case <-tick.C:
		}
		now := api.Stats(start)
		if now.Requests > last.Requests {
			fmt.Fprintf(out, "  t=%3ds  requests %5d/s  accepted %4d/s  429s %5d/s  503s %3d/s\n", sec,
				now.Requests-last.Requests, now.Accepted-last.Accepted, now.Limited-last.Limited, now.Unavailable-last.Unavailable)
		}
		last = now
	}
	report(out, s, "the provider's count, whole fleet, both runs", []result{{name: "all callers", upstream: api.Stats(start), start: start}})
	return nil
}

// lockedWriter serialises the writes of the live lines and of the limiters'
// notices.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
