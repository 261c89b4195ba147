// Command llm-like shows in about twenty seconds what egress does for a
// fleet that calls an LLM provider limited in requests and tokens per
// minute.
//
// It starts a fake OpenAI-style API (internal/fakellm) on 127.0.0.1 that
// enforces -rpm requests and -tpm tokens (input + output) per -minute over
// all its callers, as OpenAI does: a token bucket that reserves input +
// max_tokens when it admits a request and refunds what the output did not
// use when it ends. Its answers take -latency plus a little per output
// token; a share of them (-stream) are streamed as server-sent events.
// "Minute" is scaled (2 s by default), so that a short run shows several
// periods. With the defaults the tokens limit binds, not the requests one.
//
// A fleet of -instances simulated pods, each with its own http.Client and
// -workers goroutines calling as fast as they can, runs against it twice
// for -duration: first without egress (a plain client that retries a 429
// at once, up to three times), then with egress: one Limits for the whole
// fleet,
//
//	egress.NewLimits(
//		egress.WindowOf(egress.Requests, rpm, minute),
//		egress.WindowOf(egress.Tokens, tpm, minute))
//
// with WithCosts(estimate), settled from the usage of each response (JSON
// or stream), and WithRetry with its defaults. The estimate is
// egress.LLMCost (the body's size over 4, plus max_tokens); with
// -estimate-error e it is instead the request's true input tokens plus its
// max_tokens, times a factor drawn uniformly in [1−e, 1+e]: a deliberately
// noisy estimate.
//
// It prints one line per period while it runs, then the two runs side by
// side and a chart of the tokens the provider accepted in each period.
//
//	go run ./examples/llm-like
//	go run ./examples/llm-like -estimate-error 0.5
//	go run ./examples/llm-like -instances 8 -workers 4 -stream 1 -duration 12s
//
// Invalid flags print a message and exit with status 2.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := realMain(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// realMain is the program: it returns the exit status, 2 for invalid flags.
func realMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	s, err := parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		flags(&settings{}, stdout).Usage()
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "llm-like: %v\n(run with -h for the flags)\n", err)
		return 2
	}
	if _, err := run(ctx, s, stdout); err != nil {
		fmt.Fprintln(stderr, "llm-like:", err)
		return 1
	}
	return 0
}
