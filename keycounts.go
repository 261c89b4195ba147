package egress

import (
	"hash/maphash"
	"sync"
)

// keyCounts holds a small count per key for a Transport: the attempts it
// has handed to its base RoundTripper and that have no response yet (the
// requests a provider's "remaining" does not count yet, Signal.InFlight),
// or whether a key was last reported near its limit. A key is in the map
// only while its count is not 0, so idle keys cost nothing. The map is
// split in shards, each with its own lock, so that keys do not contend.
type keyCounts struct {
	seed   maphash.Seed
	shards [keyShards]struct {
		mu sync.Mutex
		n  map[string]int
		_  [40]byte // a shard to a cache line
	}
}

const keyShards = 32

func newKeyCounts() *keyCounts {
	s := &keyCounts{seed: maphash.MakeSeed()}
	for i := range s.shards {
		s.shards[i].n = make(map[string]int)
	}
	return s
}

// add adds d to key's count and returns the count before.
func (s *keyCounts) add(key string, d int) int {
	sh := &s.shards[maphash.String(s.seed, key)%keyShards]
	sh.mu.Lock()
	n := sh.n[key]
	set(sh.n, key, n+d)
	sh.mu.Unlock()
	return n
}

// swap sets key's count to v and returns the count before.
func (s *keyCounts) swap(key string, v int) int {
	sh := &s.shards[maphash.String(s.seed, key)%keyShards]
	sh.mu.Lock()
	n := sh.n[key]
	set(sh.n, key, v)
	sh.mu.Unlock()
	return n
}

func set(m map[string]int, key string, v int) {
	if v <= 0 {
		delete(m, key)
	} else {
		m[key] = v
	}
}
