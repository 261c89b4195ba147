package fakellm

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/egress-go/egress/internal/clock"
)

// The defaults New applies to a zero field of Config.
const (
	// DefaultMinute is the period of the limits: a real minute.
	DefaultMinute = time.Minute
	// DefaultMaxTokens is the max_tokens of an OpenAI request that sets
	// neither max_tokens nor max_completion_tokens.
	DefaultMaxTokens = 4096
)

// Enforcement is how a limit gives back what was spent.
type Enforcement int

const (
	// TokenBucket holds a limit's whole quota and refills it continuously,
	// quota per Minute; its reset is the time until it is full again
	// (OpenAI's behaviour). The default.
	TokenBucket Enforcement = iota
	// FixedWindow accepts the quota in each window of one Minute, aligned
	// on multiples of Minute since the zero time; the whole quota comes
	// back at the window's end.
	FixedWindow
	// SlidingWindow accepts at most the quota in any window of one Minute:
	// what was spent at t is back at t + Minute.
	SlidingWindow
)

// String returns the enforcement's name, such as "TokenBucket".
func (e Enforcement) String() string {
	switch e {
	case TokenBucket:
		return "TokenBucket"
	case FixedWindow:
		return "FixedWindow"
	case SlidingWindow:
		return "SlidingWindow"
	}
	return fmt.Sprintf("Enforcement(%d)", int(e))
}

// Upfront is what a request is charged when it is admitted, before its
// output is known; the actual tokens are charged when it completes. A
// request is admitted only when every limit has room for its up-front
// charge. Every rule charges 1 request and the input tokens to InputTPM.
type Upfront int

const (
	// ReserveInputAndMax charges input + max_tokens to TPM and max_tokens to
	// OutputTPM, then refunds what the output did not use. The default:
	// since the actual charge is never more than the reservation, no limit
	// is ever exceeded.
	ReserveInputAndMax Upfront = iota
	// ReserveLarger charges the larger of input and max_tokens to TPM (the
	// rule OpenAI's guide states: "the maximum of max_tokens and the
	// estimated number of tokens based on the character count of your
	// request") and max_tokens to OutputTPM. Completions whose input +
	// output exceeds that are charged the excess when they end, which can
	// take TPM over its quota.
	ReserveLarger
	// ReserveInput charges only the input tokens up front; the output is
	// charged when the completion ends, which can take TPM and OutputTPM
	// over their quota (a token bucket goes into debt).
	ReserveInput
)

// String returns the rule's name, such as "ReserveInputAndMax".
func (u Upfront) String() string {
	switch u {
	case ReserveInputAndMax:
		return "ReserveInputAndMax"
	case ReserveLarger:
		return "ReserveLarger"
	case ReserveInput:
		return "ReserveInput"
	}
	return fmt.Sprintf("Upfront(%d)", int(u))
}

// Distribution draws a completion's output tokens from u, a number drawn
// uniformly in [0, 1), and the request's maxTokens (at least 1). The
// Server clamps the result to [1, maxTokens].
type Distribution func(u float64, maxTokens int) int

// Uniform draws uniformly among the integers from ⌈lo·maxTokens⌉ to
// ⌊hi·maxTokens⌋, both clamped to [1, maxTokens] (hi below lo counts as lo).
// Uniform(1, 1) always draws maxTokens; Uniform(0.5, 0.5) half of it.
func Uniform(lo, hi float64) Distribution {
	return func(u float64, maxTokens int) int {
		m := float64(maxTokens)
		a := clamp(int(math.Ceil(lo*m)), 1, maxTokens)
		b := clamp(int(math.Floor(hi*m)), a, maxTokens)
		return min(b, a+int(u*float64(b-a+1)))
	}
}

func clamp(n, lo, hi int) int { return max(lo, min(n, hi)) }

// Config is the provider's behaviour. New validates it; the zero value of
// each field is documented with it.
type Config struct {
	// RPM is the number of requests accepted per Minute. Zero: no request
	// limit, and no requests headers.
	RPM int
	// TPM is the number of tokens, input + output, accepted per Minute.
	// Zero: no such limit, and no tokens headers (unless InputTPM or
	// OutputTPM is set, in Anthropic's headers).
	TPM int
	// InputTPM and OutputTPM are separate limits on the input and on the
	// output tokens per Minute, as Anthropic has. Zero: no such limit. The
	// OpenAI endpoint enforces them but has no headers for them.
	InputTPM, OutputTPM int
	// Minute is the period of every limit. Zero: DefaultMinute. Tests use
	// short ones, such as 200ms; at least a millisecond.
	Minute time.Duration
	// Enforcement is how the limits give back what was spent. Zero:
	// TokenBucket.
	Enforcement Enforcement
	// Upfront is what a request is charged when admitted. Zero:
	// ReserveInputAndMax.
	Upfront Upfront

	// OmitLimitHeaders leaves out the limit, remaining and reset headers.
	OmitLimitHeaders bool
	// OmitRetryAfter leaves out retry-after-ms and retry-after on a 429.
	OmitRetryAfter bool
	// StreamUsageOnRequest sends an OpenAI stream's usage chunk only when
	// the request sets stream_options.include_usage, as OpenAI does. False:
	// always send it. (Anthropic's stream always carries usage.)
	StreamUsageOnRequest bool

	// DefaultMaxTokens is the max_tokens of an OpenAI request that has
	// none. Zero: DefaultMaxTokens. Anthropic's requests must set it.
	DefaultMaxTokens int
	// Output draws each completion's output tokens. Nil: Uniform(0.25, 1),
	// uniform in [max_tokens/4, max_tokens].
	Output Distribution
	// Seed seeds the draws of the output tokens: the same seed and the same
	// order of admitted requests give the same outputs.
	Seed uint64

	// Latency delays a response, or a stream's first event, after the
	// request is admitted. Refusals and invalid requests are answered at
	// once. Zero: none.
	Latency time.Duration
	// PerToken adds to the delay for each output token: a response waits
	// Latency + PerToken × output; a stream waits PerToken × the chunk's
	// tokens before each chunk. Zero: none.
	PerToken time.Duration
	// Chunks is the number of content chunks a stream splits its output
	// into, at most one per token. Zero: one per token, as OpenAI does.
	Chunks int
	// ChunkDelay is a further delay before each content chunk. Zero: none.
	ChunkDelay time.Duration

	// Clock tells the time to the limits and times the delays. Nil:
	// clock.Real{}; tests of the limits may use a *clock.Fake.
	Clock clock.Clock
}

// StartingAt returns the real clock moved so that start falls on the start
// of a period of length minute: a provider on it begins its first whole
// period at start, so that its periods line up with a run that starts
// then.
func StartingAt(start time.Time, minute time.Duration) clock.Clock {
	return shifted{shift: start.Truncate(minute).Add(minute).Sub(start)}
}

// shifted is the real clock moved by shift.
type shifted struct {
	clock.Real
	shift time.Duration
}

func (c shifted) Now() time.Time { return time.Now().Add(c.shift) }

// validate returns every invalid setting, each named with its value.
func (c Config) validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("fakellm: "+format, a...)) }
	for _, f := range []struct {
		name string
		n    int
	}{{"RPM", c.RPM}, {"TPM", c.TPM}, {"InputTPM", c.InputTPM}, {"OutputTPM", c.OutputTPM},
		{"DefaultMaxTokens", c.DefaultMaxTokens}, {"Chunks", c.Chunks}} {
		if f.n < 0 {
			bad("%s %d: must not be negative", f.name, f.n)
		}
	}
	if c.Minute != 0 && c.Minute < time.Millisecond {
		bad("Minute %v: must be at least 1ms (or zero for a minute)", c.Minute)
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"Latency", c.Latency}, {"PerToken", c.PerToken}, {"ChunkDelay", c.ChunkDelay}} {
		if f.d < 0 {
			bad("%s %v: must not be negative", f.name, f.d)
		}
	}
	if c.Enforcement < TokenBucket || c.Enforcement > SlidingWindow {
		bad("Enforcement %d: unknown", int(c.Enforcement))
	}
	if c.Upfront < ReserveInputAndMax || c.Upfront > ReserveInput {
		bad("Upfront %d: unknown", int(c.Upfront))
	}
	return errors.Join(errs...)
}

// withDefaults returns c with every zero default filled in.
func (c Config) withDefaults() Config {
	if c.Minute == 0 {
		c.Minute = DefaultMinute
	}
	if c.DefaultMaxTokens == 0 {
		c.DefaultMaxTokens = DefaultMaxTokens
	}
	if c.Output == nil {
		c.Output = Uniform(0.25, 1)
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	return c
}
