package fakeapi

import (
	"fmt"
	"time"
)

// ResetMode is what the reset a dialect reports means for a TokenBucket or
// a SlidingWindow limit. A FixedWindow's reset is always its window's end.
type ResetMode int

const (
	// ResetFull reports the time until the whole quota is back: the bucket
	// full again, the last unit out of the sliding window (GCRA servers on
	// redis_rate or throttled, OpenAI's reset-requests).
	ResetFull ResetMode = iota
	// ResetNext reports the time until the next unit is back.
	ResetNext
)

func (m ResetMode) String() string {
	switch m {
	case ResetFull:
		return "ResetFull"
	case ResetNext:
		return "ResetNext"
	}
	return fmt.Sprintf("ResetMode(%d)", int(m))
}

// Header names a request's token cost is read from, when the API has a
// token limit. A missing or invalid header counts as 0, except that the
// JSON body's max_tokens stands in for a missing OutputTokensHeader.
const (
	InputTokensHeader  = "X-Input-Tokens"
	OutputTokensHeader = "X-Output-Tokens"
)

// cost is what one request spends: one request, and its tokens.
type cost struct{ input, output int }

// of is the cost in unit u.
func (c cost) of(u Unit) int {
	switch u {
	case Tokens:
		return c.input + c.output
	case InputTokens:
		return c.input
	case OutputTokens:
		return c.output
	}
	return 1
}

// limitSet is every limit of the API. A request fits when every limit has
// room for its cost; it is then charged to all of them, and a request that
// does not fit is charged to none. It is not safe for concurrent use: the
// API guards it.
type limitSet struct {
	limits []Limit // names resolved
	meters []meter // meters[i] is the state of limits[i]
}

func newLimitSet(limits []Limit, now time.Time) limitSet {
	s := limitSet{limits: limits}
	for _, l := range limits {
		s.meters = append(s.meters, newMeter(l, now))
	}
	return s
}

// fit brings every limit forward to now and reports whether c fits them
// all. When it does not, by is the limit that holds it back longest and
// wait is how long until it fits them all.
func (s *limitSet) fit(now time.Time, c cost) (ok bool, by int, wait time.Duration) {
	ok, by = true, -1
	for i, m := range s.meters {
		m.at(now)
		n := c.of(s.limits[i].Unit)
		if m.room(n) {
			continue
		}
		if w := m.wait(n); by < 0 || w > wait {
			by, wait = i, w
		}
		ok = false
	}
	return ok, by, wait
}

// charge spends c from every limit, at the time of the last fit, which
// said it fits.
func (s *limitSet) charge(c cost) {
	for i, m := range s.meters {
		m.spend(c.of(s.limits[i].Unit))
	}
}

// setRate changes the first limit's rate at now: a bucket's refill, or a
// window's quota to rate per second over its window.
func (s *limitSet) setRate(rate float64, now time.Time) {
	s.meters[0].at(now)
	s.meters[0].changeRate(rate)
	switch l := &s.limits[0]; l.Kind {
	case TokenBucket:
		l.Rate = rate
	default:
		l.Quota = quotaFor(rate, l.Window)
	}
}

// reading is one limit's state as a dialect reports it.
type reading struct {
	Limit
	remaining int           // whole units left
	reset     time.Duration // per the ResetMode, or the window's end
}

// used is the units spent of the quota.
func (r reading) used() int { return max(0, r.Quota-r.remaining) }

// read returns every limit's state at the time of the last fit.
func (s *limitSet) read(mode ResetMode) []reading {
	rs := make([]reading, len(s.meters))
	for i, m := range s.meters {
		r := reading{Limit: s.limits[i], remaining: m.left(), reset: m.full()}
		if mode == ResetNext && r.Kind != FixedWindow {
			r.reset = m.wait(1)
		}
		rs[i] = r
	}
	return rs
}

// tightest returns the reading of unit u with the fewest units left (on a
// tie, the one that resets last): the one a dialect that reports a single
// limit reports. ok is false when no limit counts u.
func tightest(rs []reading, u Unit) (r reading, ok bool) {
	for _, x := range rs {
		if x.Unit != u {
			continue
		}
		if !ok || x.remaining < r.remaining || x.remaining == r.remaining && x.reset > r.reset {
			r, ok = x, true
		}
	}
	return r, ok
}

// resolveNames returns limits with every empty name filled in.
func resolveNames(limits []Limit) []Limit {
	out := append([]Limit(nil), limits...)
	for i := range out {
		if out[i].Name != "" {
			continue
		}
		if len(out) == 1 {
			out[i].Name = "default"
		} else {
			out[i].Name = fmt.Sprintf("%s-%d", out[i].Unit, i)
		}
	}
	return out
}
