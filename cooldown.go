package egress

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/control"
)

// holds are a Transport's own controllers, for a limiter that is not a
// Learner (or no limiter): they hold keys in this process as the controller
// decides, with no rate of their own to learn. Checking a key costs one
// atomic load while no key is held.
type holds struct {
	clock  *clock.Clock
	learn  control.Config // no rate: nothing to discover or advertise
	latest atomic.Int64   // the latest hold end in the table, UnixNano; 0 when empty

	mu      sync.Mutex
	keys    map[string]*control.State // guarded by mu
	sweepAt int                       // guarded by mu; the size at which keys at rest are dropped
}

func newHolds(clk *clock.Clock) *holds {
	return &holds{clock: clk, learn: control.Config{Configured: noRate}, keys: make(map[string]*control.State)}
}

// noRate is the rate of a key that has none: its next unit is due at once.
const noRate = 1e18

// remaining returns how long key's hold has left (0 when it has none) and
// the time it read off the clock. While no key has ever been held it reads
// nothing.
func (h *holds) remaining(key string) (time.Duration, time.Time) {
	latest := h.latest.Load()
	if latest == 0 {
		return 0, time.Time{}
	}
	now := (*h.clock).Now()
	if latest <= now.UnixNano() {
		return 0, now
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if st, ok := h.keys[key]; ok {
		return max(st.Hold.Sub(now), 0), now
	}
	return 0, now
}

// Learn implements Learner for the Transport's own holds.
func (h *holds) Learn(_ context.Context, key string, s Signal) Decision {
	h.mu.Lock()
	defer h.mu.Unlock()
	st, ok := h.keys[key]
	if !ok {
		if len(h.keys) >= h.sweepAt {
			for k, v := range h.keys {
				if v.AtRest(&h.learn, s.Now) {
					delete(h.keys, k)
				}
			}
			h.sweepAt = max(64, 2*len(h.keys))
		}
		st = &control.State{}
		h.keys[key] = st
	}
	r := s.response()
	d := st.Learn(&h.learn, &r)
	if !d.Hold.IsZero() {
		h.latest.Store(max(h.latest.Load(), d.Hold.UnixNano()))
	}
	return decided(d)
}
