// Package lua holds the Lua scripts that the shared limiters run on Redis.
// Each is one atomic decision on the server's clock; see each file's header
// for its keys, arguments and reply.
package lua

import _ "embed"

// Rate is the prelude of the scripts: the pure functions cubic and turn,
// the key's effective rate, and the server's time as now. Tests append a
// return statement to it to run the functions on given inputs.
//
//go:embed rate.lua
var Rate string

//go:embed reserve.lua
var reserve string

//go:embed control.lua
var control string

// Reserve admits a batch of requests on one key (token bucket or pacer), at
// the rate the key has learnt.
var Reserve = Rate + reserve

// Control applies what a response said to a key's controller: the hold,
// the shape of its quota, the advertised and discovered rate.
var Control = Rate + control

// Heartbeat records a live instance and counts the live ones.
//
//go:embed heartbeat.lua
var Heartbeat string

// Slots takes, renews and releases the in-flight leases of one key.
//
//go:embed slots.lua
var Slots string

// Limits admits, settles and teaches the limits of a SharedLimits: every
// limit of a request's key and its parents in one call.
//
//go:embed limits.lua
var Limits string
