// Package lua holds the Lua scripts that the shared limiters run on Redis.
// Each is one atomic decision on the server's clock; see each file's header
// for its keys, arguments and reply.
package lua

import _ "embed"

//go:embed rate.lua
var rate string

//go:embed reserve.lua
var reserve string

//go:embed learn.lua
var learn string

// Reserve admits a batch of requests on one key (token bucket or pacer), at
// the rate the key has learnt.
var Reserve = rate + reserve

// Learn applies an advertised limit or a throttling response to a key.
var Learn = rate + learn

//go:embed pause.lua
var pause string

// Pause holds a key for every instance and empties its bucket as of the
// pause's end.
var Pause = rate + pause

// Heartbeat records a live instance and counts the live ones.
//
//go:embed heartbeat.lua
var Heartbeat string
