package egress

import (
	"context"
	"time"
)

// reserver is a limiter that can grant cost in advance without waiting
// for it: the request is counted as if it waited its turn, so that in
// shadow mode the waits reported add up as an enforcing queue's would.
type reserver interface {
	reserveNow(ctx context.Context, key string, cost int, maxWait time.Duration) (time.Duration, error)
}

// reserveNow takes cost tokens from key's bucket at once or in the future,
// as Wait would, and returns the wait without sleeping it; a wait that
// does not fit in maxWait or ctx's deadline takes nothing and returns the
// *LimitError.
func (tb *TokenBucket) reserveNow(ctx context.Context, key string, cost int, maxWait time.Duration) (time.Duration, error) {
	if err := checkCost(key, cost, tb.burst); err != nil || cost == 0 {
		return 0, err
	}
	g, err := tb.reserve(key, cost, waitBudget(ctx, maxWait))
	return g.delay, err
}
