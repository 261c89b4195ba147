package egress

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/argv"
	"github.com/egress-go/egress/internal/caller"
	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/lease"
	"github.com/egress-go/egress/internal/lua"
	"github.com/egress-go/egress/internal/redistest"
)

// The in-flight leases of one key, as step tables that run through the Go
// (lease.Set, InFlightLimit's) and the Lua (slots.lua, SharedInFlightLimit's)
// on one fake clock: the script takes the time as its last argument, and
// both must answer each step as the table says, exactly.

// leaseStep is one step: at (since the table's start), an acquire of lease
// id for life, or a release of id; and the answer: taken, or how long
// until the earliest lease ends (acquire); whether id was held (release).
type leaseStep struct {
	at       time.Duration
	release  bool
	id       uint64
	life     time.Duration
	taken    bool
	wait     time.Duration
	released bool
}

func acquireStep(at time.Duration, id uint64, life time.Duration, taken bool, wait time.Duration) leaseStep {
	return leaseStep{at: at, id: id, life: life, taken: taken, wait: wait}
}

func releaseStep(at time.Duration, id uint64, held bool) leaseStep {
	return leaseStep{at: at, release: true, id: id, released: held}
}

type leaseTable struct {
	name  string
	n     int // the most leases the key may hold
	steps []leaseStep
}

func leaseTables() []leaseTable {
	const ms = time.Millisecond
	return []leaseTable{
		{"fills, then waits for the earliest end", 2, []leaseStep{
			acquireStep(0, 1, 100*ms, true, 0),
			acquireStep(10*ms, 2, 50*ms, true, 0),
			acquireStep(20*ms, 3, time.Second, false, 40*ms), // lease 2 ends at 60 ms
			acquireStep(59999*time.Microsecond, 3, time.Second, false, time.Microsecond),
			acquireStep(60*ms, 3, time.Second, true, 0), // a lease ends at its time
			acquireStep(70*ms, 4, time.Second, false, 30*ms),
		}},
		{"a release frees a slot at once", 1, []leaseStep{
			acquireStep(0, 1, time.Second, true, 0),
			acquireStep(100*ms, 2, time.Second, false, 900*ms),
			releaseStep(200*ms, 1, true),
			acquireStep(200*ms, 2, time.Second, true, 0),
			releaseStep(300*ms, 1, false), // released already
			releaseStep(300*ms, 2, true),
			releaseStep(300*ms, 2, false),
		}},
		{"ended leases go, held ones stay", 3, []leaseStep{
			acquireStep(0, 1, 10*ms, true, 0),
			acquireStep(1*ms, 2, 500*ms, true, 0),
			acquireStep(2*ms, 3, 20*ms, true, 0),
			acquireStep(5*ms, 4, time.Second, false, 5*ms),
			acquireStep(30*ms, 4, time.Second, true, 0), // 1 and 3 ended
			acquireStep(31*ms, 5, 40*ms, true, 0),
			acquireStep(32*ms, 6, time.Second, false, 39*ms), // 5 ends first
			releaseStep(40*ms, 2, true),
			acquireStep(40*ms, 6, time.Second, true, 0),
		}},
		{"a release of a lease that ended, not yet dropped", 1, []leaseStep{
			acquireStep(0, 1, 10*ms, true, 0),
			releaseStep(50*ms, 1, true), // no acquire since dropped it
			acquireStep(50*ms, 2, 10*ms, true, 0),
			acquireStep(60*ms, 3, 10*ms, true, 0), // 2 ended, dropped by this acquire
			releaseStep(61*ms, 2, false),
		}},
	}
}

// TestLeaseSteps runs each lease table through lease.Set and through
// slots.lua on one fake clock.
func TestLeaseSteps(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	script := redis.NewScript(lua.Slots)
	for i, tc := range leaseTables() {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now().Truncate(time.Microsecond) // the key expires on Redis's own clock
			fc := clock.NewFake(start)
			key := fmt.Sprintf("egress:{leases%d}:slots", i)
			var ls lease.Set
			for j, st := range tc.steps {
				fc.Advance(start.Add(st.at).Sub(fc.Now()))
				id := strconv.FormatUint(st.id, 10)
				if st.release {
					held := ls.Release(st.id)
					reply, err := caller.Run(context.Background(), rdb, fc, script, []string{key}, lease.ReleaseArgs("egress:{leases}:test", "", []string{id})...).Int64Slice()
					require.NoError(t, err, "step %d", j)
					r, err := lease.ParseReply(reply)
					require.NoError(t, err, "step %d", j)
					assert.Equal(t, st.released, held, "step %d: Go's release of %d", j, st.id)
					assert.Equal(t, lease.Reply{N: int64(argv.Flag(st.released))}, r, "step %d: Lua's release of %d", j, st.id)
					continue
				}
				taken, wait := ls.Acquire(st.id, tc.n, fc.Now(), st.life)
				reply, err := caller.Run(context.Background(), rdb, fc, script, []string{key}, lease.AcquireArgs(id, tc.n, st.life)...).Int64Slice()
				require.NoError(t, err, "step %d", j)
				r, err := lease.ParseReply(reply)
				require.NoError(t, err, "step %d", j)
				assert.Equal(t, st.taken, taken, "step %d: Go's acquire of %d", j, st.id)
				assert.Equal(t, st.wait, wait, "step %d: Go's wait", j)
				assert.Equal(t, lease.Reply{N: int64(argv.Flag(st.taken)), Wait: st.wait}, r, "step %d: Lua's acquire of %d", j, st.id)
			}
		})
	}
}
