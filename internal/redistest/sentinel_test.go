package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSentinelFailover: the failover client writes through the master;
// after the master is killed a sentinel promotes the replica, which kept the
// data, and the same client writes again.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	begin := time.Now()
	d := StartSentinel(t)
	t.Logf("sentinel deployment ready in %v: sentinels %v", time.Since(begin).Round(time.Millisecond), d.SentinelAddrs)
	require.Len(t, d.SentinelAddrs, 3)

	rdb := d.Client(t)
	require.NoError(t, rdb.Set(ctx, "k", "v", 0).Err())
	// The write must reach the replica before the master dies.
	require.NoError(t, rdb.Do(ctx, "WAIT", 1, 1000).Err())

	old, err := d.KillMaster()
	require.NoError(t, err)
	killed := time.Now()
	promoted, err := d.WaitFailover(old, 20*time.Second)
	require.NoError(t, err)
	t.Logf("master %s killed; %s promoted after %v", old, promoted, time.Since(killed).Round(time.Millisecond))
	assert.NotEqual(t, old, promoted)
	assert.NotNil(t, d.Node(promoted), "the replica is the new master")

	require.Eventually(t, func() bool { return rdb.Set(ctx, "k2", "v2", 0).Err() == nil },
		10*time.Second, 10*time.Millisecond, "the failover client writes to the new master")
	assert.Equal(t, "v", rdb.Get(ctx, "k").Val(), "the replica had the data")
}

// TestReplicatedClusterFailover: killing the master of a key's slot makes
// its replica the master; the cluster heals and the client reaches the key.
func TestReplicatedClusterFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	begin := time.Now()
	c := StartReplicatedCluster(t)
	t.Logf("cluster of 6 ready in %v", time.Since(begin).Round(time.Millisecond))
	require.Len(t, c.Masters(), 3)

	cc := c.Client(t)
	require.NoError(t, cc.Set(ctx, "k", "v", 0).Err())
	m, err := cc.MasterForKey(ctx, "k")
	require.NoError(t, err)
	require.NoError(t, m.Do(ctx, "WAIT", 1, 1000).Err())
	old := m.Options().Addr

	require.NoError(t, c.Kill(old))
	killed := time.Now()
	require.NoError(t, c.WaitHealed(20*time.Second, old))
	t.Logf("master %s killed; cluster healed after %v; masters now %v", old, time.Since(killed).Round(time.Millisecond), c.Masters())
	assert.Len(t, c.Masters(), 3)
	assert.NotContains(t, c.Masters(), old)

	require.Eventually(t, func() bool { return cc.Get(ctx, "k").Val() == "v" },
		10*time.Second, 10*time.Millisecond, "the replica kept the key and serves it")
	assert.Error(t, c.Kill("127.0.0.1:1"), "not a node")
}

func TestInfoField(t *testing.T) {
	info := "# Sentinel\r\nsentinel_masters:1\r\nmaster0:name=m,status=ok,address=127.0.0.1:7000,slaves=1,sentinels=3\r\n"
	tests := []struct {
		line, field, want string
		ok                bool
	}{
		{"master0", "address", "127.0.0.1:7000", true},
		{"master0", "status", "ok", true},
		{"master0", "missing", "", false},
		{"master1", "address", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.line+"/"+tt.field, func(t *testing.T) {
			got, ok := infoField(info, tt.line, tt.field)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.ok, ok)
		})
	}
}
