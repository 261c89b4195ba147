// Package lease is the arithmetic of a key's in-flight leases: how many
// requests of a key are out at once, each holding a lease that ends at a
// time (a request that never answers gives its slot back then). The
// root's InFlightLimit keeps a Set a key; slots.lua, beside it (embedded
// as Lua), is the same arithmetic on the Redis server's clock for the
// fleet's SharedInFlightLimit, which internal/lua composes; the script's
// arguments and reply are this package's too (script.go). It reads no
// clock, keeps no key and imports nothing of the module but internal/argv.
package lease

import (
	_ "embed"
	"time"
)

// Lua is slots.lua: Set's arithmetic for the fleet, with its adopt and
// renew (leases taken while Redis was away, and kept alive).
//
//go:embed slots.lua
var Lua string

// Set is one key's leases, held in no order: the arithmetic that
// slots.lua restates for the fleet (the root's TestLeaseSteps runs the two
// on one fake clock). A lease ends at its time: at that instant it is no longer
// held.
type Set []held

type held struct {
	id    uint64
	until time.Time
}

// Acquire takes lease id, to end life after now, when fewer than n leases
// are held once those ended by now are dropped; otherwise it returns how
// long until the earliest one ends (slots.lua's acquire).
func (ls *Set) Acquire(id uint64, n int, now time.Time, life time.Duration) (taken bool, wait time.Duration) {
	ls.Expire(now)
	if len(*ls) < n {
		*ls = append(*ls, held{id: id, until: now.Add(life)})
		return true, 0
	}
	return false, max(0, ls.Next().Sub(now))
}

// Expire drops the leases that ended by now.
func (ls *Set) Expire(now time.Time) {
	kept := (*ls)[:0]
	for _, x := range *ls {
		if x.until.After(now) {
			kept = append(kept, x)
		}
	}
	clear((*ls)[len(kept):])
	*ls = kept
}

// Next returns when the earliest lease ends; zero when none is held.
func (ls Set) Next() time.Time {
	var t time.Time
	for _, x := range ls {
		if t.IsZero() || x.until.Before(t) {
			t = x.until
		}
	}
	return t
}

// Release drops lease id, and reports whether it was held (slots.lua's
// release).
func (ls *Set) Release(id uint64) bool {
	for i, x := range *ls {
		if x.id == id {
			(*ls)[i] = (*ls)[len(*ls)-1]
			*ls = (*ls)[:len(*ls)-1]
			return true
		}
	}
	return false
}
