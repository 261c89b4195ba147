package egress

import "time"

// sweepEvery is how often a limiter looks for keys whose buckets have come
// back to rest and drops them.
const sweepEvery = time.Minute

// resting is a per-key state that can tell when it has come back to the state
// of a new one (a full token bucket, an empty queue): dropping it then loses
// nothing.
type resting interface {
	atRest(now time.Time) bool
}

// keyed holds one state per key and drops the states at rest, lazily, at most
// once per sweepEvery: no goroutine runs for it. It is not safe for concurrent
// use: the limiter that owns it guards it with its mutex.
type keyed[T resting] struct {
	m         map[string]T
	peak      int // the most keys m has held since it was made
	lastSweep time.Time
	every     time.Duration
}

func newKeyed[T resting]() keyed[T] {
	return keyed[T]{m: make(map[string]T), every: sweepEvery}
}

// get returns the state of key, first sweeping the map if a sweep is due.
func (k *keyed[T]) get(key string, now time.Time) (T, bool) {
	if k.sweepDue(now) {
		k.sweep(now)
	}
	v, ok := k.m[key]
	return v, ok
}

func (k *keyed[T]) put(key string, v T) {
	k.m[key] = v
	k.peak = max(k.peak, len(k.m))
}

// sweepDue reports whether a sweep is due at now.
func (k *keyed[T]) sweepDue(now time.Time) bool { return now.Sub(k.lastSweep) >= k.every }

// sweep drops every state at rest. A Go map keeps its memory when entries
// are deleted, so after a spike of keys the survivors move to a new map.
func (k *keyed[T]) sweep(now time.Time) {
	k.lastSweep = now
	for key, v := range k.m {
		if v.atRest(now) {
			delete(k.m, key)
		}
	}
	if k.peak > 1024 && len(k.m) < k.peak/4 {
		m := make(map[string]T, len(k.m))
		for key, v := range k.m {
			m[key] = v
		}
		k.m, k.peak = m, len(m)
	}
}

// len returns how many keys are held.
func (k *keyed[T]) len() int { return len(k.m) }
