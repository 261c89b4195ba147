// Package keyed owns the per-key state store of egress's limiters: one
// state a key, dropped once it has come back to a new one's state (at
// rest), lazily, at most once a sweep interval, with no goroutine of its
// own; and a map rebuilt after a spike of keys, so that memory follows the
// keys in use. It knows nothing of what the states are, nor of locks: its
// owner guards it.
package keyed

import "time"

// SweepEvery is how often a limiter looks for keys whose buckets have come
// back to rest and drops them.
const SweepEvery = time.Minute

// Resting is a per-key state that can tell when it has come back to the state
// of a new one (a full token bucket, an empty queue): dropping it then loses
// nothing.
type Resting interface {
	AtRest(now time.Time) bool
}

// Map holds one state per key and drops the states at rest, lazily, at most
// once per Every (SweepEvery, unless a test shortens it): no goroutine runs
// for it. It is not safe for concurrent use: the limiter that owns it guards
// it with its mutex. M may be read directly, and written through Put;
// Every, Peak and LastSweep are there for tests to shorten the interval,
// see the peak and copy a Map.
type Map[T Resting] struct {
	M         map[string]T
	Every     time.Duration // how often a sweep is due
	Peak      int           // the most keys M has held since it was made, or since a sweep rebuilt it
	LastSweep time.Time
}

// New returns an empty Map that sweeps every SweepEvery.
func New[T Resting]() Map[T] {
	return Map[T]{M: make(map[string]T), Every: SweepEvery}
}

// Get returns the state of key, first sweeping the map if a sweep is due.
func (k *Map[T]) Get(key string, now time.Time) (T, bool) {
	if k.SweepDue(now) {
		k.Sweep(now)
	}
	v, ok := k.M[key]
	return v, ok
}

func (k *Map[T]) Put(key string, v T) {
	k.M[key] = v
	k.Peak = max(k.Peak, len(k.M))
}

// SweepDue reports whether a sweep is due at now.
func (k *Map[T]) SweepDue(now time.Time) bool { return now.Sub(k.LastSweep) >= k.Every }

// Sweep drops every state at rest. A Go map keeps its memory when entries
// are deleted, so after a spike of keys the survivors move to a new map.
func (k *Map[T]) Sweep(now time.Time) {
	k.LastSweep = now
	for key, v := range k.M {
		if v.AtRest(now) {
			delete(k.M, key)
		}
	}
	if k.Peak > 1024 && len(k.M) < k.Peak/4 {
		m := make(map[string]T, len(k.M))
		for key, v := range k.M {
			m[key] = v
		}
		k.M, k.Peak = m, len(m)
	}
}

// Len returns how many keys are held.
func (k *Map[T]) Len() int { return len(k.M) }
