package fakeapi

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Kind is the shape of one limit.
type Kind int

const (
	// TokenBucket holds Limit.Quota units and refills Limit.Rate units per
	// second, continuously (the shape of GCRA servers, Stripe, Shopify's
	// leaky bucket, OpenAI's per-minute limits).
	TokenBucket Kind = iota
	// FixedWindow accepts Limit.Quota units per window of Limit.Window; the
	// whole quota comes back at once at the window's end (GitHub, X,
	// Zendesk). Windows are aligned on multiples of Window since the zero
	// time, so a minute window starts on the minute.
	FixedWindow
	// SlidingWindow accepts at most Limit.Quota units in any window of
	// Limit.Window: a unit spent at t is back at t+Window.
	SlidingWindow
)

func (k Kind) String() string {
	switch k {
	case TokenBucket:
		return "TokenBucket"
	case FixedWindow:
		return "FixedWindow"
	case SlidingWindow:
		return "SlidingWindow"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Unit is what a limit counts.
type Unit int

const (
	// Requests counts one per request.
	Requests Unit = iota
	// Tokens counts a request's input and output tokens together.
	Tokens
	// InputTokens counts a request's input tokens (InputTokensHeader).
	InputTokens
	// OutputTokens counts a request's output tokens (OutputTokensHeader, or
	// the JSON body's max_tokens).
	OutputTokens
)

func (u Unit) String() string {
	switch u {
	case Requests:
		return "requests"
	case Tokens:
		return "tokens"
	case InputTokens:
		return "input-tokens"
	case OutputTokens:
		return "output-tokens"
	}
	return fmt.Sprintf("Unit(%d)", int(u))
}

// Limit is one limit the API enforces over all its callers. Build one with
// Bucket, Fixed or Sliding, or as a literal.
type Limit struct {
	// Name names the limit in the headers that carry names (the IETF
	// policies, GitHub's resource, Discord's bucket). Default: "default"
	// for a single limit, else the unit and the limit's index, such as
	// "requests-1". Names must differ.
	Name string
	// Kind is the limit's shape. Zero: TokenBucket.
	Kind Kind
	// Unit is what the limit counts. Zero: Requests.
	Unit Unit
	// Quota is the bucket's capacity (its burst), or the units accepted per
	// window. At least 1.
	Quota int
	// Rate is a TokenBucket's refill, in units per second: positive for a
	// bucket, zero for a window.
	Rate float64
	// Window is a window's length: positive for a window (at least a
	// millisecond), zero for a bucket.
	Window time.Duration
}

// Bucket is a TokenBucket limit on requests: rate per second, burst at once.
func Bucket(rate float64, burst int) Limit {
	return Limit{Kind: TokenBucket, Quota: burst, Rate: rate}
}

// Fixed is a FixedWindow limit on requests: n per window w.
func Fixed(n int, w time.Duration) Limit {
	return Limit{Kind: FixedWindow, Quota: n, Window: w}
}

// Sliding is a SlidingWindow limit on requests: at most n in any window w.
func Sliding(n int, w time.Duration) Limit {
	return Limit{Kind: SlidingWindow, Quota: n, Window: w}
}

// Of returns l counting u instead.
func (l Limit) Of(u Unit) Limit { l.Unit = u; return l }

// Named returns l named name.
func (l Limit) Named(name string) Limit { l.Name = name; return l }

// perSecond is the limit's sustained rate in units per second.
func (l Limit) perSecond() float64 {
	if l.Kind == TokenBucket {
		return l.Rate
	}
	return float64(l.Quota) / l.Window.Seconds()
}

// span is the time the limit takes to give back its whole quota: the
// window, or a bucket's quota over its rate.
func (l Limit) span() time.Duration {
	if l.Kind == TokenBucket {
		return time.Duration(float64(l.Quota) / l.Rate * float64(time.Second))
	}
	return l.Window
}

// check returns what is wrong with l, the i-th limit.
func (l Limit) check(i int) error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("fakeapi: Limits[%d]: "+format, append([]any{i}, a...)...))
	}
	if l.Quota < 1 {
		bad("Quota %d: must be at least 1", l.Quota)
	}
	if l.Unit < Requests || l.Unit > OutputTokens {
		bad("Unit %d: unknown", int(l.Unit))
	}
	switch l.Kind {
	case TokenBucket:
		if !(l.Rate > 0) || math.IsInf(l.Rate, 0) {
			bad("Rate %v: a bucket needs a positive number of units per second", l.Rate)
		}
		if l.Window != 0 {
			bad("Window %v: a bucket has none", l.Window)
		}
	case FixedWindow, SlidingWindow:
		if l.Window < time.Millisecond {
			bad("Window %v: a window must be at least 1ms", l.Window)
		}
		if l.Rate != 0 {
			bad("Rate %v: a window has none (its rate is Quota per Window)", l.Rate)
		}
	default:
		bad("Kind %d: unknown", int(l.Kind))
	}
	return errors.Join(errs...)
}

// meter is the state of one limit. Its methods take the time as an
// argument or work on the last time given to at, so the tests need no
// clock; a time before the last one seen counts as the last one. It is not
// safe for concurrent use: the API guards it.
type meter interface {
	// at brings the state forward to now.
	at(now time.Time)
	// room reports whether n units fit now.
	room(n int) bool
	// spend spends n units, which must fit.
	spend(n int)
	// left is the whole units that fit now.
	left() int
	// wait is how long until n units fit; 0 if they fit now. For n above
	// the quota, which never fits, it is until the quota is whole again.
	wait(n int) time.Duration
	// full is how long until the whole quota is back; for a fixed window,
	// until the window's end, whatever is left.
	full() time.Duration
	// changeRate changes a bucket's rate, or a window's quota to rate
	// per second over its window (at least 1), from the last time given
	// to at.
	changeRate(rate float64)
}

// newMeter returns the state of l, full at now.
func newMeter(l Limit, now time.Time) meter {
	switch l.Kind {
	case FixedWindow:
		return newFixedWindow(l.Quota, l.Window, now)
	case SlidingWindow:
		return newSlidingWindow(l.Quota, l.Window, now)
	}
	b := newBucket(l.Rate, l.Quota, now)
	return &b
}

// The bucket as a meter (bucket.go holds its arithmetic).

func (b *bucket) at(now time.Time)    { b.refill(now) }
func (b *bucket) room(n int) bool     { return b.tokens >= float64(n) }
func (b *bucket) spend(n int)         { b.tokens -= float64(n) }
func (b *bucket) left() int           { return b.remaining() }
func (b *bucket) full() time.Duration { return b.untilFull() }
func (b *bucket) wait(n int) time.Duration {
	return b.until(math.Min(float64(n), float64(b.burst)))
}
func (b *bucket) changeRate(rate float64) { b.rate = rate }

// fixedWindow accepts quota units in each window [start, start+w).
type fixedWindow struct {
	quota int
	w     time.Duration
	start time.Time // of the current window
	used  int       // in the current window
	now   time.Time // the last time seen
}

func newFixedWindow(quota int, w time.Duration, now time.Time) *fixedWindow {
	return &fixedWindow{quota: quota, w: w, start: now.Truncate(w), now: now}
}

func (f *fixedWindow) at(now time.Time) {
	if !now.After(f.now) {
		return
	}
	f.now = now
	if !now.Before(f.start.Add(f.w)) {
		f.start, f.used = now.Truncate(f.w), 0
	}
}

func (f *fixedWindow) room(n int) bool         { return f.used+n <= f.quota }
func (f *fixedWindow) spend(n int)             { f.used += n }
func (f *fixedWindow) left() int               { return max(0, f.quota-f.used) }
func (f *fixedWindow) full() time.Duration     { return f.start.Add(f.w).Sub(f.now) }
func (f *fixedWindow) changeRate(rate float64) { f.quota = quotaFor(rate, f.w) }

func (f *fixedWindow) wait(n int) time.Duration {
	if f.room(n) {
		return 0
	}
	return f.full()
}

// slidingWindow accepts at most quota units in any window of length w: a
// unit spent at t counts until t+w.
type slidingWindow struct {
	quota int
	w     time.Duration
	spent []spent   // oldest first, each still counting
	used  int       // the sum of spent
	now   time.Time // the last time seen
}

type spent struct {
	at time.Time
	n  int
}

func newSlidingWindow(quota int, w time.Duration, now time.Time) *slidingWindow {
	return &slidingWindow{quota: quota, w: w, now: now}
}

func (s *slidingWindow) at(now time.Time) {
	if now.After(s.now) {
		s.now = now
	}
	i := 0
	for i < len(s.spent) && !s.now.Before(s.spent[i].at.Add(s.w)) {
		s.used -= s.spent[i].n
		i++
	}
	s.spent = s.spent[i:]
}

func (s *slidingWindow) room(n int) bool         { return s.used+n <= s.quota }
func (s *slidingWindow) left() int               { return max(0, s.quota-s.used) }
func (s *slidingWindow) changeRate(rate float64) { s.quota = quotaFor(rate, s.w) }

func (s *slidingWindow) spend(n int) {
	s.spent = append(s.spent, spent{s.now, n})
	s.used += n
}

func (s *slidingWindow) full() time.Duration {
	if len(s.spent) == 0 {
		return 0
	}
	return s.spent[len(s.spent)-1].at.Add(s.w).Sub(s.now)
}

func (s *slidingWindow) wait(n int) time.Duration {
	need := s.used + n - s.quota
	if need <= 0 {
		return 0
	}
	if n > s.quota {
		return s.full()
	}
	for _, e := range s.spent {
		if need -= e.n; need <= 0 {
			return e.at.Add(s.w).Sub(s.now)
		}
	}
	return s.full() // not reached: the spent units cover the need
}

// quotaFor is a window's quota for rate units per second: at least 1.
func quotaFor(rate float64, w time.Duration) int {
	return max(1, int(math.Round(rate*w.Seconds())))
}
