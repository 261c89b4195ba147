package egress

import (
	"context"
	"time"

	"github.com/egress-go/egress/internal/control"
)

// Learner is implemented by a limiter that learns from responses. After
// every attempt the Transport reads the response into a Signal and hands it
// to its limiter, when the limiter is a Learner; the limiter's controller
// for the key updates the key's state and returns what the Transport must
// do. The limiters of this package are Learners; a decorator around one
// should forward Learn. A Transport whose limiter is not a Learner (or that
// has none) keeps holds itself, in the process.
//
// Learn gets the request's context: a limiter that writes what it learns
// elsewhere (Redis) should not let the request's cancellation stop the
// write (context.WithoutCancel). Learn must be quick and safe for concurrent
// use. A Decision's Err is reported to the Observer; the decision itself
// still holds. The Signal is the Learner's own copy; its Quotas slice must
// not be modified.
type Learner interface {
	Learn(ctx context.Context, key string, s Signal) Decision
}

// Decision is what a key's controller decided after a response.
type Decision struct {
	// Hold is when the key's hold ends: until then the limiter admits no
	// request of the key (for the whole fleet, when the limiter is shared).
	// Zero: the response did not hold the key.
	Hold time.Time
	// NotBefore is the earliest time the request that got the response may
	// be sent again (its own Retry-After); other requests are not delayed.
	// Zero: no constraint beyond the retry policy's backoff.
	NotBefore time.Time
	// Old and New are the key's rate before and after the response, when it
	// changed; Why says what changed it: "advertised" (the provider stated
	// its limit), "throttled" (discovery lowered it), "storm" (the
	// decreases throttles caused are undone), "counted" (the provider's
	// counts showed no room, or fell, as the rate climbed back: it
	// levelled off at the refill they show).
	Old, New Rate
	Why      string
	// Err is an error of the limiter while learning (a shared limiter that
	// could not reach Redis); the decision was applied locally.
	Err error

	// drain: the provider's bucket holds keep units as of the response
	// (its remaining less the requests still in flight, which will spend
	// it: below 0 when they are more); a limiter of this package keeps no
	// more in its own (in debt, below 0), rather than hold the key.
	drain bool
	keep  float64
	// from and to: the key's rate before and after the response, told or
	// not (a climb sped by room is not told), in units per second.
	from, to float64
}

// decided is the Decision of a key's controller, d.
func decided(d control.Decision) Decision {
	out := Decision{Hold: d.Hold, NotBefore: d.NotBefore, Why: d.Why,
		drain: d.Drain, keep: d.Keep, from: d.From, to: d.To}
	if d.Why != "" {
		out.Old, out.New = PerSecond(d.Old), PerSecond(d.New)
	}
	return out
}
