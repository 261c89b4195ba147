package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/egress-go/egress/internal/fakellm"
)

// Names of the two runs.
const (
	nameNaive  = "without egress"
	nameEgress = "with egress"
)

// The provider's delays besides -latency: each output token adds perToken,
// and a stream comes in streamChunks content events.
const (
	perToken     = 500 * time.Microsecond
	streamChunks = 8
)

// run runs both fleets, each against a fresh provider, printing to out,
// and returns what they measured.
func run(ctx context.Context, s settings, out io.Writer) ([]result, error) {
	out = &lockedWriter{w: out}
	fmt.Fprintf(out, "A fake LLM API on 127.0.0.1 accepts %d requests and %d tokens (input + output) per \"minute\" of %v\n",
		s.rpm, s.tpm, s.minute)
	fmt.Fprintf(out, "over all its callers; it reserves input + max_tokens up front and refunds the unused output at the end.\n")
	fmt.Fprintf(out, "A fleet of %d pods × %d workers calls as fast as it can (%.0f%% streamed), for %v: first without egress, then with it\n",
		s.instances, s.workers, 100*s.streams, s.duration)
	fmt.Fprintf(out, "(egress: one Limits for the fleet, windows of %d requests and %d tokens per %v; %s; WithRetry defaults).\n",
		s.rpm, s.tpm, s.minute, describeEstimate(s))
	var runs []result
	for _, name := range []string{nameNaive, nameEgress} {
		r, err := runOne(ctx, s, out, name)
		if err != nil {
			return nil, err
		}
		runs = append(runs, r)
	}
	report(out, s, runs)
	return runs, nil
}

// runOne builds the pods of a run and a fresh provider, runs the fleet
// and releases both.
func runOne(ctx context.Context, s settings, out io.Writer, name string) (result, error) {
	p := newNaivePods(s)
	if name == nameEgress {
		var err error
		if p, err = newEgressPods(s); err != nil {
			return result{}, err
		}
	}
	api, err := startProvider(s)
	if err != nil {
		return result{}, errors.Join(err, p.close())
	}
	r := runFleet(ctx, s, out, name, p, api.url, api.start)
	r.provider = api.llm.Stats()
	return r, errors.Join(p.close(), api.close())
}

// provider is a fakellm.Server listening on 127.0.0.1.
type provider struct {
	llm   *fakellm.Server
	url   string
	start time.Time // the start of the provider's first period
	srv   *http.Server
	done  chan struct{} // closed when Serve has returned
}

// startProvider starts a provider whose periods start now: its clock is
// shifted so that its first period, which is aligned on a whole number of
// periods, begins at this instant.
func startProvider(s settings) (*provider, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	now := time.Now()
	clk := fakellm.StartingAt(now, s.minute)
	llm, err := fakellm.New(fakellm.Config{
		RPM: s.rpm, TPM: s.tpm, Minute: s.minute,
		Latency: s.latency, PerToken: perToken, Chunks: streamChunks,
		Seed: 1, Clock: clk,
	})
	if err != nil {
		ln.Close()
		return nil, err
	}
	p := &provider{llm: llm, url: "http://" + ln.Addr().String(), start: now,
		srv: &http.Server{Handler: llm}, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.srv.Serve(ln)
	}()
	return p, nil
}

func (p *provider) close() error {
	err := p.srv.Close()
	<-p.done
	return err
}

// lockedWriter serialises the writes of the live lines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
