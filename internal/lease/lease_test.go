package lease

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSet: a key's leases, one step at a time. Its step tables, run
// through Set and slots.lua alike, are the root's TestLeaseSteps.
func TestSet(t *testing.T) {
	const s = time.Second
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var ls Set
	assert.True(t, ls.Next().IsZero(), "none held: no end")

	taken, wait := ls.Acquire(1, 2, t0, 3*s)
	assert.True(t, taken)
	assert.Zero(t, wait)
	taken, _ = ls.Acquire(2, 2, t0.Add(s), 3*s)
	assert.True(t, taken)
	taken, wait = ls.Acquire(3, 2, t0.Add(2*s), 3*s)
	assert.False(t, taken, "two of two held")
	assert.Equal(t, s, wait, "until the earliest ends")
	assert.Equal(t, t0.Add(3*s), ls.Next())

	taken, _ = ls.Acquire(3, 2, t0.Add(3*s), 3*s)
	assert.True(t, taken, "a lease ends at its time: at that instant it is no longer held")

	assert.True(t, ls.Release(2))
	assert.False(t, ls.Release(2), "released once")
	assert.False(t, ls.Release(1), "lease 1 ended and was dropped")
	assert.Equal(t, t0.Add(6*s), ls.Next(), "lease 3 is left")

	ls.Expire(t0.Add(6 * s))
	assert.True(t, ls.Next().IsZero(), "all ended")
}

// TestReply: slots.lua's reply is read by one decoder, which takes a
// malformed one for an error.
func TestReply(t *testing.T) {
	r, err := ParseReply([]int64{0, 1500})
	require.NoError(t, err)
	assert.Equal(t, Reply{N: 0, Wait: 1500 * time.Microsecond}, r)
	for _, bad := range [][]int64{nil, {1}, {1, 0, 0}, {-1, 0}, {1, -1}} {
		_, err := ParseReply(bad)
		assert.Error(t, err, "%v", bad)
	}
}

// TestArgs: each operation's arguments, in the header's order.
func TestArgs(t *testing.T) {
	assert.Equal(t, []any{"acquire", "a:1", int64(3), int64(1500)}, AcquireArgs("a:1", 3, 1500*time.Microsecond))
	assert.Equal(t, []any{"renew", "a:1", int64(10), "a:2", int64(20)}, LeasesArgs("renew", []Lease{{"a:1", 10}, {"a:2", 20}}))
	assert.Equal(t, []any{"release", "ch", "p", "a:1", "a:2"}, ReleaseArgs("ch", "p", []string{"a:1", "a:2"}))
}
