package fakellm

import (
	"math"
	"time"
)

// dimension is what a limit counts.
type dimension int

const (
	dimRequests dimension = iota // Config.RPM
	dimTokens                    // Config.TPM: input + output
	dimInput                     // Config.InputTPM
	dimOutput                    // Config.OutputTPM
	dimensions
)

// cost is a request's charge to each dimension.
type cost [dimensions]int

// upfrontCost is what a request of input tokens and maxTokens is charged
// when admitted, under rule u.
func upfrontCost(u Upfront, input, maxTokens int) cost {
	c := cost{dimRequests: 1, dimInput: input}
	switch u {
	case ReserveInputAndMax:
		c[dimTokens], c[dimOutput] = input+maxTokens, maxTokens
	case ReserveLarger:
		c[dimTokens], c[dimOutput] = max(input, maxTokens), maxTokens
	case ReserveInput:
		c[dimTokens] = input
	}
	return c
}

// actualCost is what a completion of input and output tokens is charged in
// the end.
func actualCost(input, output int) cost {
	return cost{dimRequests: 1, dimTokens: input + output, dimInput: input, dimOutput: output}
}

// limit is one configured limit and what it has measured.
type limit struct {
	dim     dimension
	quota   int
	m       meter
	peak    float64 // the most ever in use: quota - left
	refused int     // the refusals it was named in
}

func (l *limit) fits(n int) bool { return l.m.left() >= float64(n) }

// remaining is the whole units left, as the headers report them.
func (l *limit) remaining() int { return max(0, int(math.Floor(l.m.left()))) }

// note records the usage now in the peak.
func (l *limit) note() { l.peak = max(l.peak, float64(l.quota)-l.m.left()) }

// reading is one limit as a response reports it.
type reading struct {
	dim       dimension
	quota     int
	remaining int
	reset     time.Duration
}

// verdict is the limits' decision on a request.
type verdict struct {
	ok       bool
	tooLarge bool          // refused: it exceeds a quota, and never fits
	by       int           // refused: the index of the limit named
	wait     time.Duration // refused, not tooLarge: until every limit has room
	marks    []mark        // admitted: one per limit, for settle
}

// limitSet is the configured limits, in the order of the dimensions. It is
// not safe for concurrent use: the Server guards it.
type limitSet struct {
	limits []*limit
}

func newLimitSet(c Config, now time.Time) limitSet {
	var s limitSet
	for d, q := range [dimensions]int{c.RPM, c.TPM, c.InputTPM, c.OutputTPM} {
		if q > 0 {
			s.limits = append(s.limits, &limit{dim: dimension(d), quota: q, m: newMeter(c.Enforcement, q, c.Minute, now)})
		}
	}
	return s
}

// admit spends c from every limit at now when every one has room for it;
// otherwise it spends nothing and names the limit that refused: the first
// one c exceeds the quota of, else the one with the longest wait.
func (s *limitSet) admit(now time.Time, c cost) verdict {
	s.at(now)
	v := verdict{ok: true, by: -1}
	for i, l := range s.limits {
		n := c[l.dim]
		switch {
		case n > l.quota:
			if !v.tooLarge {
				v = verdict{tooLarge: true, by: i}
			}
		case v.tooLarge:
		case !l.fits(n):
			if w := l.m.wait(n); v.ok || w > v.wait {
				v = verdict{by: i, wait: w}
			}
		}
	}
	if !v.ok {
		s.limits[v.by].refused++
		return v
	}
	v.marks = make([]mark, len(s.limits))
	for i, l := range s.limits {
		if n := c[l.dim]; n > 0 {
			v.marks[i] = l.m.spend(n)
			l.note()
		}
	}
	return v
}

// settle charges an admitted request its actual cost at now, refunding or
// adding to the up-front one.
func (s *limitSet) settle(now time.Time, marks []mark, upfront, actual cost) {
	s.at(now)
	for i, l := range s.limits {
		if delta := actual[l.dim] - upfront[l.dim]; delta != 0 {
			l.m.adjust(marks[i], delta)
			l.note()
		}
	}
}

func (s *limitSet) at(now time.Time) {
	for _, l := range s.limits {
		l.m.at(now)
	}
}

// read returns every limit as it stands at now.
func (s *limitSet) read(now time.Time) []reading {
	s.at(now)
	rs := make([]reading, len(s.limits))
	for i, l := range s.limits {
		rs[i] = reading{dim: l.dim, quota: l.quota, remaining: l.remaining(), reset: l.m.reset()}
	}
	return rs
}
