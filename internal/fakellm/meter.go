package fakellm

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// meter is the state of one limit: how much of its quota is left. Its
// methods take the time through at, so the tests need no clock; a time
// before the last one seen counts as the last one. It is not safe for
// concurrent use: the Server guards it.
type meter interface {
	// at brings the state forward to now.
	at(now time.Time)
	// left is what is left of the quota now; negative after an extra
	// charge (ReserveInput, ReserveLarger) took the limit over its quota.
	left() float64
	// spend spends n units now and returns the mark adjust needs.
	spend(n int) mark
	// adjust corrects what was spent at m by delta units: a refund when
	// negative, an extra charge, dated now, when positive. A refund of
	// what no longer counts (its window is over) changes nothing.
	adjust(m mark, delta int)
	// wait is how long until n units fit, if nothing more is spent; 0 if
	// they fit now. n must not exceed the quota.
	wait(n int) time.Duration
	// reset is how long until the whole quota is back, if nothing more is
	// spent; 0 if it is whole now.
	reset() time.Duration
}

// mark identifies a spending, for adjust.
type mark struct {
	window time.Time // a fixed window's start
	seq    uint64    // a sliding window's entry; 0 for none
}

// newMeter returns the meter of a quota per period under e, whole at now.
func newMeter(e Enforcement, quota int, period time.Duration, now time.Time) meter {
	switch e {
	case FixedWindow:
		return &fixedWindow{quota: quota, period: period, start: now.Truncate(period), now: now}
	case SlidingWindow:
		return &slidingWindow{quota: quota, period: period, now: now}
	}
	return &bucket{quota: float64(quota), period: float64(period), level: float64(quota), last: now}
}

// bucket holds up to quota units and refills quota units per period,
// continuously. Its arithmetic is in nanoseconds: quota × elapsed / period,
// so that whole quantities come out whole.
type bucket struct {
	quota  float64
	period float64 // nanoseconds, > 0
	level  float64 // at most quota; negative in debt
	last   time.Time
}

func (b *bucket) at(now time.Time) {
	if !now.After(b.last) {
		return
	}
	b.level = math.Min(b.quota, b.level+b.quota*float64(now.Sub(b.last))/b.period)
	b.last = now
}

func (b *bucket) left() float64            { return b.level }
func (b *bucket) spend(n int) mark         { b.level -= float64(n); return mark{} }
func (b *bucket) adjust(_ mark, delta int) { b.level = math.Min(b.quota, b.level-float64(delta)) }
func (b *bucket) wait(n int) time.Duration { return b.until(float64(n)) }
func (b *bucket) reset() time.Duration     { return b.until(b.quota) }

// until is how long until the bucket holds level units.
func (b *bucket) until(level float64) time.Duration {
	if b.level >= level {
		return 0
	}
	return time.Duration(math.Ceil((level - b.level) * b.period / b.quota))
}

// fixedWindow accepts quota units in each window [start, start+period).
type fixedWindow struct {
	quota  int
	period time.Duration
	start  time.Time // of the current window
	used   int       // in the current window
	now    time.Time // the last time seen
}

func (f *fixedWindow) at(now time.Time) {
	if !now.After(f.now) {
		return
	}
	f.now = now
	if !now.Before(f.start.Add(f.period)) {
		f.start, f.used = now.Truncate(f.period), 0
	}
}

func (f *fixedWindow) left() float64 { return float64(f.quota - f.used) }

func (f *fixedWindow) spend(n int) mark {
	f.used += n
	return mark{window: f.start}
}

func (f *fixedWindow) adjust(m mark, delta int) {
	if delta < 0 && !m.window.Equal(f.start) {
		return // refunded from a window that is over
	}
	f.used = max(0, f.used+delta)
}

func (f *fixedWindow) wait(n int) time.Duration {
	if f.quota-f.used >= n {
		return 0
	}
	return f.end()
}

func (f *fixedWindow) reset() time.Duration {
	if f.used == 0 {
		return 0
	}
	return f.end()
}

func (f *fixedWindow) end() time.Duration { return f.start.Add(f.period).Sub(f.now) }

// slidingWindow accepts at most quota units in any window of one period:
// a unit spent at t counts until t + period.
type slidingWindow struct {
	quota   int
	period  time.Duration
	entries []entry   // oldest first, each still counting
	used    int       // the sum of the entries
	seq     uint64    // of the last entry
	now     time.Time // the last time seen
}

type entry struct {
	at  time.Time
	n   int
	seq uint64
}

func (s *slidingWindow) at(now time.Time) {
	if now.After(s.now) {
		s.now = now
	}
	i := 0
	for i < len(s.entries) && !s.now.Before(s.entries[i].at.Add(s.period)) {
		s.used -= s.entries[i].n
		i++
	}
	s.entries = s.entries[i:]
}

func (s *slidingWindow) left() float64 { return float64(s.quota - s.used) }

func (s *slidingWindow) spend(n int) mark {
	s.seq++
	s.entries = append(s.entries, entry{at: s.now, n: n, seq: s.seq})
	s.used += n
	return mark{seq: s.seq}
}

func (s *slidingWindow) adjust(m mark, delta int) {
	if delta > 0 {
		s.spend(delta)
		return
	}
	i, found := slices.BinarySearchFunc(s.entries, m.seq, func(e entry, seq uint64) int { return cmp.Compare(e.seq, seq) })
	if !found {
		return // refunded from an entry that no longer counts
	}
	delta = max(delta, -s.entries[i].n)
	s.entries[i].n += delta
	s.used += delta
}

func (s *slidingWindow) wait(n int) time.Duration {
	need := s.used + n - s.quota
	if need <= 0 {
		return 0
	}
	for _, e := range s.entries {
		if need -= e.n; need <= 0 {
			return e.at.Add(s.period).Sub(s.now)
		}
	}
	return s.reset() // not reached for n <= quota
}

func (s *slidingWindow) reset() time.Duration {
	for i := len(s.entries) - 1; i >= 0; i-- {
		if s.entries[i].n > 0 {
			return s.entries[i].at.Add(s.period).Sub(s.now)
		}
	}
	return 0
}
