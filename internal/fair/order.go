package fair

import _ "embed"

// Order is the fleet's side of the priorities of one key: what a shared
// limiter's script keeps in Redis so that the order holds across
// instances, where no instance sees the others' waiters. Each instance's
// own waiters are ordered by its Queue; what Order decides is whether a
// request that its instance sends to the fleet's bucket takes a turn now.
//
// A turn once given is not taken back (its waiter, in another instance,
// may be sending). So a request of a level below the highest takes a turn
// only within a horizon of now: the turns it could take further ahead are
// left for a higher request of any instance that comes meanwhile, which
// then waits behind at most the horizon of lower turns (and the turn
// being sent). A request held back comes back when its turn would be
// within the horizon (Later, and when). Its level is then marked waiting;
// while it is, every turn given to another level, or to it on its
// credit, earns it share of the turn's work, and a request of the level
// whose credit covers its work takes its turn however far ahead it is
// (ByCredit). So under a flood of higher requests a lower level keeps
// share of the turns, as in a Queue. A level's mark ends, and its credit
// with it, a horizon after the furthest turn it was held back from or took
// on its credit (its next request comes when that one is sent): credit is
// not banked by a level that stopped waiting.
//
// Times and work are in microseconds (of the clock and of the limit: a
// request's work is its cost over the rate), as float64: the script
// restates Decide in Lua (order.lua, embedded as OrderLua) on the same
// doubles, and the two are held to agree exactly on one fake clock.
type Order struct {
	Credit [Held]float64 // the work each level below the highest has earned
	Until  [Held]float64 // each such level has a waiter held back until then; 0 for none
}

// Held is the number of levels an Order holds to the horizon: every level
// but the highest of the three priorities.
const Held = 2

// A Verdict is Order.Decide's answer for one request.
type Verdict int

// The verdicts.
const (
	Go       Verdict = iota // take the turn: the highest level, or one within the horizon
	ByCredit                // take the turn, far as it is: the level's credit covers it
	Later                   // take nothing; come back at the time Decide returns
)

// OrderLua is order.lua: Decide in Lua, for the shared limiters' scripts.
//
//go:embed order.lua
var OrderLua string

// Decide returns the verdict for a request of level lv (0 the lowest; any
// level outside [0, Held) is not held back) and work, whose turn would
// come at at, at now, given the horizon and the share of a level held
// back, and updates o; for Later, it also returns when to come back. A
// share of 0 turns the order off: every request goes.
func (o *Order) Decide(lv int, work, at, now, horizon, share float64) (Verdict, float64) {
	for l := range o.Until {
		if o.Until[l] <= now {
			o.Credit[l], o.Until[l] = 0, 0 // nobody held back: no credit kept
		}
	}
	if share <= 0 {
		return Go, 0
	}
	v := Go
	if lv >= 0 && lv < Held && at > now+horizon {
		if o.Until[lv] == 0 || o.Credit[lv]+1 < work {
			// (1 µs of slack: the sum of shares that made the credit
			// may round below a work it equals.)
			o.Until[lv] = max(o.Until[lv], at+horizon)
			return Later, at - horizon
		}
		v = ByCredit
		o.Credit[lv] = max(o.Credit[lv]-work, 0)
		o.Until[lv] = max(o.Until[lv], at+horizon)
	}
	for l := range o.Until {
		if o.Until[l] != 0 && (l != lv || v == ByCredit) {
			o.Credit[l] += share * work
		}
	}
	return v, 0
}
