// Package window owns the exact log of a sliding window's grants: when a
// grant of a cost next fits under a limit of n units in any window of
// length W, and the log's upkeep as grants are added, charged after the
// fact, resized, given back and left behind. A grant is a turn (a time)
// and a cost; a turn may be in the future (a waiter's). It owns, too, what
// a window learns of how its grants settle, and the plan of a request's
// turn on the settlements expected (plan.go).
//
// It knows nothing of keys, waiters, clocks, rates or Redis: egress's
// WindowLimit and Limits keep one Log a key and a limit, under their own
// locks. internal/lua/limits.lua keeps the same log in a Redis sorted set
// for SharedLimits; TestSharedLimitsAgreesWithLimits holds the two to the
// same turns, to the microsecond.
package window

import (
	"slices"
	"time"
)

// Log is a key's grants still in the window, in time order (the last
// ones may be in the future: turns given to waiters). The zero value with
// W set is an empty log. It is not safe for concurrent use: its owner
// guards it.
type Log struct {
	At    []time.Time
	Cost  []int32
	Sum   int           // the costs in the log
	First int           // At[:First] are gone (trimmed lazily)
	W     time.Duration // the window, to tell when the log is at rest
}

// AtRest reports whether the log holds no grant still in the window at
// now: its owner may drop it.
func (g *Log) AtRest(now time.Time) bool {
	return g.First == len(g.At) || !g.At[len(g.At)-1].Add(g.W).After(now)
}

// Earliest returns the first turn, at or after from and after every turn
// given before, at which the window ending there holds at most n − cost.
func (g *Log) Earliest(from time.Time, cost, n int) time.Time {
	at := from
	if last := len(g.At) - 1; last >= g.First && g.At[last].After(at) {
		at = g.At[last] // after every turn given before
	}
	// Entries in (at−w, at] count. Drop from the count those out of that
	// window, then the oldest until cost fits, and go when the last one
	// dropped leaves the window.
	sum, i := g.Sum, g.First
	for ; i < len(g.At) && !g.At[i].Add(g.W).After(at); i++ {
		sum -= int(g.Cost[i])
	}
	j := i
	for ; sum+cost > n; j++ {
		sum -= int(g.Cost[j])
	}
	if j > i {
		at = g.At[j-1].Add(g.W)
	}
	return at
}

// Add records a grant of cost at turn at, which must be at or after every
// turn given before (Earliest's).
func (g *Log) Add(at time.Time, cost int) {
	g.At = append(g.At, at)
	g.Cost = append(g.Cost, int32(cost))
	g.Sum += cost
}

// Staying returns the costs of the grants still in the window at t.
func (g *Log) Staying(t time.Time) int {
	n := 0
	for i := g.First; i < len(g.At); i++ {
		if g.At[i].Add(g.W).After(t) {
			n += int(g.Cost[i])
		}
	}
	return n
}

// Insert records a grant of cost at turn at, in time order (a cost
// charged after the fact, at a turn before later ones).
func (g *Log) Insert(at time.Time, cost int) {
	i := len(g.At)
	for i > g.First && g.At[i-1].After(at) {
		i--
	}
	g.At = append(g.At, time.Time{})
	g.Cost = append(g.Cost, 0)
	copy(g.At[i+1:], g.At[i:])
	copy(g.Cost[i+1:], g.Cost[i:])
	g.At[i], g.Cost[i] = at, int32(cost)
	g.Sum += cost
}

// Adjust changes the cost of the grant of cost from at turn at to cost to
// (a settlement; 0 gives the turn back), and reports whether it was still
// in the log. The turns after it stay where they are.
func (g *Log) Adjust(at time.Time, from, to int) bool {
	i := g.Find(at, from)
	if i < 0 {
		return false
	}
	g.Sum += to - from
	g.Cost[i] = int32(to) // kept in place, so that the log stays in time order
	return true
}

// Find returns the index of the last grant of cost at turn at, or -1.
func (g *Log) Find(at time.Time, cost int) int {
	for i := len(g.At) - 1; i >= g.First; i-- {
		if g.At[i].Equal(at) && int(g.Cost[i]) == cost {
			return i
		}
		if g.At[i].Before(at) {
			return -1
		}
	}
	return -1
}

// Remove takes the grant of cost at turn at out of the log, if it is in it.
func (g *Log) Remove(at time.Time, cost int) {
	if i := g.Find(at, cost); i >= 0 {
		g.At = slices.Delete(g.At, i, i+1)
		g.Cost = slices.Delete(g.Cost, i, i+1)
		g.Sum -= cost
	}
}

// Trim drops the grants that left the window by now, and compacts the log
// when most of it is gone.
func (g *Log) Trim(now time.Time) {
	for g.First < len(g.At) && !g.At[g.First].Add(g.W).After(now) {
		g.Sum -= int(g.Cost[g.First])
		g.First++
	}
	if g.First > 32 && g.First*2 > len(g.At) {
		n := copy(g.At, g.At[g.First:])
		copy(g.Cost, g.Cost[g.First:])
		g.At, g.Cost, g.First = g.At[:n], g.Cost[:n], 0
	}
}
