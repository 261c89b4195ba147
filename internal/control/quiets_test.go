package control

import (
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestQuietsAreQuiet: a key whose silent responses are counted without
// the lock (Quiets.Add, applied by Settle at the next lock) ends in the
// state of one whose every silent response was applied at once (Quiet),
// through random streams of grants, silent responses and responses that
// teach (counts, zeros, throttles), read in or out of order; and Add
// counts most silent ones.
func TestQuietsAreQuiet(t *testing.T) {
	counted, all := 0, 0
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 7))
		cfg := DefaultConfig(50)
		var now State // applied at once
		var later State
		var q Quiets
		at := epoch
		lock := func() { later.Settle(&q) }
		unlock := func() { q.Open(&later, true) }
		for step := range 600 {
			at = at.Add(time.Duration(rng.Int64N(int64(40 * time.Millisecond))))
			r := randomResponse(rng, at)
			switch {
			case rng.IntN(4) == 0:
				lock()
				now.Spend(at, at, 1, now.Rate(&cfg, at))
				later.Spend(at, at, 1, later.Rate(&cfg, at))
				unlock()
			case now.Silent(&r) && Plain(r.Counts, r.Status, r.Scope, r.Throttled):
				now.Quiet(r.SentAt)
				all++
				if q.Add(r.SentAt) {
					counted++
					continue
				}
				lock()
				require.True(t, later.Silent(&r), "seed %d step %d: silent to one, not the other", seed, step)
				later.Quiet(r.SentAt)
				unlock()
			default:
				now.Learn(&cfg, &r)
				lock()
				later.Learn(&cfg, &r)
				unlock()
			}
			if rng.IntN(8) == 0 {
				lock()
				require.True(t, reflect.DeepEqual(now, later), "seed %d step %d: the states differ", seed, step)
				unlock()
			}
		}
		lock()
		require.True(t, reflect.DeepEqual(now, later), "seed %d: the states differ at the end", seed)
	}
	require.Greater(t, counted, all/2, "most silent responses are counted without the lock")
}

// randomResponse returns a response read at at: mostly plain successes,
// sent up to 300 ms before (out of order), and some that teach.
func randomResponse(rng *rand.Rand, at time.Time) Response {
	r := Response{Now: at, SentAt: at.Add(-time.Duration(rng.Int64N(int64(300 * time.Millisecond)))), Status: 200}
	switch rng.IntN(10) {
	case 0:
		r.Status, r.Throttled = 429, true
		r.RetryAfter, r.HasRetryAfter = time.Duration(rng.IntN(3))*100*time.Millisecond, rng.IntN(2) == 0
	case 1:
		r.Counts, r.HasQuota = true, true
		r.Quota = Quota{Limit: 10, HasLimit: true, Remaining: float64(rng.IntN(3)), HasRemaining: true,
			Reset: time.Second, HasReset: true, Kind: Shape(rng.IntN(3))}
	case 2:
		r.Status = 0 // no response
	}
	return r
}
