package sdk

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egress-go/egress"
	"github.com/egress-go/egress/internal/fakeapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v82"
)

// newStripe returns a stripe-go client as a user makes one, its HTTP
// client hc; retries nil leaves MaxNetworkRetries at its default (2).
func newStripe(url string, hc *http.Client, retries *int64) *stripe.Client {
	b := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(url),
		HTTPClient:        hc,
		MaxNetworkRetries: retries,
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return stripe.NewClient("sk_test", stripe.WithBackends(&stripe.Backends{API: b, Connect: b, Uploads: b, MeterEvents: b}))
}

// stripeCharge creates one charge with a client of newStripe.
func stripeCharge(ctx context.Context, sc *stripe.Client, tag string) error {
	p := &stripe.ChargeCreateParams{
		Amount:      stripe.Int64(2000),
		Currency:    stripe.String(stripe.CurrencyUSD),
		Description: stripe.String("charge " + tag),
	}
	p.Headers = http.Header{callHeader: {tag}}
	_, err := sc.V1Charges.Create(ctx, p)
	return err
}

// stripeDefaultCharge is stripeCharge with stripe-go's default retries.
func stripeDefaultCharge(ctx context.Context, url string, hc *http.Client, tag string) error {
	return stripeCharge(ctx, newStripe(url, hc, nil), tag)
}

// stripeStatus is the status of a *stripe.Error in err.
func stripeStatus(err error) (int, bool) {
	var e *stripe.Error
	if !errors.As(err, &e) {
		return 0, false
	}
	return e.HTTPStatusCode, true
}

// startAPI starts a Stripe-like API for the test; its limit is out of
// reach unless cfg sets one.
func startAPI(t *testing.T, cfg fakeapi.Config) http.Handler {
	t.Helper()
	if cfg.Rate == 0 && len(cfg.Limits) == 0 {
		cfg.Rate, cfg.Burst = 10000, 10000
	}
	api, err := fakeapi.Start(cfg)
	require.NoError(t, err)
	t.Cleanup(api.Close)
	return fakeapi.StripeShouldRetry(api)
}

// TestStripeAttemptsPerCall: with stripe-go's default retries and egress
// WithRetry(MaxAttempts 3), a provider answering every attempt 429 or 503
// sees each call at most 3 times, and the caller gets a *stripe.Error
// with the provider's status. stripe-go sends a lock timeout's 429 again
// (with the same Idempotency-Key) whatever Stripe-Should-Retry says; it
// does not send a rate limit's 429 or a 503 with Stripe's error body.
func TestStripeAttemptsPerCall(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		cfg    fakeapi.Config
		status int
	}{
		{"429 rate limit, Retry-After 1", fakeapi.Config{Storm: fakeapi.Storm{Share: 1, RetryAfter: time.Second}}, 429},
		{"429 lock_timeout, Stripe-Should-Retry true, Retry-After 1",
			fakeapi.Config{Storm: fakeapi.Storm{Share: 1, LockTimeout: true, RetryAfter: time.Second}}, 429},
		{"503 without Retry-After", fakeapi.Config{Unavailable: 1}, 503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkAttemptsPerCall(t, stripeDefaultCharge, stripeStatus, startAPI(t, tc.cfg), tc.status)
		})
	}
}

// TestStripeRefusalIsNotSent: a call egress refuses reaches the provider
// 0 times, though stripe-go sends it again (the same request, with the
// same Idempotency-Key), and its error matches egress.ErrRateLimited.
func TestStripeRefusalIsNotSent(t *testing.T) {
	t.Parallel()
	checkRefusalNotSent(t, stripeDefaultCharge, startAPI(t, fakeapi.Config{}))
}

// runCharges makes calls charges with workers workers, each with
// deadline, and returns their errors, in order.
func runCharges(sc *stripe.Client, calls, workers int, deadline time.Duration) []error {
	errs := make([]error, calls)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= calls {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				errs[i] = stripeCharge(ctx, sc, fmt.Sprintf("call-%d", i))
				cancel()
			}
		})
	}
	wg.Wait()
	return errs
}

// TestStripeLockTimeoutStormSpendsNoBudget: a storm of lock timeouts (a
// fifth of the attempts answered 429 lock_timeout with Retry-After 1 and
// Stripe-Should-Retry: true) is not about the quota, and its retries do
// not spend the retry budget: with stripe-go's retries off and egress
// retrying, at most 1 call in 100 fails. (Charged to the budget, the
// retries a fifth of the attempts need, about 25 per 100 calls, would
// exceed its 20%.) MaxAttempts is 5, not 3, so that calls unlucky
// enough to be throttled on every attempt stay rare: 0.2^5 per call.
func TestStripeLockTimeoutStormSpendsNoBudget(t *testing.T) {
	t.Parallel()
	p := serve(t, startAPI(t, fakeapi.Config{
		Seed:  7,
		Storm: fakeapi.Storm{Share: 0.2, LockTimeout: true, RetryAfter: time.Second},
	}))
	var budgetOut atomic.Int64
	hc := egressClient(t, egress.WithRetry(egress.RetryPolicy{MaxAttempts: 5}),
		egress.WithObserver(egress.Observer{OnBudgetExhausted: func(string) { budgetOut.Add(1) }}))
	const calls, workers = 100, 4
	start := time.Now()
	errs := runCharges(newStripe(p.url, hc, stripe.Int64(0)), calls, workers, 30*time.Second)
	took := time.Since(start)

	failed := 0
	for i, err := range errs {
		if err != nil {
			failed++
			t.Logf("call-%d failed: %v; attempts %s", i, err, describe(p.of(fmt.Sprintf("call-%d", i))))
		}
	}
	hs := p.recorded()
	storms := 0
	for _, h := range hs {
		if h.status == http.StatusTooManyRequests {
			storms++
		}
	}
	t.Logf("%d calls in %v: %d failed; %d attempts at the provider, %d of them lock timeouts; retry budget exhausted %d times",
		calls, took.Round(10*time.Millisecond), failed, len(hs), storms, budgetOut.Load())
	assert.LessOrEqual(t, failed, 1, "calls failed in a storm of lock timeouts")
	assert.Zero(t, budgetOut.Load(), "retries of lock timeouts refused by the retry budget")
}

// TestStripeOutageRetriesWithinBudget: a provider that answers every
// request 503 without Retry-After gets at most 20% of its first attempts
// again. 100 calls go in well under 10 s, so the budget's floor (10 per
// 10 s) is below its ratio (20 of 100) and the ratio is what is tested.
// stripe-go does not send a 503 with Stripe's error body again, so every
// retry is egress's.
func TestStripeOutageRetriesWithinBudget(t *testing.T) {
	t.Parallel()
	p := serve(t, startAPI(t, fakeapi.Config{Unavailable: 1}))
	hc := egressClient(t, egress.WithRetry(egress.RetryPolicy{}))
	const calls, workers = 100, 4
	start := time.Now()
	errs := runCharges(newStripe(p.url, hc, nil), calls, workers, 10*time.Second)
	took := time.Since(start)

	for i, err := range errs {
		got, ok := stripeStatus(err)
		assert.True(t, ok && got == http.StatusServiceUnavailable, "call-%d: want a *stripe.Error with status 503, got %v", i, err)
	}
	hs := p.recorded()
	firsts := map[string]bool{}
	for _, h := range hs {
		firsts[h.call] = true
	}
	retries := len(hs) - len(firsts)
	t.Logf("%d calls in %v: %d first attempts and %d retries at the provider (%.1f%%)",
		calls, took.Round(10*time.Millisecond), len(firsts), retries, 100*float64(retries)/float64(max(1, len(firsts))))
	require.GreaterOrEqual(t, len(firsts), 60, "first attempts")
	assert.Less(t, took, 10*time.Second, "the run outlasted the budget's window")
	assert.LessOrEqual(t, float64(retries), 0.2*float64(len(firsts)), "retries per first attempt")
}
