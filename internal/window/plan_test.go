package window

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestSettling: the averages start at the first settlement, and a grant is
// expected to settle below its estimate only once one did, and not when
// it is overdue.
func TestSettling(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var s Settling
	exp, at := s.Expect(t0, 100, t0)
	assert.Equal(t, 100, exp)
	assert.True(t, at.IsZero(), "nothing learnt")
	s.Learn(0.1, time.Second)
	assert.Equal(t, Settling{N: 1, Ratio: 0.1, TTS: time.Second, Dev: 500 * time.Millisecond}, s)
	exp, at = s.Expect(t0, 100, t0)
	assert.Equal(t, 10, exp)
	assert.Equal(t, t0.Add(time.Second), at)
	exp, at = s.Expect(t0, 100, t0.Add(5*time.Second)) // past 1 s + 1 s + 4 × 0.5 s
	assert.Equal(t, 100, exp, "overdue")
	assert.True(t, at.IsZero())
}

// TestOpen: a grant in flight is forgotten when settled or once it has
// left the window.
func TestOpen(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	o := Open{{t0, 5}, {t0.Add(time.Second), 3}, {t0.Add(2 * time.Second), 3}}
	o.Close(t0.Add(time.Second), 3)
	assert.ElementsMatch(t, Open{{t0, 5}, {t0.Add(2 * time.Second), 3}}, o)
	o.Trim(t0.Add(time.Minute), time.Minute)
	assert.Equal(t, Open{{t0.Add(2 * time.Second), 3}}, o, "the first left the window at its end")
}

// TestPlanEarliest: a window of 10 a minute holding 8 at its estimate,
// expected to settle to 1 in a second: a grant of 5 fits once it has.
func TestPlanEarliest(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	p := Plan{N: 10, Win: time.Minute}
	p.Place(8, t0)
	assert.Equal(t, t0.Add(time.Minute), p.Earliest(5, t0), "nothing learnt: when the 8 leave")
	p = Plan{N: 10, Win: time.Minute, Stats: Settling{N: 1, Ratio: 0.125, TTS: time.Second, Dev: time.Second}}
	p.Place(8, t0)
	assert.Equal(t, t0.Add(time.Second), p.Earliest(5, t0), "when the 8 settle to 1")
	assert.Equal(t, 0, p.Find(t0, 8, false))
	assert.Equal(t, -1, p.Find(t0, 8, true))
}
