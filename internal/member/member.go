// Package member owns an instance's membership of a fleet in Redis: its
// heartbeat (heartbeat.lua, beside it, which internal/lua composes), the
// count of the live instances a beat returns, whether the fleet's scripts
// publish to shard channels, and when the instance last beat. The shared
// limiters each keep a Member; the live count is what their fallbacks
// share a limit by.
//
// It knows nothing of limits, keys, requests or fallbacks, and touches no
// Redis key but the fleet's members set: its owner says how long a
// command may take, and what a beat that failed means.
package member

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/egress-go/egress/internal/argv"
	"github.com/egress-go/egress/internal/caller"
	"github.com/egress-go/egress/internal/clock"
)

// Lua is heartbeat.lua: a live instance recorded, and the live ones
// counted, on the server's clock.
//
//go:embed heartbeat.lua
var Lua string

// Args is heartbeat.lua's ARGV: an instance of the fleet says it is alive
// (or leaves it), and counts the live ones.
type Args struct {
	id   string `argv:"1"`
	ttl  int64  `argv:"2"` // ms an instance counts as live after its last beat
	join int    `argv:"3"` // 1: add the instance; 0: remove it (Close)
}

// Reply is heartbeat.lua's reply: the live instances, and whether the
// scripts publish the fleet's announcements to shard channels
// (internal/lua/publish.lua; see internal/announce).
type Reply struct {
	Live    int64
	Sharded bool
}

// ParseReply checks and reads heartbeat.lua's reply: a count that is not
// negative, and a flag of 0 or 1. A malformed reply is an error, never a
// panic.
func ParseReply(reply []int64) (Reply, error) {
	if len(reply) != 2 || reply[0] < 0 || reply[1] < 0 || reply[1] > 1 {
		return Reply{}, fmt.Errorf("malformed reply %v", reply)
	}
	return Reply{Live: reply[0], Sharded: reply[1] == 1}, nil
}

// Member is one instance's membership of a fleet. Its methods are safe
// for concurrent use.
type Member struct {
	rdb    redis.UniversalClient
	script *redis.Script // heartbeat.lua as internal/lua composes it
	key    string        // the fleet's members: a sorted set
	id     string        // this instance, in it
	ttl    time.Duration // an instance counts as live this long after its beat
	clock  clock.Clock   // the script's time; nil: the server's

	live atomic.Int64 // the live instances last counted, at least 1
	last atomic.Int64 // unix ns (wall clock) of the last beat Redis took; 0 for none
}

// New returns a Member of the fleet whose members set is key in rdb, live
// for ttl after each beat, with a random id. script is internal/lua's
// Heartbeat; clk gives the script its time (nil or clock.Real: the
// server's).
func New(rdb redis.UniversalClient, script *redis.Script, key string, ttl time.Duration, clk clock.Clock) *Member {
	var id [8]byte
	rand.Read(id[:])
	m := &Member{rdb: rdb, script: script, key: key, id: hex.EncodeToString(id[:]), ttl: ttl, clock: clk}
	m.live.Store(1)
	return m
}

// ID returns the instance's id in the fleet.
func (m *Member) ID() string { return m.id }

// Live returns the live instances last counted: 1 before the first beat.
func (m *Member) Live() int64 { return m.live.Load() }

// Since returns how long ago, by the wall clock at now, Redis last took a
// beat of this instance; since the epoch before the first.
func (m *Member) Since(now time.Time) time.Duration { return now.Sub(time.Unix(0, m.last.Load())) }

// args returns heartbeat.lua's arguments, joining (or leaving) the fleet.
func (m *Member) args(join bool) []any {
	return argv.Append(make([]any, 0, 4), &Args{id: m.id, ttl: m.ttl.Milliseconds(), join: argv.Flag(join)})
}

// Beat records the instance as live and counts the fleet, the call run by
// do (the owner's command timeout). probing says the owner is in its
// fallback: a Cluster client then reloads its slots first, as it learns
// a promoted replica only at its periodic reload.
func (m *Member) Beat(do func(func(context.Context) error) error, probing bool) (Reply, error) {
	if c, ok := m.rdb.(interface{ ReloadState(context.Context) }); ok && probing {
		c.ReloadState(context.Background())
	}
	var r Reply
	err := do(func(ctx context.Context) error {
		reply, err := caller.Run(ctx, m.rdb, m.clock, m.script, []string{m.key}, m.args(true)...).Int64Slice()
		if err == nil {
			r, err = ParseReply(reply)
		}
		return err
	})
	if err == nil {
		m.took(r)
	}
	return r, err
}

// Leave removes the instance from the fleet (on Close), the call run by
// do. Left as it is, its last beat expires on its own after ttl.
func (m *Member) Leave(do func(func(context.Context) error) error) error {
	return do(func(ctx context.Context) error {
		return caller.Run(ctx, m.rdb, m.clock, m.script, []string{m.key}, m.args(false)...).Err()
	})
}

// Pipe queues a beat in pipe, run by run (EVALSHA or EVAL) with now as
// its time (caller.Now), so that it rides on another script's round trip.
// Once the pipeline has run, Took reads its reply.
func (m *Member) Pipe(ctx context.Context, pipe redis.Pipeliner, now string,
	run func(*redis.Script, context.Context, redis.Scripter, []string, ...any) *redis.Cmd) *redis.Cmd {
	return run(m.script, ctx, pipe, []string{m.key}, append(m.args(true), now)...)
}

// Took records the reply of a beat Pipe queued, when Redis took it, and
// returns it; ok is false when it failed or was malformed.
func (m *Member) Took(cmd *redis.Cmd) (r Reply, ok bool) {
	reply, err := cmd.Int64Slice()
	if err == nil {
		r, err = ParseReply(reply)
	}
	if err != nil {
		return Reply{}, false
	}
	m.took(r)
	return r, true
}

func (m *Member) took(r Reply) {
	m.live.Store(max(1, r.Live))
	m.last.Store(time.Now().UnixNano())
}

// Assume sets the live count as if a beat had counted live instances, and
// Forget forgets the last beat, so that the next is due (see Since): the
// owner's tests run one instance as one of many, and make a beat ride on
// a call. Beaten reports whether Redis has taken a beat of the instance.
func (m *Member) Assume(live int64) { m.live.Store(max(1, live)) }

// Forget: see Assume.
func (m *Member) Forget() { m.last.Store(0) }

// Beaten: see Assume.
func (m *Member) Beaten() bool { return m.last.Load() != 0 }
