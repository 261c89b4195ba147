package egress

import (
	"fmt"
	"time"

	"github.com/egress-go/egress/internal/argv"
)

// limits.lua's ARGV, a type a part: its head (limitsHead: the operation,
// L and a group a limit), then the operation's own arguments, whose
// indices count from o = 2+4L, the last of the limits' values. A field's
// tag is its index as the script's header writes it: i is a limit's (1 to
// L) and r the index before a request's group.

// limitsHead is limits.lua's ARGV[1] and ARGV[2], then a group a limit.
type limitsHead struct {
	op     string        `argv:"1"` // reserve, settle, learn or window
	count  int           `argv:"2"` // L, the number of limits
	limits []limitsLimit // limit i's from ARGV[4i-1]
}

// limitsLimit is limit i's group of limits.lua's ARGV, the same for every
// call of a SharedLimits (see limitGroup).
type limitsLimit struct {
	kind   int     `argv:"4i-1"` // 0 a bucket, 1 a window
	n      int     `argv:"4i"`   // a bucket's burst, a window's quota
	span   float64 `argv:"4i+1"` // us: a bucket's interval per unit, a window's length with its margin
	margin int64   `argv:"4i+2"` // us: the refill a bucket keeps in reserve; 0 for a window
}

// limitGroup returns lim's group of limits.lua's ARGV, margin being the
// limits' (added to a window's length, kept in reserve by a bucket).
func limitGroup(lim *Limit, margin time.Duration) limitsLimit {
	if lim.window {
		return limitsLimit{kind: 1, n: lim.n, span: float64(argv.Micros(lim.w + margin))}
	}
	return limitsLimit{n: lim.n, span: 1e6 * lim.rate.per.Seconds() / lim.rate.n, margin: argv.Micros(margin)}
}

// limitsReserve is a reserve's ARGV after the limits' groups; a group a
// request follows it (limitsRequest).
type limitsReserve struct {
	horizon int64 `argv:"o+1"` // us: the fleet's priority order's (fleetHorizon); 0 when no request is ordered
}

// limitsRequest is one request's group of a reserve, from ARGV[r+1]: its
// costs and max wait, then its place in the fleet's priority order and
// tenants' shares (see fleetTurn), sent only with a horizon.
type limitsRequest struct {
	limitsCosts
	level  int     `argv:"r+L+2"` // -1 for none
	share  float64 `argv:"r+L+3"` // 0: no order, no shares
	tenant string  `argv:"r+L+4"`
	weight float64 `argv:"r+L+5"`
	work   float64 `argv:"r+L+6"` // us of the limit it takes the most of (limitsWork)
}

// limitsCosts is a request's group of a reserve without a horizon: its
// cost in each limit and its max wait.
type limitsCosts struct {
	costs   []int `argv:"r+i"`   // limit i's, in its dimension
	maxWait int64 `argv:"r+L+1"` // us; -1 for none
}

// limitsSettle is a settle's ARGV after the limits' groups: a grant's
// turn, its cost granted and actual cost in each limit, and where to tell
// the turns a replan moves.
type limitsSettle struct {
	turn    int64           `argv:"o+1"` // us of the server's clock
	costs   []limitsSettled // limit i's
	replan  int             `argv:"o+2L+2"` // 1: every limit a window, none a parent's
	channel string          `argv:"o+2L+3"`
	id      string          `argv:"o+2L+4"` // the request key's id
}

// limitsSettled is limit i's pair of a settle.
type limitsSettled struct {
	from int `argv:"o+2i"`   // the cost granted
	to   int `argv:"o+2i+1"` // the actual cost, at most n
}

// limitsLearn is a learn's ARGV after the limits' groups: a hold, where
// to tell it, and a cap a limit.
type limitsLearn struct {
	hold    int64       `argv:"o+1"` // us from now; 0 for none
	channel string      `argv:"o+2"`
	id      string      `argv:"o+3"` // the request key's id
	caps    []limitsCap // limit i's
}

// limitsCap is what a response said of limit i's dimension, for a learn.
type limitsCap struct {
	keep   float64 `argv:"o+3i+1"` // the units the provider said remain; -1 for nothing said
	reset  int64   `argv:"o+3i+2"` // us; -1 for none
	bucket int     `argv:"o+3i+3"` // 1: the reset means "until the bucket is full"
}

// limitsWindow is a window's ARGV after the limits' groups.
type limitsWindow struct {
	limit int `argv:"o+1"` // a window limit, 1-based
	most  int `argv:"o+2"` // the most grants to return
}

// limitsArgs returns limits.lua's head for op and limits, with room for
// more arguments and the time.
func limitsArgs(op string, limits []limitsLimit, more int) []any {
	return argv.Append(make([]any, 0, 2+4*len(limits)+more+1), &limitsHead{op: op, count: len(limits), limits: limits})
}

// limitsReserveArgs returns limits.lua's arguments to reserve turns for
// reqs, in order: with a horizon (above 0) each request's whole group,
// without its costs and max wait alone.
func limitsReserveArgs(limits []limitsLimit, horizon int64, reqs []limitsRequest) []any {
	group := len(limits) + 1
	if horizon > 0 {
		group += 5
	}
	args := argv.Append(limitsArgs("reserve", limits, 1+group*len(reqs)), &limitsReserve{horizon: horizon})
	for i := range reqs {
		if horizon > 0 {
			args = argv.Append(args, &reqs[i])
		} else {
			args = argv.Append(args, &reqs[i].limitsCosts)
		}
	}
	return args
}

// limitsSettleArgs returns limits.lua's arguments to settle a grant.
func limitsSettleArgs(limits []limitsLimit, s *limitsSettle) []any {
	return argv.Append(limitsArgs("settle", limits, 4+2*len(s.costs)), s)
}

// limitsLearnArgs returns limits.lua's arguments to learn a hold and caps.
func limitsLearnArgs(limits []limitsLimit, l *limitsLearn) []any {
	return argv.Append(limitsArgs("learn", limits, 3+3*len(l.caps)), l)
}

// limitsWindowArgs returns limits.lua's arguments to read window limit i
// (1-based), unless it holds more than most grants.
func limitsWindowArgs(limits []limitsLimit, i, most int) []any {
	return argv.Append(limitsArgs("window", limits, 2), &limitsWindow{limit: i, most: most})
}

// limitsReserved is limits.lua's reply to a reserve: the server's now,
// then a decision a request.
type limitsReserved struct {
	now      int64         // us of the server's clock
	requests []limitsReply // in the call's order
}

// parseReserved checks and reads limits.lua's reply to a reserve of n
// requests, received at at: the server's now, then a (code, wait, turn or
// binding limit, grant id) quadruple a request (code 0 admitted, 1
// refused, 2 held back by the fleet's order, to come back after wait). A
// malformed reply is an error, never a panic.
func parseReserved(reply any, n int, at time.Time) (limitsReserved, error) {
	vals, ok := reply.([]any)
	if !ok || len(vals) != 1+4*n {
		return limitsReserved{}, fmt.Errorf("malformed reply %v: want %d values", reply, 1+4*n)
	}
	now, ok := vals[0].(int64)
	if !ok {
		return limitsReserved{}, fmt.Errorf("malformed reply %v: its now", reply)
	}
	out := limitsReserved{now: now, requests: make([]limitsReply, n)}
	for i := range out.requests {
		code, ok1 := vals[1+4*i].(int64)
		wait, ok2 := vals[2+4*i].(int64)
		third, ok3 := vals[3+4*i].(int64)
		gid, ok4 := vals[4+4*i].(int64)
		if !ok1 || !ok2 || !ok3 || !ok4 || code < 0 || code > 2 || wait < 0 {
			return limitsReserved{}, fmt.Errorf("malformed reply %v at request %d", reply, i)
		}
		r := limitsReply{refused: code == 1, held: code == 2, wait: time.Duration(wait) * time.Microsecond, at: at}
		switch {
		case r.held:
		case r.refused:
			r.binding = int(third)
		default:
			r.turn, r.gid = third, gid
		}
		out.requests[i] = r
	}
	return out, nil
}

// limitsWindowed is limits.lua's reply to a window: the server's now,
// then the window's grants in the order of their turns; none when it
// holds none, or more than the most asked for.
type limitsWindowed struct {
	now    int64 // us of the server's clock
	grants []windowGrant
}

// windowGrant is a grant still in a window.
type windowGrant struct {
	turn int64 // us of the server's clock
	cost int
}

// parseWindowed checks and reads limits.lua's reply to a window: the
// server's now, then a (turn, cost) pair a grant, none negative. A
// malformed reply is an error, never a panic.
func parseWindowed(reply []int64) (limitsWindowed, error) {
	if len(reply)%2 != 1 || reply[0] < 0 {
		return limitsWindowed{}, fmt.Errorf("malformed window reply %v", reply)
	}
	out := limitsWindowed{now: reply[0], grants: make([]windowGrant, 0, len(reply)/2)}
	for j := 1; j < len(reply); j += 2 {
		if reply[j] < 0 || reply[j+1] < 0 {
			return limitsWindowed{}, fmt.Errorf("malformed window reply %v at grant %d", reply, j/2)
		}
		out.grants = append(out.grants, windowGrant{turn: reply[j], cost: int(reply[j+1])})
	}
	return out, nil
}
