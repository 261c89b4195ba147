// Package announce owns an instance's subscriptions to what its fleet
// announces through Redis pub/sub: which channels it listens to, with
// which command, on which node of a Cluster, and for how long. It knows
// nothing of what the messages say (holds, moved turns, released slots:
// its owner reads the payloads), nor of keys beyond their channels' names,
// and it sends no command but its subscriptions' own; the scripts that
// publish are the shared limiters' (internal/lua/publish.lua).
package announce

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Subs is an instance's subscriptions to what its fleet announces: a
// shared limiter's holds and moved turns, a shared in-flight limit's
// released slots. Each key has its channel, which carries the
// key's hash tag, and the script that changes the key publishes there
// (internal/lua/publish.lua):
//
//   - on Redis 7 and later, a shard channel (SPUBLISH). A Redis Cluster
//     carries the message within the shard that serves the key's slot,
//     not to every node, and an instance subscribes (SSUBSCRIBE) to the
//     channels of the keys it uses, each on its key's node, while it uses
//     them: from a key's first use (Want) until it has gone unused for
//     Idle;
//   - before 7, PUBLISH, and an instance subscribes to all of the
//     limiter's channels with one pattern (PSUBSCRIBE).
//
// Each heartbeat's reply says which (Heard), and the subscriptions
// follow it. Until a heartbeat has answered there is none. What a
// subscription misses (before it is made, while Redis is away) is a hint
// lost, not a turn: the scripts hold every reservation to the key's hold
// themselves, and hear the rate they keep.
//
// Want and Heard are safe for concurrent use; Sync, Due and Close belong
// to the owner's background goroutine, which reads In and Kicked.
type Subs struct {
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

// Idle is how long a key's channel stays subscribed to after its last
// use: the limiters' own sweep interval for their keys' state.
const Idle = time.Minute

// New returns the subscriptions of an instance whose scripts publish on
// rdb: pattern matches every channel of its limiter (for PSUBSCRIBE), and
// timeout bounds a Cluster's lookup of a channel's node.
func New(rdb redis.UniversalClient, pattern string, timeout time.Duration) *Subs {
	return &Subs{
		rdb: rdb, pattern: pattern, timeout: timeout,
		in: make(chan string, 64), kick: make(chan struct{}, 1), stop: make(chan struct{}),
		wanted: map[string]time.Time{}, subs: map[string]*nodeSub{}, on: map[string]string{},
	}
}

// In is the payloads heard, in the order each subscription heard them.
func (a *Subs) In() <-chan string { return a.in }

// Kicked is signalled when a channel is wanted for the first time: Sync
// (not full) subscribes to it.
func (a *Subs) Kicked() <-chan struct{} { return a.kick }

// Heard records what a heartbeat said of the scripts' channels: shard
// channels (SPUBLISH) when sharded.
func (a *Subs) Heard(sharded bool) {
	m := modePlain
	if sharded {
		m = modeSharded
	}
	a.mode.Store(m)
}

// Want records that a request used the key of channel at now.
func (a *Subs) Want(channel string, now time.Time) {
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

// Sync brings the subscriptions in line with the mode and the keys in use
// at now: the channels wanted since the last sync, and, when full, every
// channel wanted, each on its key's node as the Cluster's client now
// knows it (after a failover or a slot's move), less those unused for
// Idle. A subscription whose client was closed is made again.
func (a *Subs) Sync(full bool, now time.Time) {
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

// Due reports whether a full Sync is due at now, every after the last.
func (a *Subs) Due(now time.Time, every time.Duration) bool {
	return now.Sub(a.checked) >= every
}

// take returns the channels to subscribe to (those wanted since the last
// sync; every one wanted, when full) and, when full, those unused for
// Idle, which it forgets.
func (a *Subs) take(full bool, now time.Time) (fresh, idle []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	fresh, a.fresh = a.fresh, nil
	if !full {
		return fresh, nil
	}
	fresh = fresh[:0]
	for ch, at := range a.wanted {
		if now.Sub(at) > Idle {
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
func (a *Subs) subscribe(channel string) {
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
func (a *Subs) unsubscribe(channel string) {
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
func (a *Subs) nodeOf(channel string) (interface {
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
func (a *Subs) add(addr string, ps *redis.PubSub, n int) {
	s := &nodeSub{ps: ps, n: n}
	a.subs[addr] = s
	msgs := ps.Channel()
	a.fwd.Add(1)
	go a.forward(s, msgs)
}

// forward passes the payloads of msgs to in until close, or until msgs is
// closed (its client was: the next sync subscribes again).
func (a *Subs) forward(s *nodeSub, msgs <-chan *redis.Message) {
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
func (a *Subs) drop(addr string) {
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
func (a *Subs) closeSubs() {
	for addr := range a.subs {
		a.drop(addr)
	}
}

// Close ends the subscriptions and waits for the forwarders.
func (a *Subs) Close() {
	close(a.stop)
	a.closeSubs()
	a.fwd.Wait()
}
