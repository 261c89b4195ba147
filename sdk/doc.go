// Package sdk shows egress under the providers' official Go SDKs, as most
// calls to them are made: openai-go (github.com/openai/openai-go/v3),
// anthropic-sdk-go (github.com/anthropics/anthropic-sdk-go/v2),
// stripe-go (github.com/stripe/stripe-go/v82) and go-github
// (github.com/google/go-github/v75), each configured the way a
// user configures it, with an *http.Client whose Transport is an
// egress.Transport, against the fake providers of egress's own tests
// (internal/fakellm, internal/fakeapi) served over HTTP on 127.0.0.1.
//
// The package has no API: it is its tests. They count, at the fake
// provider, the attempts that each SDK call cost, and check what a caller
// of the SDK sees, with each SDK's own retries left at their defaults:
//
//   - With WithRetry, egress is the retry authority: a call answered 429,
//     503 or 529 on every attempt reaches the provider at most
//     RetryPolicy.MaxAttempts times, the SDK's own retries included, and
//     the caller gets the SDK's typed error (*openai.Error,
//     *anthropic.Error, *stripe.Error) with the provider's status.
//   - A call egress refuses (a *egress.LimitError) never reaches the
//     provider, not even when the SDK sends it again, and the SDK's error
//     still matches egress.ErrRateLimited.
//   - Stripe's lock timeouts (429 lock_timeout, Stripe-Should-Retry: true)
//     do not spend the retry budget: nearly every call gets through a
//     storm of them; a provider answering every request 503 gets at most
//     the budget's 20% of retries.
//   - Streamed chat completions and messages under a tokens limit, with
//     egress.NewLimits and egress.LLMCost: the share of calls done within
//     their deadline, the 429s, and how close each refusal's stated wait
//     is to the time the call could in fact have gone. The tests log the
//     figures they measure.
//
// It is a module of its own, so that the SDKs never enter egress's
// go.mod; it may import egress's internal packages since its path is
// under egress's. Run it from the repository's root with
//
//	make sdk
//
// or, in this directory, go test -race -count=1 ./... (add -v for the
// figures). It takes about a minute, in real time.
package sdk
