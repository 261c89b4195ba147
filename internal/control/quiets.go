package control

import (
	"sync/atomic"
	"time"
)

// Quiets counts a key's silent responses (see State.Silent) that are not
// yet applied to its State, so that a limiter can count the allowed
// path's response without taking the key's lock: Add counts one, and the
// limiter applies the count (Settle) under its lock before anything there
// reads or changes the State. A count applied so is what as many Quiet
// calls at Add's moments would have made (TestQuietsAreQuiet).
//
// Add counts only while the limiter has opened the counter (Open) and
// only responses to requests sent in one quarter second (the Meter's
// slot) at a time, after the meter's first outcome; it reports false
// otherwise, and the caller applies the response under the lock (Quiet).
// The limiter opens the counter while the key does not listen for its
// reset's meaning (State.Listens) and its meter has begun, and closes it
// when it drops the key, then settles what was counted before the close:
// an Add after it fails, so that no count is left behind in a State
// nobody settles.
//
// The state is one word: the open bit, the slot (the send time's quarter
// second since the epoch, below 2⁴⁰: until the year 10,000 and more) and
// the count (up to 2²³−1).
type Quiets struct {
	w     atomic.Uint64
	after atomic.Int64 // the first slot Add counts: the one after the meter's first outcome's
	first int64        // the meter's first outcome after was set from; guarded by the key's lock
}

const (
	quietOpen      = 1 << 63
	quietCountBits = 23
	quietCountMask = 1<<quietCountBits - 1
	quietSlotMask  = 1<<40 - 1
)

// Add counts a silent response to a request sent at sent, and reports
// whether it did (see Quiets).
func (q *Quiets) Add(sent time.Time) bool {
	n := sent.UnixNano() / int64(MeterSlot)
	if n < q.after.Load() || n > quietSlotMask {
		return false
	}
	for {
		old := q.w.Load()
		c := old & quietCountMask
		if old&quietOpen == 0 || c == quietCountMask || (c > 0 && int64(old>>quietCountBits&quietSlotMask) != n) {
			return false
		}
		if q.w.CompareAndSwap(old, quietOpen|uint64(n)<<quietCountBits|(c+1)) {
			return true
		}
	}
}

// Open opens the counter while st may take a count without the lock
// (may, and st does not listen for its reset's meaning, and its meter has
// begun), and closes it otherwise; a count is kept until Settle. The
// first slot Add counts is set from st's meter before the counter opens,
// and again only when the meter's first outcome moved (earlier: a stale
// slot refuses more, never less). The caller holds the key's lock.
func (q *Quiets) Open(st *State, may bool) {
	open := may && !st.Listens() && st.Meter.First > 0
	if open && st.Meter.First != q.first {
		q.first = st.Meter.First
		q.after.Store(q.first/int64(MeterSlot) + 1)
	}
	for {
		old := q.w.Load()
		next := old &^ quietOpen
		if open {
			next |= quietOpen
		}
		if next == old || q.w.CompareAndSwap(old, next) {
			return
		}
	}
}

// Settle applies the responses q counted to st, as Quiet would have. The
// caller holds the key's lock.
func (st *State) Settle(q *Quiets) {
	for {
		old := q.w.Load()
		c := old & quietCountMask
		if c == 0 {
			return
		}
		if q.w.CompareAndSwap(old, old&quietOpen) {
			st.quietN(int64(old>>quietCountBits&quietSlotMask), int32(c))
			return
		}
	}
}

// quietN is Quiet of c responses to requests sent in the meter's slot n,
// after its first outcome's (Meter.First is theirs already).
func (st *State) quietN(n int64, c int32) {
	if st.Shape == ShapeBucket {
		st.budget, st.budgetUntil, st.budgetUnit = 0, time.Time{}, 0
	}
	st.Meter.addN(n, 0, c)
	st.Drain.N += float64(c)
}
