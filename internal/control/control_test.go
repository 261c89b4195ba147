package control

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The controller's arithmetic, on its own. Its rules, response by
// response, are held to their step tables in the root package's
// controller_test.go (through the limiters) and controller_lua_test.go
// (through this package and control.lua alike).

var epoch = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// TestControllerCubic: the climb back is w0 at the decrease, the aim at K,
// above it after, and never above the configured rate nor below the floor.
func TestControllerCubic(t *testing.T) {
	cfg := DefaultConfig(100)
	st := State{Wmax: 80, W0: 56, Climb: epoch}
	k := math.Cbrt((80 - 56) / (cfg.C * 80))
	at := func(s float64) time.Time { return epoch.Add(time.Duration(s * float64(time.Second))) }
	assert.InDelta(t, 56, st.Rate(&cfg, epoch), 1e-9)
	assert.InDelta(t, 80, st.Rate(&cfg, at(k)), 1e-9)
	assert.Greater(t, st.Rate(&cfg, at(k+2)), 80.0)
	assert.Equal(t, 100.0, st.Rate(&cfg, at(k+60)), "never above the configured rate")
	low := State{Wmax: 12, W0: 1, Climb: epoch}
	assert.Equal(t, 10.0, low.Rate(&cfg, epoch), "never below the floor")
	// A plateau (plateauFor) keeps it at the aim that much longer, then
	// the same curve.
	flat := st
	flat.Plateau = 3
	assert.InDelta(t, 80, flat.Rate(&cfg, at(k+3)), 1e-9, "at the aim until the plateau's end")
	assert.InDelta(t, st.Rate(&cfg, at(k+2)), flat.Rate(&cfg, at(k+5)), 1e-9, "then growing as without it")
	assert.InDelta(t, st.Rate(&cfg, at(k/2)), flat.Rate(&cfg, at(k/2)), 1e-9, "the climb to the aim is the same")
	k95 := math.Cbrt((95 - 70) / (cfg.C * 95))
	assert.InDelta(t, 8-k95, plateauFor(time.Second, 70, 95, cfg.C), 1e-9, "eight holds of 1 s after the climb began")
	assert.InDelta(t, 60-k95, plateauFor(10*time.Second, 70, 95, cfg.C), 1e-9, "a minute at most")
	assert.Zero(t, plateauFor(100*time.Millisecond, 70, 95, cfg.C), "eight holds of 0.1 s end before K")
}

// TestProbingTakesAShareOfTheHold: the probes after a hold, and their gap
// (a unit at the floor rate), from the floor and the hold's length: their
// gaps take at most a quarter of the hold (half of a long one), and they
// are stormProbes at most. A storm not told costs another hold; the
// probes cost at most a quarter of one, half of a long one. A hold is
// long, and all its probes follow it without a sign, when it is longer
// than a unit at the floor rate rounded up to whole seconds (the longest
// Retry-After a bucket at or above the floor gives a request sent early:
// longHold).
func TestProbingTakesAShareOfTheHold(t *testing.T) {
	const ms, s = time.Millisecond, time.Second
	for _, c := range []struct {
		floor float64
		hold  time.Duration
		k     int
		gap   time.Duration
		long  bool
	}{
		{10, 100 * ms, 1, 100 * ms, false}, // the first request after the hold only
		{10, 200 * ms, 1, 100 * ms, false},
		{10, 800 * ms, 3, 100 * ms, false},
		{10, s, 3, 100 * ms, false},
		{10, 1001 * ms, 6, 100 * ms, true}, // long: half of it
		{10, 2 * s, 10, 100 * ms, true},
		{10, 10 * s, StormProbes, 100 * ms, true},
		{20, s, 6, 50 * ms, false},
		{1.5, s, 1, 666666666, false}, // a unit of 667 ms: 1 s
		{1.5, 2 * s, 2, 666666666, true},
		{0.5, 2 * s, 1, 2 * s, false}, // a unit of 2 s
		{0.5, 3 * s, 1, 2 * s, true},
		{0, s, 0, 0, false},         // no floor: no probes
		{0, time.Hour, 0, 0, false}, // nor a long hold
		{10, 0, 0, 0, false},        // no hold: none
	} {
		k, gap := Probing(c.floor, c.hold)
		assert.Equal(t, c.k, k, "probes after a hold of %v at a floor of %v/s", c.hold, c.floor)
		assert.Equal(t, c.gap, gap, "their gap after a hold of %v at a floor of %v/s", c.hold, c.floor)
		assert.Equal(t, c.long, LongHold(c.floor, c.hold), "a hold of %v at a floor of %v/s: long", c.hold, c.floor)
	}
}

// TestUnsaid: a throttle without a Retry-After holds a key a unit at its
// rate; one that says nothing at all (no count either), a unit at the
// floor rate at least.
func TestUnsaid(t *testing.T) {
	const ms = time.Millisecond
	assert.Equal(t, 100*ms, unsaid(10, 100, true))
	assert.Equal(t, 10*ms, unsaid(10, 100, false))
	assert.Equal(t, 500*ms, unsaid(2, 5, true), "a unit at the floor, longer than the key's")
	assert.Equal(t, 10*ms, unsaid(0, 100, true), "no floor: the key's unit")
}
