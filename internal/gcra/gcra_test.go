package gcra

import (
	"testing"
	"time"
)

// TestBucketTurns: a bucket of 3 units at 100 ms a unit grants three at
// once and the fourth when a unit has refilled; the margin keeps 5 ms of
// refill in reserve only where the burst left allows; a refund gives back
// what the later turns did not take; a cap empties the bucket to a count.
func TestBucketTurns(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	const unit = 100 * time.Millisecond
	room := func(c int) time.Duration { return time.Duration(3-c) * unit }
	var b Bucket
	for i := range 3 {
		at := b.Earliest(room(1), 0, t0)
		if !at.Equal(t0) {
			t.Fatalf("unit %d: turn %v, want at once", i, at.Sub(t0))
		}
		b.Take(unit, at)
	}
	if at := b.Earliest(room(1), 0, t0); at.Sub(t0) != unit {
		t.Fatalf("the fourth unit: turn %v, want %v", at.Sub(t0), unit)
	}
	if at := b.Earliest(room(1), 5*time.Millisecond, t0); at.Sub(t0) != unit+5*time.Millisecond {
		t.Fatalf("with a margin: turn %v, want 105ms", at.Sub(t0))
	}
	if at := b.Earliest(room(3), 5*time.Millisecond, t0); at.Sub(t0) != 3*unit {
		t.Fatalf("the whole burst keeps no margin: turn %v, want 300ms", at.Sub(t0))
	}
	if b.AtRest(t0.Add(299*time.Millisecond)) || !b.AtRest(t0.Add(3*unit)) {
		t.Fatal("full again 300 ms after three units, not before")
	}

	// A refund of a unit granted at t0, after which other turns came at t0:
	// the whole unit comes back, the bucket no more than full.
	b.Refund(unit, t0, t0)
	if b.TAT.Sub(t0) != 2*unit {
		t.Fatalf("refund: TAT %v, want 200ms", b.TAT.Sub(t0))
	}
	// A grant whose turn came 30 ms before the latest: 30 ms of it stays.
	c := Bucket{TAT: t0.Add(200 * time.Millisecond), Last: t0.Add(30 * time.Millisecond)}
	c.Refund(unit, t0, t0)
	if c.TAT.Sub(t0) != 130*time.Millisecond {
		t.Fatalf("refund behind later turns: TAT %v, want 130ms", c.TAT.Sub(t0))
	}
	// A bucket made after the grant holds none of it.
	d := Bucket{TAT: t0.Add(unit), Last: t0.Add(unit)}
	d.Refund(unit, t0.Add(-time.Second), t0)
	if d.TAT.Sub(t0) != unit {
		t.Fatal("a refund to a bucket made after its grant changed it")
	}

	// A provider says one unit remains of three: two are owed.
	var e Bucket
	e.Cap(2*unit, t0)
	if at := e.Earliest(room(1), 0, t0); !at.Equal(t0) {
		t.Fatalf("after the cap, the unit left: turn %v, want at once", at.Sub(t0))
	}
	e.Take(unit, t0)
	if at := e.Earliest(room(1), 0, t0); at.Sub(t0) != unit {
		t.Fatalf("after the cap and a unit: turn %v, want 100ms", at.Sub(t0))
	}
	e.Cap(0, t0)
	if e.TAT.Sub(t0) != 3*unit {
		t.Fatal("a cap never fills a bucket")
	}
}
