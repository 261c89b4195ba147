package egress

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// announcements is an instance's subscriptions to what its fleet
// announces: a shared limiter's holds and moved turns, a shared in-flight
// limit's released slots. Each key has its channel, which carries the
// key's hash tag, and the script that changes the key publishes there
// (internal/lua/publish.lua):
//
//   - on Redis 7 and later, a shard channel (SPUBLISH). A Redis Cluster
//     carries the message within the shard that serves the key's slot,
//     not to every node, and an instance subscribes (SSUBSCRIBE) to the
//     channels of the keys it uses, each on its key's node, while it uses
//     them: from a key's first reservation until it has gone unused for
//     announceIdle;
//   - before 7, PUBLISH, and an instance subscribes to all of the
//     limiter's channels with one pattern (PSUBSCRIBE).
//
// Each heartbeat's reply says which (beatReply), and the subscriptions
// follow it. Until a heartbeat has answered there is none. What a
// subscription misses (before it is made, while Redis is away) is a hint
// lost, not a turn: the scripts hold every reservation to the key's hold
// themselves, and hear the rate they keep.
//
// want and heard are safe for concurrent use; sync and close belong to
// the owner's background goroutine, which reads in.
type announcements struct {
	rdb     redis.UniversalClient
	pattern string        // every key's channel of the limiter, for PSUBSCRIBE
	timeout time.Duration // a Cluster's node lookup, which may ask the Cluster
	mode    atomic.Int32  // the scripts' channels as the last heartbeat said: 0 not heard yet
	in      chan string   // the payloads heard, for the background goroutine
	kick    chan struct{} // a key's channel was wanted for the first time
	stop    chan struct{} // closed by close: the forwarders return

	mu     sync.Mutex
	wanted map[string]time.Time // guarded by mu: a key's channel, and when a request last used the key
	fresh  []string             // guarded by mu: channels wanted since the last sync

	// The background goroutine's alone:
	subMode int32
	checked time.Time           // the last full sync
	subs    map[string]*nodeSub // by node address ("" for a client that is not a Cluster's)
	on      map[string]string   // a channel subscribed to, and its node's address
	fwd     sync.WaitGroup      // the forwarders
}

// nodeSub is the subscription on one node: its channels, in sharded mode,
// or the pattern.
type nodeSub struct {
	ps    *redis.PubSub
	n     int         // its channels
	ended atomic.Bool // its messages' channel was closed (the client was)
}

const (
	modePlain   int32 = 1 // PUBLISH, PSUBSCRIBE
	modeSharded int32 = 2 // SPUBLISH, SSUBSCRIBE
)

// announceIdle is how long a key's channel stays subscribed to after its
// last use: the keys' own sweep interval (see keyed.SweepEvery).
const announceIdle = time.Minute

func newAnnouncements(rdb redis.UniversalClient, pattern string, timeout time.Duration) *announcements {
	return &announcements{
		rdb: rdb, pattern: pattern, timeout: timeout,
		in: make(chan string, 64), kick: make(chan struct{}, 1), stop: make(chan struct{}),
		wanted: map[string]time.Time{}, subs: map[string]*nodeSub{}, on: map[string]string{},
	}
}

// heard records what a heartbeat said of the scripts' channels.
func (a *announcements) heard(r beatReply) {
	m := modePlain
	if r.sharded {
		m = modeSharded
	}
	a.mode.Store(m)
}

// want records that a request used the key of channel at now.
func (a *announcements) want(channel string, now time.Time) {
	a.mu.Lock()
	_, had := a.wanted[channel]
	a.wanted[channel] = now
	if !had {
		a.fresh = append(a.fresh, channel)
	}
	a.mu.Unlock()
	if !had {
		select {
		case a.kick <- struct{}{}:
		default:
		}
	}
}

// sync brings the subscriptions in line with the mode and the keys in use
// at now: the channels wanted since the last sync, and, when full, every
// channel wanted, each on its key's node as the Cluster's client now
// knows it (after a failover or a slot's move), less those unused for
// announceIdle. A subscription whose client was closed is made again.
func (a *announcements) sync(full bool, now time.Time) {
	m := a.mode.Load()
	if m != a.subMode {
		a.closeSubs()
		a.subMode, full = m, true
	}
	for addr, s := range a.subs {
		if s.ended.Load() {
			a.drop(addr)
			full = true
		}
	}
	if full {
		a.checked = now
	}
	fresh, idle := a.take(full, now)
	switch m {
	case modePlain:
		if a.subs[""] == nil {
			a.add("", a.rdb.PSubscribe(context.Background(), a.pattern), 0)
		}
	case modeSharded:
		for _, ch := range idle {
			a.unsubscribe(ch)
		}
		for _, ch := range fresh {
			a.subscribe(ch)
		}
	}
}

// due reports whether a full sync is due at now, every after the last.
func (a *announcements) due(now time.Time, every time.Duration) bool {
	return now.Sub(a.checked) >= every
}

// take returns the channels to subscribe to (those wanted since the last
// sync; every one wanted, when full) and, when full, those unused for
// announceIdle, which it forgets.
func (a *announcements) take(full bool, now time.Time) (fresh, idle []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	fresh, a.fresh = a.fresh, nil
	if !full {
		return fresh, nil
	}
	fresh = fresh[:0]
	for ch, at := range a.wanted {
		if now.Sub(at) > announceIdle {
			delete(a.wanted, ch)
			idle = append(idle, ch)
		} else {
			fresh = append(fresh, ch)
		}
	}
	return fresh, idle
}

// subscribe subscribes to channel on its key's node, leaving the node it
// was subscribed on if that has changed. A lookup that fails leaves it
// for the next full sync.
func (a *announcements) subscribe(channel string) {
	c, addr, err := a.nodeOf(channel)
	if err != nil {
		return
	}
	if at, ok := a.on[channel]; ok {
		if at == addr {
			return
		}
		a.unsubscribe(channel)
	}
	if s := a.subs[addr]; s != nil {
		if s.ps.SSubscribe(context.Background(), channel) != nil {
			return
		}
		s.n++
	} else {
		a.add(addr, c.SSubscribe(context.Background(), channel), 1)
	}
	a.on[channel] = addr
}

// unsubscribe leaves channel; a node's subscription left with no channel
// is closed.
func (a *announcements) unsubscribe(channel string) {
	addr, ok := a.on[channel]
	if !ok {
		return
	}
	delete(a.on, channel)
	s := a.subs[addr]
	if s.n--; s.n <= 0 {
		a.drop(addr)
		return
	}
	_ = s.ps.SUnsubscribe(context.Background(), channel)
}

// nodeOf returns the client to subscribe to channel with and its node's
// address: a Cluster's node that serves the channel's slot, or the client
// itself ("").
func (a *announcements) nodeOf(channel string) (interface {
	SSubscribe(context.Context, ...string) *redis.PubSub
}, string, error) {
	cc, ok := a.rdb.(*redis.ClusterClient)
	if !ok {
		return a.rdb, "", nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	c, err := cc.MasterForKey(ctx, channel)
	if err != nil {
		return nil, "", err
	}
	return c, c.Options().Addr, nil
}

// add records ps, the subscription on node addr with n channels, and
// starts forwarding its messages.
func (a *announcements) add(addr string, ps *redis.PubSub, n int) {
	s := &nodeSub{ps: ps, n: n}
	a.subs[addr] = s
	msgs := ps.Channel()
	a.fwd.Add(1)
	go a.forward(s, msgs)
}

// forward passes the payloads of msgs to in until close, or until msgs is
// closed (its client was: the next sync subscribes again).
func (a *announcements) forward(s *nodeSub, msgs <-chan *redis.Message) {
	defer a.fwd.Done()
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				s.ended.Store(true)
				return
			}
			select {
			case a.in <- m.Payload:
			case <-a.stop:
				return
			}
		case <-a.stop:
			return
		}
	}
}

// drop closes the subscription on node addr and forgets its channels.
func (a *announcements) drop(addr string) {
	if s := a.subs[addr]; s != nil {
		_ = s.ps.Close()
		delete(a.subs, addr)
	}
	for ch, at := range a.on {
		if at == addr {
			delete(a.on, ch)
		}
	}
}

// closeSubs closes every subscription.
func (a *announcements) closeSubs() {
	for addr := range a.subs {
		a.drop(addr)
	}
}

// close ends the subscriptions and waits for the forwarders.
func (a *announcements) close() {
	close(a.stop)
	a.closeSubs()
	a.fwd.Wait()
}
