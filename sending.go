package egress

import (
	"hash/maphash"
	"sync"
)

// sending counts, per key, the attempts a Transport has handed to its base
// RoundTripper and that have no response yet: the requests a provider's
// "remaining" does not count yet (Signal.InFlight). A key is in the map
// only while it has such attempts, so idle keys cost nothing. The map is
// split in shards, each with its own lock, so that keys do not contend.
type sending struct {
	seed   maphash.Seed
	shards [sendingShards]struct {
		mu sync.Mutex
		n  map[string]int
		_  [40]byte // a shard to a cache line
	}
}

const sendingShards = 32

func newSending() *sending {
	s := &sending{seed: maphash.MakeSeed()}
	for i := range s.shards {
		s.shards[i].n = make(map[string]int)
	}
	return s
}

// add adds d to key's count and returns the count before.
func (s *sending) add(key string, d int) int {
	sh := &s.shards[maphash.String(s.seed, key)%sendingShards]
	sh.mu.Lock()
	n := sh.n[key]
	if n+d <= 0 {
		delete(sh.n, key)
	} else {
		sh.n[key] = n + d
	}
	sh.mu.Unlock()
	return n
}
