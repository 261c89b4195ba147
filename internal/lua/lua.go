// Package lua holds the Lua scripts that the shared limiters run on Redis.
// Each is one atomic decision on the server's clock; see each file's header
// for its keys, arguments and reply. Every script begins with now.lua: its
// last argument is the time, "@" for the server's (TIME) or "@<us>" for a
// time a test gives (see internal/caller's Now). The scripts that restate
// the Go's arithmetic follow it with tune.lua, the Go's constants, and
// those that keep state in hashes with fields.lua, the names of the
// hashes' fields, written once in the Go (sharedfields.go); both generated
// (go generate). A script that restates a package's Go sits beside it in
// that package, which embeds it; this one composes them.
package lua

import (
	_ "embed"
	"regexp"
	"strings"

	"github.com/egress-go/egress/internal/control"
	"github.com/egress-go/egress/internal/fair"
	"github.com/egress-go/egress/internal/lease"
	"github.com/egress-go/egress/internal/member"
)

//go:embed now.lua
var now string

//go:embed publish.lua
var publish string

// prelude opens every script: the time of the decision (now.lua), and how
// it publishes the fleet's announcements (publish.lua).
var prelude = now + publish

//go:embed tune.lua
var tune string

//go:embed fields.lua
var fields string

// rate is internal/control's rate.lua, beside the Go it restates.
var rate = control.RateLua

// Rate is the prelude of the reserve and control scripts: now.lua,
// tune.lua, fields.lua, then rate.lua's pure functions (cubic, turn, the
// key's effective rate). Tests append a return statement to it to run the
// functions on given inputs, with the time as the one argument. The
// scripts a limiter runs have the tables inlined (see inline).
var Rate = prelude + tune + fields + rate

// inline writes each tune.<name> and field.<name> of script as its value
// in tune.lua and fields.lua, and leaves the tables out: the numbers and
// names stay written once, in the Go, and a call pays nothing to build
// the tables (3.7 µs of Redis's time a call, a tenth of a reservation's).
// A number is written in parentheses: "a -tune.x" must not become a
// comment. A name neither table has is left as it is
// (TestScriptsAreInlined fails on it).
func inline(script string) string {
	return tableRef.ReplaceAllStringFunc(script, func(ref string) string {
		table, name, _ := strings.Cut(ref, ".")
		v, ok := tableValues[table][name]
		if !ok {
			return ref
		}
		if table == "tune" {
			return "(" + v + ")"
		}
		return v
	})
}

// tableRef is a reference to an entry of tune.lua's or fields.lua's table.
var tableRef = regexp.MustCompile(`\b(tune|field)\.[A-Za-z_][A-Za-z0-9_]*`)

// tableValues holds the entries of tune.lua's and fields.lua's tables, by
// table and name: each a line "  name = value, -- what it is".
var tableValues = map[string]map[string]string{"tune": entries(tune), "field": entries(fields)}

func entries(table string) map[string]string {
	out := map[string]string{}
	for _, m := range tableEntry.FindAllStringSubmatch(table, -1) {
		out[m[1]] = m[2]
	}
	return out
}

var tableEntry = regexp.MustCompile(`(?m)^\s+([A-Za-z_][A-Za-z0-9_]*) = ([^,]+),`)

//go:embed reserve.lua
var reserve string

// Reserve admits a batch of requests on one key (token bucket or pacer), at
// the rate the key has learnt, in the fleet's priority order and tenants'
// shares (internal/fair's order.lua and shares.lua, the twins of its
// Order and Shares).
var Reserve = inline(prelude + rate + Fair + reserve)

//go:embed fairstate.lua
var fairstate string

// Fair is the prelude's part that the reservation scripts share: the
// fleet's priority order and tenants' shares (internal/fair's order.lua
// and shares.lua, the twins of its Order and Shares), and a key's state of
// them in Redis (fairstate.lua). It follows tune.lua and fields.lua.
var Fair = fair.OrderLua + fair.SharesLua + fairstate

// Control applies what a response said to a key's controller: the hold,
// the shape of its quota, the advertised and discovered rate.
var Control = inline(prelude + rate + control.Lua)

// heartbeat is internal/member's heartbeat.lua, beside the Go that beats.
var heartbeat = member.Lua

// Heartbeat records a live instance and counts the live ones; it says,
// too, whether the scripts publish to shard channels (publish.lua).
var Heartbeat = prelude + heartbeat

// slots is internal/lease's slots.lua, beside the Go it restates.
var slots = lease.Lua

// Slots takes, renews and releases the in-flight leases of one key.
var Slots = prelude + slots

//go:embed limits.lua
var limits string

// Limits admits, settles and teaches the limits of a SharedLimits: every
// limit of a request's key and its parents in one call.
var Limits = inline(prelude + Fair + limits)
