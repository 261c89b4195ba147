// Command stripe-like shows in thirty seconds what egress does for a fleet
// that calls a rate-limited provider.
//
// It starts a fake payments API on 127.0.0.1 that accepts -rate charges per
// second (burst -burst) over all its callers and answers 429 with
// Retry-After beyond that. Then a fleet of -instances simulated pods, each
// with its own http.Client and -workers goroutines charging as fast as they
// can, runs against it twice for -duration: first without egress (a plain
// client that retries a 429 at once, up to three times: the 429 storm),
// then with egress (one limiter for the whole fleet, configured with the
// provider's documented limit; the provider's Retry-After pauses the whole
// fleet; polite retries). It prints one line a second while it runs, then
// the two runs side by side and a chart of the charges accepted per second.
//
//	go run ./examples/stripe-like
//	go run ./examples/stripe-like -mode leaky -instances 8 -duration 5s
//	go run ./examples/stripe-like -provider-rate 30   # the provider enforces less than it documents
//
// With -redis the pods coordinate through Redis, each with its own shared
// limiter, as separate processes would. With -role the API and the fleet
// run as separate processes sharing one Redis:
//
//	go run ./examples/stripe-like -role api -api http://127.0.0.1:8080
//	go run ./examples/stripe-like -role client -api http://127.0.0.1:8080 -redis redis://127.0.0.1:6379   # several times
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
		fmt.Fprintf(stderr, "stripe-like: %v\n(run with -h for the flags)\n", err)
		return 2
	}
	if _, err := run(ctx, s, stdout); err != nil {
		fmt.Fprintln(stderr, "stripe-like:", err)
		return 1
	}
	return 0
}
