package egress

import (
	"sync"
	"sync/atomic"
)

// keyCounts holds a small count per key for a Transport: the attempts it
// has handed to its base RoundTripper and that have no response yet (the
// requests a provider's "remaining" does not count yet, Signal.InFlight),
// or whether a key was last reported near its limit.
//
// A key's count is a counter of its own, found without a lock (a
// sync.Map) and moved with atomic operations: an attempt raises it before
// it is sent, and lowers it when the answer is there, with no lookup then.
// (A locked map, into which the key went before each attempt and out of
// which it went after, was a tenth of the allowed path.) A counter stays
// when it comes back to 0; idle keys are dropped lazily, when the keys held
// have doubled since the last sweep (and are keySweepMin at least), so
// they cost a bounded share of the keys in use, and sweeping costs each
// new key a constant on average.
type keyCounts struct {
	m        sync.Map     // key → *keyCount
	n        atomic.Int64 // the counters in m
	kept     atomic.Int64 // the counters the last sweep left
	sweeping sync.Mutex   // one sweep at a time

	// hot is the counter raised last: an attempt of the same key raises it
	// without the map, while no sweep has taken it out (the map's lookup,
	// a hash of the key, cost about 10 ns of the allowed path's 300).
	hot atomic.Pointer[keyCount]
}

// keyCount is one key's count; swept (below 0) once a sweep has taken it
// out of the map at 0. Only a count above 0 is lowered, by the caller that
// raised it, so a counter is swept only while nobody holds it.
type keyCount struct {
	n   atomic.Int64
	key string
}

const (
	keySweepMin = 64
	keySwept    = -1 << 62
)

func newKeyCounts() *keyCounts { return new(keyCounts) }

// inc adds 1 to key's count and returns its counter, which the caller
// lowers again with dec.
func (s *keyCounts) inc(key string) *keyCount {
	if c := s.hot.Load(); c != nil && c.key == key && c.raise() {
		return c
	}
	for {
		c := s.counter(key)
		if c.raise() {
			if s.hot.Load() != c {
				s.hot.Store(c)
			}
			return c
		}
		s.swept(key, c)
	}
}

// raise adds 1 to c, unless a sweep has marked it swept (then false).
func (c *keyCount) raise() bool {
	for n := c.n.Load(); n >= 0; n = c.n.Load() {
		if c.n.CompareAndSwap(n, n+1) {
			return true
		}
	}
	return false
}

// swept takes c, key's counter, which a sweep marked swept, out of the map
// (the sweep may not have yet), so that the next look finds a new one.
func (s *keyCounts) swept(key string, c *keyCount) { s.m.CompareAndDelete(key, c) }

// dec takes 1 from a count that inc raised and returns the count after.
func (c *keyCount) dec() int { return int(c.n.Add(-1)) }

// swap sets key's count to v (0 or more) and returns the count before.
func (s *keyCounts) swap(key string, v int) int {
	for {
		c := s.counter(key)
		for n := c.n.Load(); n >= 0; n = c.n.Load() {
			if c.n.CompareAndSwap(n, int64(v)) {
				return int(n)
			}
		}
		s.swept(key, c)
	}
}

// count returns key's count.
func (s *keyCounts) count(key string) int {
	if v, ok := s.m.Load(key); ok {
		return int(max(v.(*keyCount).n.Load(), 0))
	}
	return 0
}

// counter returns key's counter, adding one at 0 when there is none (and
// then sweeping, when the counters have doubled since the last sweep).
func (s *keyCounts) counter(key string) *keyCount {
	if v, ok := s.m.Load(key); ok {
		return v.(*keyCount)
	}
	v, loaded := s.m.LoadOrStore(key, &keyCount{key: key})
	if !loaded {
		if n := s.n.Add(1); n >= max(2*s.kept.Load(), keySweepMin) {
			s.sweep()
		}
	}
	return v.(*keyCount)
}

// sweep drops the counters at 0. A counter is marked swept before it
// leaves the map, so that a caller that found it looks again.
func (s *keyCounts) sweep() {
	if !s.sweeping.TryLock() {
		return // another is at it
	}
	defer s.sweeping.Unlock()
	s.m.Range(func(k, v any) bool {
		if c := v.(*keyCount); c.n.CompareAndSwap(0, keySwept) {
			s.m.CompareAndDelete(k, c) // (or the caller that found it swept did)
			s.n.Add(-1)
		}
		return true
	})
	s.kept.Store(s.n.Load())
}
