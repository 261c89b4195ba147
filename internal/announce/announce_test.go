package announce

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/egress-go/egress/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// heardOn returns the next payload a hears within a second, or "" when
// none comes.
func heardOn(a *Subs) string {
	select {
	case p := <-a.in:
		return p
	case <-time.After(time.Second):
		return ""
	}
}

// newSubs returns the subscriptions of a limiter named n on a server of
// its own, closed by t's cleanup, and another client of that server.
func newSubs(t *testing.T) (*Subs, *redis.Client) {
	srv := redistest.Start(t)
	a := New(srv.Client(t), "egress:{n:*}:pauses", time.Second)
	t.Cleanup(a.Close)
	return a, srv.Client(t)
}

// TestSharded: on Redis 7, a key's channel is subscribed to (SSUBSCRIBE)
// from the first Sync after its key is used, hears what is published there
// (SPUBLISH) and nothing of the limiter's other keys, and is left once
// unused for Idle, on the times Sync is given.
func TestSharded(t *testing.T) {
	a, admin := newSubs(t)
	ctx := context.Background()
	a.Heard(true)
	t0 := time.Now()
	a.Want("egress:{n:k1}:pauses", t0)
	a.Sync(true, t0)
	require.Eventually(t, func() bool { return redistest.ShardSubscribers(t, admin, "egress:{n:k1}:pauses") == 1 }, time.Second, time.Millisecond)
	assert.Zero(t, redistest.ShardSubscribers(t, admin, "egress:{n:k2}:pauses"), "only the keys used")
	n, err := admin.PubSubNumPat(ctx).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "no pattern on Redis 7")

	require.NoError(t, admin.SPublish(ctx, "egress:{n:k2}:pauses", "k2").Err())
	require.NoError(t, admin.SPublish(ctx, "egress:{n:k1}:pauses", "k1").Err())
	assert.Equal(t, "k1", heardOn(a), "k1's channel, not k2's")

	a.Want("egress:{n:k1}:pauses", t0.Add(30*time.Second))
	a.Sync(true, t0.Add(30*time.Second+Idle))
	assert.Equal(t, int64(1), redistest.ShardSubscribers(t, admin, "egress:{n:k1}:pauses"), "used within Idle")
	a.Sync(true, t0.Add(31*time.Second+Idle))
	require.Eventually(t, func() bool { return redistest.ShardSubscribers(t, admin, "egress:{n:k1}:pauses") == 0 }, time.Second, time.Millisecond,
		"left once unused for Idle")
	assert.Empty(t, a.subs, "the node's subscription closed with its last channel")
}

// TestPlain: when the heartbeat says the scripts PUBLISH (a Redis before
// 7), one pattern subscription hears every key's channel of
// the limiter, and no other limiter's.
func TestPlain(t *testing.T) {
	a, admin := newSubs(t)
	ctx := context.Background()
	a.Sync(true, time.Now())
	assert.Empty(t, a.subs, "no subscription before a heartbeat answered")
	a.Heard(false)
	a.Sync(true, time.Now())
	require.Eventually(t, func() bool { n, _ := admin.PubSubNumPat(ctx).Result(); return n == 1 }, time.Second, time.Millisecond)
	require.NoError(t, admin.Publish(ctx, "egress:{nn:k}:pauses", "other").Err())
	require.NoError(t, admin.Publish(ctx, "egress:{n:k7}:pauses", "k7").Err())
	assert.Equal(t, "k7", heardOn(a))

	a.Heard(true) // the server was upgraded
	a.Want("egress:{n:k7}:pauses", time.Now())
	a.Sync(false, time.Now())
	require.Eventually(t, func() bool { n, _ := admin.PubSubNumPat(ctx).Result(); return n == 0 }, time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return redistest.ShardSubscribers(t, admin, "egress:{n:k7}:pauses") == 1 }, time.Second, time.Millisecond)
}

// TestShardedFollowsAMovedSlot: on a Redis Cluster, a key's channel is
// subscribed to on the node that serves its slot; when the slot moves to
// another node, the next full Sync (once the client knows the move)
// subscribes there and leaves the old node, and hears what is published.
func TestShardedFollowsAMovedSlot(t *testing.T) {
	c := redistest.StartCluster(t)
	cc := c.Client(t)
	ctx := context.Background()
	a := New(cc, "egress:{n:*}:pauses", time.Second)
	defer a.Close()
	a.Heard(true)
	const ch = "egress:{n:moved}:pauses" // its slot holds no key: it can move as it is
	now := time.Now()
	a.Want(ch, now)
	a.Sync(true, now)
	from, err := cc.MasterForKey(ctx, ch)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return redistest.ShardSubscribers(t, from, ch) == 1 }, time.Second, time.Millisecond)
	assert.Equal(t, map[string]string{ch: from.Options().Addr}, a.on)

	to := moveSlot(t, cc, ch, from)
	require.Eventually(t, func() bool {
		cc.ReloadState(ctx)
		n, err := cc.MasterForKey(ctx, ch)
		return err == nil && n.Options().Addr == to.Options().Addr
	}, 5*time.Second, 10*time.Millisecond, "the client learns the move")
	a.Sync(true, now)
	require.Eventually(t, func() bool { return redistest.ShardSubscribers(t, to, ch) == 1 }, time.Second, time.Millisecond)
	assert.Zero(t, redistest.ShardSubscribers(t, from, ch), "the old node left")
	assert.Equal(t, map[string]string{ch: to.Options().Addr}, a.on)
	require.NoError(t, cc.SPublish(ctx, ch, "moved").Err())
	assert.Equal(t, "moved", heardOn(a))
}

// moveSlot gives the slot of key, served by from and holding no key, to
// another master of cc, and returns that master.
func moveSlot(t *testing.T, cc *redis.ClusterClient, key string, from *redis.Client) *redis.Client {
	t.Helper()
	ctx := context.Background()
	slot, err := cc.ClusterKeySlot(ctx, key).Result()
	require.NoError(t, err)
	var masters []*redis.Client
	var mu sync.Mutex
	require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		masters = append(masters, n)
		return nil
	}))
	var to *redis.Client
	for _, n := range masters {
		if n.Options().Addr != from.Options().Addr {
			to = n
			break
		}
	}
	require.NotNil(t, to)
	id, err := to.ClusterMyID(ctx).Result()
	require.NoError(t, err)
	// The new owner first, then the old, then the rest (CLUSTER SETSLOT's
	// order for a resharding).
	order := []*redis.Client{to, from}
	for _, n := range masters {
		if n != to && n.Options().Addr != from.Options().Addr {
			order = append(order, n)
		}
	}
	for _, n := range order {
		require.NoError(t, n.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", id).Err(), "%s", n.Options().Addr)
	}
	return to
}
