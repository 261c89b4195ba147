package window

import (
	"testing"
	"time"
)

// TestLogTurns: a log of 3 units in any second gives the fourth unit the
// turn at which the first leaves the window; a charge after the fact goes
// in time order; a grant given back frees its unit; trimmed, the log keeps
// only what is still in the window.
func TestLogTurns(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	ms := time.Millisecond
	g := &Log{W: time.Second}
	for i := range 3 {
		at := g.Earliest(t0.Add(time.Duration(i)*100*ms), 1, 3)
		if want := t0.Add(time.Duration(i) * 100 * ms); !at.Equal(want) {
			t.Fatalf("grant %d at %v, want %v", i, at.Sub(t0), want.Sub(t0))
		}
		g.Add(at, 1)
	}
	if at := g.Earliest(t0.Add(300*ms), 1, 3); !at.Equal(t0.Add(time.Second)) {
		t.Errorf("the fourth unit at %v, want 1s: when the first leaves", at.Sub(t0))
	}
	if at := g.Earliest(t0.Add(300*ms), 2, 3); !at.Equal(t0.Add(1100 * ms)) {
		t.Errorf("two units at %v, want 1.1s: when the second leaves", at.Sub(t0))
	}
	g.Insert(t0.Add(50*ms), 1) // charged after the fact
	if g.Sum != 4 || !g.At[1].Equal(t0.Add(50*ms)) {
		t.Errorf("inserted: sum %d, at %v", g.Sum, g.At)
	}
	if !g.Adjust(t0.Add(50*ms), 1, 0) || g.Sum != 3 {
		t.Errorf("a charge given back: sum %d", g.Sum)
	}
	if g.Adjust(t0.Add(60*ms), 1, 0) {
		t.Error("a grant not in the log was adjusted")
	}
	g.Remove(t0.Add(100*ms), 1)
	if g.Sum != 2 || g.Find(t0.Add(100*ms), 1) != -1 {
		t.Errorf("removed: sum %d", g.Sum)
	}
	if got := g.Staying(t0.Add(1050 * ms)); got != 1 {
		t.Errorf("staying at 1.05s: %d, want 1 (the grant at 200ms)", got)
	}
	g.Trim(t0.Add(1050 * ms))
	if g.Sum != 1 || g.AtRest(t0.Add(1050*ms)) {
		t.Errorf("trimmed at 1.05s: sum %d", g.Sum)
	}
	if !g.AtRest(t0.Add(1200 * ms)) {
		t.Error("at rest once the last grant left the window")
	}
}
