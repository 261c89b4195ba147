package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"time"
)

// settings are the validated flags.
type settings struct {
	duration  time.Duration // of each run
	instances int
	workers   int

	rpm, tpm int           // the provider's limits per minute
	minute   time.Duration // the provider's (scaled) minute
	latency  time.Duration // before a response, or a stream's first event
	streams  float64       // share of the requests that ask for a stream

	estimateError float64 // 0: egress.LLMCost; else the noisy estimate's ± share
}

// Bounds of the flags, so that a demo stays a demo.
const (
	maxInstances = 64
	maxWorkers   = 64
	maxDuration  = 10 * time.Minute
	maxLatency   = 10 * time.Second
	minMinute    = 100 * time.Millisecond
	maxLimit     = 100_000_000
	// minTPM has room for the largest estimate: a request reserves at most
	// 256 + 300 tokens, the noisy estimate at most twice that.
	minTPM = 2000
)

// flags declares the flags on a new FlagSet writing to out; set receives
// them.
func flags(set *settings, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("llm-like", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.DurationVar(&set.duration, "duration", 8*time.Second, "length of each run; at least two -minute periods")
	fs.IntVar(&set.instances, "instances", 4, "simulated pods, each with its own http.Client")
	fs.IntVar(&set.workers, "workers", 8, "goroutines per pod, each calling as fast as it can")
	fs.IntVar(&set.rpm, "rpm", 600, "the provider's requests per minute, over the whole fleet")
	fs.IntVar(&set.tpm, "tpm", 60_000, "the provider's tokens (input + output) per minute, over the whole fleet")
	fs.DurationVar(&set.minute, "minute", 2*time.Second, "the provider's minute, scaled down so that a run shows several")
	fs.DurationVar(&set.latency, "latency", 100*time.Millisecond, "the provider's latency before a response (plus "+perToken.String()+" per output token)")
	fs.Float64Var(&set.streams, "stream", 0.25, "share of the requests streamed as server-sent events")
	fs.Float64Var(&set.estimateError, "estimate-error", 0, "0: estimate with egress.LLMCost; e in (0, 1): true input + max_tokens, times a factor uniform in [1−e, 1+e]")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: go run ./examples/llm-like [flags]\n\n"+
			"Runs a fleet against a fake LLM API limited in requests and tokens per minute, without egress then with it.\n\n")
		fs.PrintDefaults()
	}
	return fs
}

// parse reads and validates the flags. It prints nothing: a flag it cannot
// read or a value out of range is an error naming the flag; -h is
// flag.ErrHelp.
func parse(args []string) (settings, error) {
	var s settings
	fs := flags(&s, io.Discard)
	if err := fs.Parse(args); err != nil {
		return s, err
	}
	if fs.NArg() > 0 {
		return s, fmt.Errorf("unexpected argument %q: every setting is a flag", fs.Arg(0))
	}
	return s, s.validate()
}

// validate checks every value, naming the flag of each one out of range.
func (s settings) validate() error {
	var errs []error
	bad := func(name string, v any, why string) { errs = append(errs, fmt.Errorf("-%s %v: %s", name, v, why)) }
	if s.instances < 1 || s.instances > maxInstances {
		bad("instances", s.instances, fmt.Sprintf("must be in [1, %d]", maxInstances))
	}
	if s.workers < 1 || s.workers > maxWorkers {
		bad("workers", s.workers, fmt.Sprintf("must be in [1, %d]", maxWorkers))
	}
	if s.rpm < 1 || s.rpm > maxLimit {
		bad("rpm", s.rpm, fmt.Sprintf("must be in [1, %d]", maxLimit))
	}
	if s.tpm < minTPM || s.tpm > maxLimit {
		bad("tpm", s.tpm, fmt.Sprintf("must be in [%d, %d]: room for the largest request's estimate", minTPM, maxLimit))
	}
	minuteOK := s.minute >= minMinute && s.minute <= time.Minute
	if !minuteOK {
		bad("minute", s.minute, fmt.Sprintf("must be in [%v, 1m0s]", minMinute))
	}
	switch {
	case s.duration <= 0 || s.duration > maxDuration:
		bad("duration", s.duration, fmt.Sprintf("must be positive and at most %v", maxDuration))
	case minuteOK && s.duration < 2*s.minute:
		bad("duration", s.duration, fmt.Sprintf("must be at least two -minute periods (%v): the first one is the initial burst", 2*s.minute))
	}
	if s.latency < 0 || s.latency > maxLatency {
		bad("latency", s.latency, fmt.Sprintf("must be in [0, %v]", maxLatency))
	}
	if !(s.streams >= 0 && s.streams <= 1) { // NaN too
		bad("stream", s.streams, "must be a share in [0, 1]")
	}
	if !(s.estimateError >= 0 && s.estimateError < 1) {
		bad("estimate-error", s.estimateError, "must be in [0, 1): 0 for egress.LLMCost, else the noisy estimate's ± share")
	}
	return errors.Join(errs...)
}

// periods is the number of whole provider periods in a run.
func (s settings) periods() int { return int(s.duration / s.minute) }
