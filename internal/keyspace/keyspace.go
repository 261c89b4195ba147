// Package keyspace names what the shared limiters keep in Redis: a key's
// state is under egress:{<limiter's name>:<key id>}:<part>, so that the
// keys one decision touches share a hash tag, hence a Redis Cluster slot
// (a script may touch only keys of one slot), while different keys spread
// over the Cluster; a key's channel is in the same slot, so that a shard
// channel carries its announcements within the shard that serves it. A
// limiter's own keys (its members set) are under egress:{<limiter's
// name>}:<part>. It knows nothing else: the parts are its callers'.
package keyspace

import (
	"crypto/sha256"
	"encoding/hex"
)

// ID names a caller's key in Redis: a hash, so that no key can reach
// outside its own namespace or collide with another limiter's keys.
func ID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:16])
}

// Tag is the prefix of key id's names under the limiter name: a part
// follows it.
func Tag(name, id string) string { return "egress:{" + name + ":" + id + "}:" }

// Own is the prefix of the limiter name's own keys: a part follows it.
func Own(name string) string { return "egress:{" + name + "}:" }

// Pattern matches part of every key of the limiter name (PSUBSCRIBE).
func Pattern(name, part string) string { return "egress:{" + name + ":*}:" + part }
