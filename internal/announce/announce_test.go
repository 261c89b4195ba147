package announce

import (
	"context"
	"testing"
	"time"

	"github.com/egress-go/egress/internal/redistest"
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

// TestSharded: on Redis 7, a key's channel is subscribed to (SSUBSCRIBE)
// from the first Sync after its key is used, hears what is published there
// (SPUBLISH) and nothing of the limiter's other keys, and is left once
// unused for Idle, on the times Sync is given.
func TestSharded(t *testing.T) {
	srv := redistest.Start(t)
	rdb, admin := srv.Client(t), srv.Client(t)
	ctx := context.Background()
	a := New(rdb, "egress:{n:*}:pauses", time.Second)
	defer a.Close()
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
	srv := redistest.Start(t)
	rdb, admin := srv.Client(t), srv.Client(t)
	ctx := context.Background()
	a := New(rdb, "egress:{n:*}:pauses", time.Second)
	defer a.Close()
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
