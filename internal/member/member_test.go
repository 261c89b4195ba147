package member

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseReply(t *testing.T) {
	r, err := ParseReply([]int64{3, 1})
	require.NoError(t, err)
	assert.Equal(t, Reply{Live: 3, Sharded: true}, r)
	r, err = ParseReply([]int64{0, 0})
	require.NoError(t, err)
	assert.Equal(t, Reply{}, r)
	for _, bad := range [][]int64{nil, {1}, {1, 0, 0}, {-1, 0}, {1, 2}, {1, -1}} {
		_, err := ParseReply(bad)
		assert.Error(t, err, "%v", bad)
	}
}

// TestArgs: the script's arguments, joining and leaving, and a count
// that a reply of no instance still takes as this one.
func TestArgs(t *testing.T) {
	m := New(nil, nil, "members", 3500*time.Millisecond, nil)
	assert.Len(t, m.ID(), 16)
	assert.Equal(t, []any{m.ID(), int64(3500), int64(1)}, m.args(true))
	assert.Equal(t, []any{m.ID(), int64(3500), int64(0)}, m.args(false))
	assert.Equal(t, int64(1), m.Live(), "before the first beat")
	assert.False(t, m.Beaten())
	m.took(Reply{Live: 0})
	assert.Equal(t, int64(1), m.Live())
	assert.True(t, m.Beaten())
	m.Assume(256)
	assert.Equal(t, int64(256), m.Live())
	m.Forget()
	assert.False(t, m.Beaten())
}
