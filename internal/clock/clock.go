// Package clock is the time source of egress: the real clock in production and
// a fake one, moved by hand, in tests of the time maths.
package clock

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Clock tells the time and makes timers. Implementations are safe for
// concurrent use.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is the part of *time.Timer that egress uses.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
}

// Real is the wall clock.
type Real struct{}

// Now returns the time: an anchor, a reading of time.Now at most a second
// old, moved on by the monotonic clock since (time.Since of a time with a
// monotonic reading reads that clock alone). One reading instead of
// time.Now's two, wall and monotonic: 37 ns instead of 57 on a virtual
// machine's clock (kvm-clock), where egress's allowed path reads the clock
// once a request. The anchor is taken again once it is a second old, so a
// step of the wall clock shows in the readings within a second (egress's
// arithmetic between two readings uses their monotonic clock, and never
// sees one).
func (Real) Now() time.Time {
	a := anchor.Load()
	d := time.Since(*a)
	if d >= time.Second || d < 0 {
		now := time.Now()
		anchor.Store(&now)
		return now
	}
	return a.Add(d)
}

// anchor is Real's latest reading of time.Now.
var anchor atomic.Pointer[time.Time]

func init() {
	now := time.Now()
	anchor.Store(&now)
}

// NewTimer returns a real timer that fires after d.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time { return r.t.C }
func (r realTimer) Stop() bool          { return r.t.Stop() }

// Fake is a clock that moves only when Advance is called. Its timers fire
// during Advance, in order of their deadlines. The zero value is not usable:
// call NewFake.
type Fake struct {
	mu     sync.Mutex
	now    time.Time    // guarded by mu
	timers []*fakeTimer // guarded by mu; pending timers
	cond   *sync.Cond   // signalled when a timer is added
}

// NewFake returns a fake clock that reads start.
func NewFake(start time.Time) *Fake {
	f := &Fake{now: start}
	f.cond = sync.NewCond(&f.mu)
	return f
}

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a timer that fires when the clock has been advanced by d.
func (f *Fake) NewTimer(d time.Duration) Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &fakeTimer{f: f, at: f.now.Add(d), c: make(chan time.Time, 1)}
	if d <= 0 {
		t.c <- f.now
		return t
	}
	f.timers = append(f.timers, t)
	f.cond.Broadcast()
	return t
}

// Advance moves the clock forward by d, firing every timer that falls due.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	sort.Slice(f.timers, func(i, j int) bool { return f.timers[i].at.Before(f.timers[j].at) })
	kept := f.timers[:0]
	for _, t := range f.timers {
		if t.at.After(f.now) {
			kept = append(kept, t)
			continue
		}
		t.c <- t.at
	}
	f.timers = kept
}

// WaitTimers blocks until at least n timers are pending, so that a test knows
// its goroutines are parked before it advances the clock.
func (f *Fake) WaitTimers(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(f.timers) < n {
		f.cond.Wait()
	}
}

// Timers returns how many timers are pending.
func (f *Fake) Timers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

type fakeTimer struct {
	f  *Fake
	at time.Time
	c  chan time.Time
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	for i, p := range t.f.timers {
		if p == t {
			t.f.timers = append(t.f.timers[:i], t.f.timers[i+1:]...)
			return true
		}
	}
	return false
}

// Later returns the later of a and b.
func Later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Earlier returns the earlier of a and b.
func Earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
