// Package gcra owns a bucket's theoretical arrival time (the generic cell
// rate algorithm): when a grant next conforms under the bucket's burst, the
// turns granted, the units given back, and the cap a provider's count sets.
// A bucket of burst b and interval I per unit is full when its TAT is at or
// before now; a grant of c units at t conforms when max(TAT, t) + c·I − t
// ≤ b·I.
//
// It knows nothing of keys, waiters, rates or Redis: its callers give
// every amount as the time the bucket takes to refill it (units × I), and
// keep one Bucket a key and a limit under their own locks. egress's
// Limits keeps its buckets here; internal/lua/limits.lua keeps the same
// arithmetic in a Redis hash for SharedLimits (TAT rounded up to the
// microsecond), and TestSharedLimitsAgreesWithLimits holds the two to the
// same turns.
package gcra

import "time"

// Bucket is a bucket's state. The zero value is a full bucket. It is not
// safe for concurrent use: its owner guards it.
type Bucket struct {
	TAT  time.Time // the theoretical arrival time: full when at or before now
	Last time.Time // the latest turn granted
}

// AtRest reports whether the bucket is full at now: its owner may drop it.
func (b *Bucket) AtRest(now time.Time) bool { return !b.TAT.After(now) }

// Earliest returns the first turn at or after now at which a grant
// conforms, room being the refill of the burst left after its cost. The
// bucket keeps margin of its refill in reserve, as far as that room
// allows: a cost of the whole burst keeps none, and the rate is never
// lowered.
func (b *Bucket) Earliest(room, margin time.Duration, now time.Time) time.Time {
	return later(now, b.TAT.Add(-max(room-margin, 0)))
}

// Take grants a cost whose refill is cost at turn at, which Earliest
// allowed.
func (b *Bucket) Take(cost time.Duration, at time.Time) {
	b.TAT = later(b.TAT, at).Add(cost)
	b.Last = later(b.Last, at)
}

// Refund gives back units whose refill is d of a grant whose turn was at,
// less what the turns granted after it took: their turns were placed
// behind its cost, and giving that back too would let a new grant share
// their instant (x/time/rate's Reservation.Cancel does the same). The time
// is rounded down to the microsecond, as the shared script keeps it, and
// the bucket is never more than full. A bucket made after the grant (its
// key was dropped) holds none of it.
func (b *Bucket) Refund(d time.Duration, at, now time.Time) {
	if b.Last.Before(at) {
		return
	}
	d = (d - b.Last.Sub(at)).Truncate(time.Microsecond)
	if d <= 0 {
		return
	}
	b.TAT = later(b.TAT.Add(-d), now)
}

// Cap empties the bucket, if it holds more, down to what a provider said
// remains: owed is the refill of the units it holds above that.
func (b *Bucket) Cap(owed time.Duration, now time.Time) {
	b.TAT = later(b.TAT, now.Add(owed))
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
