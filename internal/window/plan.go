package window

import (
	"math"
	"slices"
	"time"

	"github.com/egress-go/egress/internal/clock"
)

// A window's grants given on an estimate (an LLM call's max_tokens) count
// at it until their responses settle them, routinely far below. The types
// here are what a window learns of how its grants settle (Settling), the
// grants it keeps in flight once a settlement has differed from its
// estimate (Open), and a copy of its grants in which each settles as
// they have been settling (Plan), where a request's turn is planned when
// the turn on the estimates lies beyond its budget. egress's Limits keeps
// them a key and a limit; its SharedLimits keeps a Settling a limit and
// plans on the window it reads from Redis. (The root's limits_settle.go
// says how a request is planned.)

// settleGain and devGain weigh a new settlement in the moving averages of
// the ratio and the time to settle, and of the time's deviation.
const (
	settleGain = 0.125
	devGain    = 0.25
)

// Settling is what a window learnt of how its grants settle.
type Settling struct {
	N     int           // settlements learnt from (capped at 1<<20)
	Ratio float64       // moving average of the actual cost over the estimate
	TTS   time.Duration // moving average of the time from a grant's turn to its settlement
	Dev   time.Duration // moving average of the time's deviation from TTS
	Track bool          // a settlement differed from its estimate: its owner keeps the grants in flight (Open)
}

// Learn adds a settlement of ratio actual/estimate, tts after its turn.
func (s *Settling) Learn(ratio float64, tts time.Duration) {
	if s.N == 0 {
		s.Ratio, s.TTS, s.Dev = ratio, tts, tts/2
	} else {
		diff := tts - s.TTS
		s.Ratio += settleGain * (ratio - s.Ratio)
		s.Dev += time.Duration(devGain * float64(diff.Abs()-s.Dev))
		s.TTS += time.Duration(settleGain * float64(diff))
	}
	s.N = min(s.N+1, 1<<20)
}

// Expects reports whether the window's grants can be expected to settle
// below their estimates.
func (s *Settling) Expects() bool { return s.N > 0 && s.Ratio < 1 }

// Expect returns what a grant of est at turn at is expected to cost once
// settled, and when, seen at now; a zero time when it is not expected to
// settle below est: nothing learnt, or overdue (well past the time grants
// take to settle: it may never settle, as a body closed early).
func (s *Settling) Expect(at time.Time, est int, now time.Time) (int, time.Time) {
	if !s.Expects() {
		return est, time.Time{}
	}
	due := at.Add(s.TTS)
	if now.After(due.Add(s.TTS + 4*s.Dev)) {
		return est, time.Time{}
	}
	return min(est, int(math.Ceil(float64(est)*s.Ratio))), clock.Later(due, now)
}

// OpenGrant is a grant given in a window and not yet settled.
type OpenGrant struct {
	At   time.Time
	Cost int32
}

// Open is a window's grants in flight, in no order.
type Open []OpenGrant

// Trim forgets the grants in flight that have left a window of length w:
// they count no more, settled or not.
func (o *Open) Trim(now time.Time, w time.Duration) {
	if len(*o) == 0 {
		return
	}
	*o = slices.DeleteFunc(*o, func(g OpenGrant) bool { return !g.At.Add(w).After(now) })
}

// Close forgets the grant of cost at turn at, settled.
func (o *Open) Close(at time.Time, cost int) {
	s := *o
	for i, g := range s {
		if g.At.Equal(at) && int(g.Cost) == cost {
			s[i] = s[len(s)-1]
			*o = s[:len(s)-1]
			return
		}
	}
}

// Plan is one window's grants in a plan, in the order of their turns: n
// units in any window of length Win, its grants settling as Stats says.
type Plan struct {
	N       int
	Win     time.Duration
	Stats   Settling
	Entries []Entry
}

// Entry is a grant in a plan: it counts Est until it settles (never, when
// Settle is zero), then Exp, until it leaves the window.
type Entry struct {
	At     time.Time
	Est    int
	Exp    int
	Settle time.Time
	Open   bool // a grant in flight, matched
}

// Find returns the index of the last grant of cost at turn at that is, or
// is not (open), a grant in flight already matched; -1 when there is none.
func (s *Plan) Find(at time.Time, cost int, open bool) int {
	j := lastAtOrBefore(s.Entries, at)
	for ; j >= 0 && s.Entries[j].At.Equal(at); j-- {
		if s.Entries[j].Est == cost && s.Entries[j].Open == open {
			return j
		}
	}
	return -1
}

// lastAtOrBefore returns the index of the last entry at or before at, or -1.
func lastAtOrBefore(es []Entry, at time.Time) int {
	lo, hi := 0, len(es)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if es[m].At.After(at) {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo - 1
}

// Place grants c at turn at, after every turn in the window: it settles as
// the window's grants have been settling.
func (s *Plan) Place(c int, at time.Time) {
	e := Entry{At: at, Est: c}
	e.Exp, e.Settle = s.Stats.Expect(at, c, at)
	s.Entries = append(s.Entries, e)
}

// fall is a fall of a window's count: a settlement or a grant leaving.
type fall struct {
	at time.Time
	d  int
}

// Earliest returns the first turn at or after from, and after every turn
// in the window, at which the window holds at most N − c, its grants
// counting their expected settlements from the time each is expected.
func (s *Plan) Earliest(c int, from time.Time) time.Time {
	at := from
	if len(s.Entries) > 0 {
		at = clock.Later(at, s.Entries[len(s.Entries)-1].At)
	}
	sum, falls := s.counted(at)
	if sum+c <= s.N {
		return at
	}
	slices.SortFunc(falls, func(a, b fall) int { return a.at.Compare(b.at) })
	for j := 0; j < len(falls); j++ {
		sum += falls[j].d
		if j+1 < len(falls) && falls[j+1].at.Equal(falls[j].at) {
			continue
		}
		if sum+c <= s.N {
			return falls[j].at
		}
	}
	if len(falls) > 0 {
		return falls[len(falls)-1].at
	}
	return at
}

// counted returns what the window's grants count at at, and the falls of
// that count after it, in no order.
func (s *Plan) counted(at time.Time) (sum int, falls []fall) {
	for _, e := range s.Entries {
		leave := e.At.Add(s.Win)
		if !leave.After(at) {
			continue
		}
		switch {
		case e.Settle.IsZero() || !e.Settle.Before(leave):
			sum += e.Est
			falls = append(falls, fall{leave, -e.Est})
		case !e.Settle.After(at):
			sum += e.Exp
			falls = append(falls, fall{leave, -e.Exp})
		default:
			sum += e.Est
			falls = append(falls, fall{e.Settle, e.Exp - e.Est}, fall{leave, -e.Exp})
		}
	}
	return sum, falls
}
