package egress

import (
	"context"
	"testing"
	"time"

	"github.com/egress-go/egress/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// heardOn returns the next payload a hears within a second, or "" when
// none comes.
func heardOn(a *announcements) string {
	select {
	case p := <-a.in:
		return p
	case <-time.After(time.Second):
		return ""
	}
}

// shardSubscribers returns the subscribers of shard channel ch on rdb.
func shardSubscribers(t *testing.T, rdb *redis.Client, ch string) int64 {
	t.Helper()
	n, err := rdb.PubSubShardNumSub(context.Background(), ch).Result()
	require.NoError(t, err)
	return n[ch]
}

// TestAnnouncementsSharded: on Redis 7, a key's channel is subscribed to
// (SSUBSCRIBE) from the first sync after its key is used, hears what is
// published there (SPUBLISH) and nothing of the limiter's other keys, and
// is left once unused for announceIdle, on the times sync is given.
func TestAnnouncementsSharded(t *testing.T) {
	srv := redistest.Start(t)
	rdb, admin := srv.Client(t), srv.Client(t)
	ctx := context.Background()
	a := newAnnouncements(rdb, "egress:{n:*}:pauses", time.Second)
	defer a.close()
	a.heard(beatReply{live: 1, sharded: true})
	t0 := time.Now()
	a.want("egress:{n:k1}:pauses", t0)
	a.sync(true, t0)
	require.Eventually(t, func() bool { return shardSubscribers(t, admin, "egress:{n:k1}:pauses") == 1 }, time.Second, time.Millisecond)
	assert.Zero(t, shardSubscribers(t, admin, "egress:{n:k2}:pauses"), "only the keys used")
	n, err := admin.PubSubNumPat(ctx).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "no pattern on Redis 7")

	require.NoError(t, admin.SPublish(ctx, "egress:{n:k2}:pauses", "k2").Err())
	require.NoError(t, admin.SPublish(ctx, "egress:{n:k1}:pauses", "k1").Err())
	assert.Equal(t, "k1", heardOn(a), "k1's channel, not k2's")

	a.want("egress:{n:k1}:pauses", t0.Add(30*time.Second))
	a.sync(true, t0.Add(30*time.Second+announceIdle))
	assert.Equal(t, int64(1), shardSubscribers(t, admin, "egress:{n:k1}:pauses"), "used within announceIdle")
	a.sync(true, t0.Add(31*time.Second+announceIdle))
	require.Eventually(t, func() bool { return shardSubscribers(t, admin, "egress:{n:k1}:pauses") == 0 }, time.Second, time.Millisecond,
		"left once unused for announceIdle")
	assert.Empty(t, a.subs, "the node's subscription closed with its last channel")
}

// TestAnnouncementsPlain: when the heartbeat says the scripts PUBLISH (a
// Redis before 7), one pattern subscription hears every key's channel of
// the limiter, and no other limiter's.
func TestAnnouncementsPlain(t *testing.T) {
	srv := redistest.Start(t)
	rdb, admin := srv.Client(t), srv.Client(t)
	ctx := context.Background()
	a := newAnnouncements(rdb, "egress:{n:*}:pauses", time.Second)
	defer a.close()
	a.sync(true, time.Now())
	assert.Empty(t, a.subs, "no subscription before a heartbeat answered")
	a.heard(beatReply{live: 1})
	a.sync(true, time.Now())
	require.Eventually(t, func() bool { n, _ := admin.PubSubNumPat(ctx).Result(); return n == 1 }, time.Second, time.Millisecond)
	require.NoError(t, admin.Publish(ctx, "egress:{nn:k}:pauses", "other").Err())
	require.NoError(t, admin.Publish(ctx, "egress:{n:k7}:pauses", "k7").Err())
	assert.Equal(t, "k7", heardOn(a))

	a.heard(beatReply{live: 1, sharded: true}) // the server was upgraded
	a.want("egress:{n:k7}:pauses", time.Now())
	a.sync(false, time.Now())
	require.Eventually(t, func() bool { n, _ := admin.PubSubNumPat(ctx).Result(); return n == 0 }, time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return shardSubscribers(t, admin, "egress:{n:k7}:pauses") == 1 }, time.Second, time.Millisecond)
}
