package egress

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/egress-go/egress/internal/clock"
)

// Pauser is implemented by limiters that share pauses beyond this process,
// such as a limiter coordinated through Redis. When a provider asks a key to
// pause (a 429 or 503 with Retry-After, or rate-limit headers saying nothing
// is left until a reset), the Transport pauses the key locally and also tells
// its limiter, if the limiter is a Pauser, so that every instance holds its
// requests for the key until then. Pause must be quick; an error is reported
// to the Observer and otherwise ignored, since the local pause still holds.
type Pauser interface {
	Pause(ctx context.Context, key string, until time.Time) error
}

// resumer is implemented by the local limiters that would otherwise let a
// burst go when a key's pause ends: told of the pause, they resume at the
// rate (the provider that asked to wait has refilled little).
type resumer interface {
	resumeAt(key string, until time.Time)
}

// cooldowns is the Transport's table of paused keys. Checking a key costs one
// atomic load while no key is paused.
type cooldowns struct {
	latest atomic.Int64 // the latest pause end in the table, UnixNano; 0 when empty

	mu      sync.Mutex
	until   map[string]time.Time // guarded by mu
	sweepAt int                  // guarded by mu; the size at which ended pauses are dropped
}

// remaining returns how long key's pause has left (0 when it has none) and
// the time it read off clk. While no key has ever been paused it reads
// nothing.
func (c *cooldowns) remaining(key string, clk clock.Clock) (time.Duration, time.Time) {
	latest := c.latest.Load()
	if latest == 0 {
		return 0, time.Time{}
	}
	now := clk.Now()
	if latest <= now.UnixNano() {
		return 0, now
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return max(c.until[key].Sub(now), 0), now
}

// pause holds key until until, unless it is already held longer. It reports
// whether the pause was extended.
func (c *cooldowns) pause(key string, until, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.until == nil {
		c.until = make(map[string]time.Time)
	}
	if !until.After(c.until[key]) {
		return false
	}
	if len(c.until) >= c.sweepAt {
		for k, t := range c.until {
			if !t.After(now) {
				delete(c.until, k)
			}
		}
		c.sweepAt = max(64, 2*len(c.until))
	}
	c.until[key] = until
	c.latest.Store(max(c.latest.Load(), until.UnixNano()))
	return true
}
