// Package lua holds the Lua scripts that the shared limiters run on Redis.
// Each is one atomic decision on the server's clock; see each file's header
// for its keys, arguments and reply.
package lua

import _ "embed"

// Reserve admits a batch of requests on one key (token bucket or pacer).
//
//go:embed reserve.lua
var Reserve string

// Pause holds a key for every instance.
//
//go:embed pause.lua
var Pause string

// Heartbeat records a live instance and counts the live ones.
//
//go:embed heartbeat.lua
var Heartbeat string
