package egress

import (
	"time"

	"github.com/egress-go/egress/internal/argv"
)

// The arguments of the shared limiters' scripts, one type a script: its
// fields are the script's ARGV, in order, each tagged with its index in
// the script's header (internal/lua), and internal/argv encodes them. The time, the
// last argument of every script, is caller.Run's (see caller.Now).
// TestScriptArgsMatchHeaders holds each type to its script's header.

// controlArgv is control.lua's ARGV: what a response said, and how the
// key's controller learns.
type controlArgv struct {
	configured float64 `argv:"1"` // units per second
	discover   int     `argv:"2"` // 1: discovery on
	c          float64 `argv:"3"`
	floor      float64 `argv:"4"`
	beta       float64 `argv:"5"`
	advertised float64 `argv:"6"` // units per second; 0 for none
	advTTL     int64   `argv:"7"` // us
	exhausted  int     `argv:"8"`
	throttled  int     `argv:"9"`
	accepted   int     `argv:"10"`
	ago        int64   `argv:"11"` // us since the request was sent; -1 unknown
	reset      int64   `argv:"12"` // us; -1 for none
	zero       int     `argv:"13"` // 1: nothing left, the requests in flight counted
	retryAfter int64   `argv:"14"` // us; -1 for none
	estimate   float64 `argv:"15"` // units per second; 0 for none
	usable     float64 `argv:"16"` // the usable burst; 0 for a pacer
	probeHold  int64   `argv:"17"` // us
	channel    string  `argv:"18"`
	id         string  `argv:"19"`
	kind       int     `argv:"20"` // ResetKind
	other      int     `argv:"21"` // 1: not about the quota (a storm's)
	bare       int     `argv:"22"` // 1: no count at all
	stormTTL   int64   `argv:"23"` // us
	remaining  float64 `argv:"24"` // -1 for none
	limit      float64 `argv:"25"` // -1 for none
	unit       int64   `argv:"26"` // us; 0 for none
	inFlight   float64 `argv:"27"`
	budget     int     `argv:"28"` // 1: the count sets the key's budget
	probeGap   int64   `argv:"29"` // us
	probes     int     `argv:"30"`
	sign       int     `argv:"31"` // 1: a sign of a storm
	long       int     `argv:"32"` // 1: a long hold (control.LongHold)
}

// reserveArgv is reserve.lua's fixed ARGV; a group a request follows it
// (reserveRequest).
type reserveArgv struct {
	configured float64 `argv:"1"` // units per second
	usable     float64 `argv:"2"` // the usable burst; 0 for a pacer
	depth      int     `argv:"3"` // -1 for none
	discover   int     `argv:"4"`
	c          float64 `argv:"5"`
	floor      float64 `argv:"6"`
	budgetArgv
	probeHold int64   `argv:"15"` // us
	channel   string  `argv:"16"`
	id        string  `argv:"17"`
	read      int64   `argv:"18"` // us since the report was read; -1 for none
	horizon   int64   `argv:"19"` // us: the fleet's priority order's (fleetHorizon); 0 when no request is ordered
	most      float64 `argv:"20"` // the most the bucket holds as of the call (usableAt); 0 for a pacer
}

// budgetArgv is a budget report, as reserve.lua reads it (ARGV[7] to
// ARGV[14]): see budgetArgs.
type budgetArgv struct {
	remaining  float64 `argv:"7"` // -1 for none
	reset      int64   `argv:"8"` // us
	unit       int64   `argv:"9"` // us
	ago        int64   `argv:"10"`
	inFlight   float64 `argv:"11"`
	kind       int     `argv:"12"`
	limit      float64 `argv:"13"`
	resolution int64   `argv:"14"` // us
}

// reserveRequest is one request's group of reserve.lua's ARGV: its cost,
// its max wait (us; -1 for none), and its place in the fleet's priority
// order and tenants' shares (see fleetTurn).
type reserveRequest struct {
	reservePair
	level  int     `argv:"23"` // -1 for none
	share  float64 `argv:"24"` // 0: no order, no shares
	tenant string  `argv:"25"`
	weight float64 `argv:"26"`
}

// reservePair is a request's group of reserve.lua's ARGV when no request
// of the call is ordered (horizon 0): its cost and max wait.
type reservePair struct {
	cost    int   `argv:"21"`
	maxWait int64 `argv:"22"`
}

// maxWaitArg is a request's max wait from now until limit, as the scripts
// read it: us, at least 0; -1 for none (a zero limit).
func maxWaitArg(limit, now time.Time) int64 {
	if limit.IsZero() {
		return -1
	}
	return max(argv.Micros(limit.Sub(now)), 0)
}
