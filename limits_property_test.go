package egress

// Property tests of Limits: thousands of random schedules (arrivals on
// several keys, costs in several dimensions, budgets, cancellations and
// settlements) driven synchronously on a fake clock, never sleeping, each
// checked against what the Limits doc promises:
//
//   - each limit's bound, per key (or parent key), over every window or
//     interval of turns, with the slack the settlement allows;
//   - all or nothing: a refused request changes no limit, a granted one
//     takes from every limit of a dimension it costs;
//   - a dimension a request costs 0 in is left alone.
//
// Schedule i of a subtest is drawn from the PCG stream (seed+subtest, i), so
// a failure names the seed, the schedule and the step, and prints the whole
// schedule. Set EGRESS_PROPERTY_SEED to run another seed.

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/keyed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// limSchedules is the number of schedules of each subtest: 10 configurations
// × 2 modes × 500 = 10,000 in all.
const limSchedules = 500

// limConfig is one configuration of the table: a set of limits, drawn
// anew for each schedule, and the keys the requests use.
type limConfig struct {
	name   string
	keys   []string
	limits func(rng *rand.Rand) []Limit
}

func limConfigs() []limConfig {
	routes := []string{"h/a", "h/b", "h/c", "g/a"}
	secOrMin := func(rng *rand.Rand) time.Duration {
		return []time.Duration{time.Second, 7 * time.Second, time.Minute}[rng.IntN(3)]
	}
	perSec := func(rng *rand.Rand, lo, hi float64) Rate { return PerSecond(lo + rng.Float64()*(hi-lo)) }
	return []limConfig{
		{"bucket", []string{"a", "b"}, func(rng *rand.Rand) []Limit {
			return []Limit{BucketOf(Requests, perSec(rng, 0.5, 50), 1+rng.IntN(8))}
		}},
		{"window", []string{"a", "b"}, func(rng *rand.Rand) []Limit {
			return []Limit{WindowOf(Requests, 1+rng.IntN(10), secOrMin(rng))}
		}},
		{"requests and tokens buckets", []string{"a", "b"}, func(rng *rand.Rand) []Limit {
			return []Limit{
				BucketOf(Requests, perSec(rng, 1, 20), 1+rng.IntN(5)),
				BucketOf(Tokens, perSec(rng, 50, 2000), 100+rng.IntN(4000)),
			}
		}},
		{"requests and tokens windows", []string{"a", "b"}, func(rng *rand.Rand) []Limit {
			return []Limit{
				WindowOf(Requests, 2+rng.IntN(20), time.Minute),
				WindowOf(Tokens, 500+rng.IntN(5000), time.Minute),
			}
		}},
		{"per second and per minute", []string{"a"}, func(rng *rand.Rand) []Limit {
			n := 1 + rng.IntN(6)
			return []Limit{
				WindowOf(Requests, n, time.Second),
				WindowOf(Requests, n+rng.IntN(20*n), time.Minute),
			}
		}},
		{"tokens bucket and per-minute window", []string{"a", "b"}, func(rng *rand.Rand) []Limit {
			return []Limit{
				BucketOf(Tokens, perSec(rng, 20, 500), 200+rng.IntN(2000)),
				WindowOf(Tokens, 1000+rng.IntN(10000), time.Minute),
			}
		}},
		{"route and host windows", routes, func(rng *rand.Rand) []Limit {
			return []Limit{
				WindowOf(Requests, 1+rng.IntN(4), time.Second),
				WindowOf(Requests, 2+rng.IntN(8), secOrMin(rng)).Parent(HostOf),
			}
		}},
		{"route bucket, host bucket and host tokens", routes, func(rng *rand.Rand) []Limit {
			return []Limit{
				BucketOf(Requests, perSec(rng, 1, 10), 1+rng.IntN(4)),
				BucketOf(Requests, perSec(rng, 2, 20), 2+rng.IntN(8)).Parent(HostOf),
				WindowOf(Tokens, 500+rng.IntN(5000), time.Minute).Parent(HostOf),
			}
		}},
		{"input, output tokens and points", []string{"a", "b"}, func(rng *rand.Rand) []Limit {
			return []Limit{
				BucketOf(Requests, perSec(rng, 1, 20), 1+rng.IntN(5)),
				WindowOf(InputTokens, 500+rng.IntN(5000), time.Minute),
				BucketOf(OutputTokens, perSec(rng, 10, 200), 100+rng.IntN(2000)),
				WindowOf(Points, 50+rng.IntN(1000), secOrMin(rng)),
			}
		}},
		{"bucket under window", []string{"a", "b"}, func(rng *rand.Rand) []Limit {
			return []Limit{
				BucketOf(Requests, perSec(rng, 1, 20), 1+rng.IntN(5)),
				WindowOf(Requests, 1+rng.IntN(10), []time.Duration{time.Second, 7 * time.Second}[rng.IntN(2)]),
			}
		}},
	}
}

// limMode is how a schedule's grants end.
type limMode int

const (
	limCancel limMode = iota // estimates are the truth; some grants cancelled, before or after their turn
	limSettle                // each grant settled after its turn at an actual cost unlike its estimate
)

func (m limMode) String() string { return [...]string{"cancel", "settle"}[m] }

// TestLimitsProperties runs limSchedules random schedules of each
// configuration in each mode and checks, at each step, all or nothing and
// the zero dimensions, and at the end every limit's bound. A subtest stops
// at its first failing schedule, and prints it; to run it again:
// EGRESS_PROPERTY_SEED=<seed> go test -run 'TestLimitsProperties/<subtest>$'.
func TestLimitsProperties(t *testing.T) {
	t.Parallel()
	seed := propertySeed(t)
	for c, cfg := range limConfigs() {
		for _, mode := range []limMode{limCancel, limSettle} {
			sub := uint64(2*c) + uint64(mode)
			t.Run(cfg.name+"/"+mode.String(), func(t *testing.T) {
				t.Parallel()
				for i := range limSchedules {
					rng := rand.New(rand.NewPCG(seed+sub, uint64(i)))
					r := newLimRun(t, cfg, mode, rng)
					if err := r.run(6 + rng.IntN(26)); err != nil {
						require.NoError(t, err, "%s, %s: schedule %d (seed %#x, stream %#x/%d); limits %v\n%s",
							cfg.name, mode, i, seed, seed+sub, i, r.lims, r.trace())
					}
				}
			})
		}
	}
}

// limGrant is one granted request of a schedule.
type limGrant struct {
	Grant
	step    int  // the step that reserved it
	actual  Cost // its cost in the end: the estimate until settled, Cost{} once cancelled
	settled int  // the step that settled it; math.MaxInt while it has not
}

// limSettlement is a settlement still to come.
type limSettlement struct {
	at     time.Time
	grant  int
	actual Cost
}

// limEvent is one step of a schedule, kept to print it on a failure.
type limEvent struct {
	at    time.Time
	key   string
	cost  Cost // a reservation's estimate; a settlement's actual cost
	b     budget
	grant int   // the grant reserved or settled; -1 when refused
	err   error // a refusal
}

// limRun is one schedule being run.
type limRun struct {
	t        testing.TB
	rng      *rand.Rand
	keys     []string
	lims     []Limit
	mode     limMode
	caps     [Points + 1]int // the least n or burst of the limits of each dimension; 0 for none
	interval time.Duration   // the mean time between arrivals that the tightest limit admits
	span     time.Duration   // the longest window or bucket drain: an idle time that resets all
	l        *Limits
	fc       *clock.Fake
	grants   []limGrant
	events   []limEvent
	pending  []limSettlement

	probe      *Limits // a copy of l, to find a refused request's turn
	probeClock *clock.Fake

	before, after limSnap // around each reservation
}

func newLimRun(t *testing.T, cfg limConfig, mode limMode, rng *rand.Rand) *limRun {
	r := &limRun{t: t, rng: rng, keys: cfg.keys, lims: cfg.limits(rng), mode: mode}
	r.l, r.fc = newLimitsOnFake(t, r.lims...)
	for _, lim := range r.lims {
		if r.caps[lim.dim] == 0 || lim.n < r.caps[lim.dim] {
			r.caps[lim.dim] = lim.n
		}
	}
	for _, lim := range r.lims {
		unit, span := lim.w.Seconds()/float64(lim.n), lim.w
		if !lim.window {
			unit, span = 1/lim.rate.PerSecond(), durationOf(lim.n, lim.rate)
		}
		mean := 1.1 // requests: mostly 1
		if lim.dim != Requests {
			mean = float64(r.caps[lim.dim]) / 2
		}
		share := 1 / float64(len(cfg.keys)) // of the arrivals, those on one state of the limit
		if lim.parent != nil {
			share = float64(limSameParent(cfg.keys)) / float64(len(cfg.keys))
		}
		r.interval = max(r.interval, time.Duration(unit*mean*share*1e9))
		r.span = max(r.span, span)
	}
	return r
}

// limSameParent returns how many of keys share the first one's host.
func limSameParent(keys []string) int {
	n := 0
	for _, k := range keys {
		if HostOf(k) == HostOf(keys[0]) {
			n++
		}
	}
	return n
}

// run runs arrivals requests, the settlements falling between them, then
// the settlements still to come, and checks each limit's bound.
func (r *limRun) run(arrivals int) error {
	r.grants = make([]limGrant, 0, arrivals)
	r.events = make([]limEvent, 0, 2*arrivals)
	for range arrivals {
		next := r.fc.Now().Add(r.gap())
		r.settleUntil(next)
		r.fc.Advance(next.Sub(r.fc.Now()))
		if err := r.arrive(); err != nil {
			return fmt.Errorf("step %d: %w", len(r.events)-1, err)
		}
	}
	r.settleUntil(time.Time{})
	return r.checkBounds()
}

// gap draws the time to the next arrival: often none, mostly about the
// interval (so that the limits bind), sometimes an idle time past the
// windows and past a sweep.
func (r *limRun) gap() time.Duration {
	switch p := r.rng.IntN(100); {
	case p < 25:
		return 0
	case p < 45:
		return time.Duration(r.rng.Int64N(int64(r.interval/10) + 1))
	case p < 94:
		return time.Duration(r.rng.Int64N(int64(r.interval*8/5) + 1))
	default:
		return time.Duration(r.rng.Int64N(int64(2*r.span+keyed.SweepEvery) + 1))
	}
}

// cost draws a request's estimate: in each dimension limited, sometimes
// 0, sometimes more than a limit can ever grant; in the others, anything.
func (r *limRun) cost() Cost {
	if r.rng.IntN(40) == 0 {
		return Cost{}
	}
	var c Cost
	for d := Requests; d <= Points; d++ {
		units, limit := 0, r.caps[d]
		switch p := r.rng.IntN(100); {
		case limit == 0:
			units = r.rng.IntN(5)
		case p < 12:
		case p < 14:
			units = limit + 1 + r.rng.IntN(limit)
		case d == Requests && p < 90:
			units = 1
		default:
			units = 1 + r.rng.IntN(limit)
		}
		c = limCostWith(c, d, units)
	}
	return c
}

func limCostWith(c Cost, d Dimension, units int) Cost {
	switch d {
	case Requests:
		c.Requests = units
	case Tokens:
		c.Tokens = units
	case InputTokens:
		c.InputTokens = units
	case OutputTokens:
		c.OutputTokens = units
	case Points:
		c.Points = units
	}
	return c
}

// budget draws a request's budget: none half the time, else a maximum
// wait or a deadline of up to a few intervals.
func (r *limRun) budget(now time.Time) budget {
	scale := int64(3*r.interval) + 1
	switch p := r.rng.IntN(100); {
	case p < 50:
		return budget{}
	case p < 85:
		return budget{maxWait: 1 + time.Duration(r.rng.Int64N(scale))}
	default:
		return budget{deadline: now.Add(time.Duration(r.rng.Int64N(scale)))}
	}
}

// arrive reserves one request and checks all or nothing and the zero
// dimensions.
func (r *limRun) arrive() error {
	now := r.fc.Now()
	ev := limEvent{at: now, key: r.keys[r.rng.IntN(len(r.keys))], cost: r.cost(), grant: -1}
	ev.b = r.budget(now)
	r.before = limSnapshot(r.l, now, r.before)
	g, _, err := r.l.reserve(ev.key, ev.cost, ev.b)
	if err != nil {
		ev.err = err
		r.events = append(r.events, ev)
		return r.checkRefused(ev, err)
	}
	ev.grant = len(r.grants)
	r.events = append(r.events, ev)
	r.grants = append(r.grants, limGrant{Grant: g, step: len(r.events) - 1, actual: g.Cost, settled: math.MaxInt})
	r.plan(ev.grant, now)
	return r.checkGranted(g, ev.b, now)
}

// plan draws how a grant ends: cancelled at a time before or after its
// turn; in limSettle, else settled after its turn (a response's latency)
// at an actual cost.
func (r *limRun) plan(gi int, now time.Time) {
	g := r.grants[gi]
	cancel := 0.15
	if r.mode == limSettle {
		cancel = 0.1
	}
	if r.rng.Float64() < cancel {
		d := r.rng.Int64N(int64(2*g.At.Sub(now)+r.interval) + 1)
		r.pending = append(r.pending, limSettlement{at: now.Add(time.Duration(d)), grant: gi})
		return
	}
	if r.mode == limSettle {
		d := r.rng.Int64N(int64(3*r.interval) + 1)
		r.pending = append(r.pending, limSettlement{at: g.At.Add(time.Duration(d)), grant: gi, actual: r.actual(g.Cost)})
	}
}

// actual draws a grant's actual cost: in each dimension, 0.5 to 1.5 times
// the estimate, sometimes the estimate or 0; a dimension estimated at 0
// sometimes costs something after all.
func (r *limRun) actual(est Cost) Cost {
	var c Cost
	for d := Requests; d <= Points; d++ {
		e, units := est.Of(d), 0
		switch p := r.rng.IntN(100); {
		case e == 0 && p < 20:
			units = 1 + r.rng.IntN(max(r.caps[d], 4))
		case e == 0, p < 10:
		case p < 20:
			units = e
		default:
			units = int(math.Round(float64(e) * (0.5 + r.rng.Float64())))
		}
		c = limCostWith(c, d, units)
	}
	return c
}

// settleUntil settles, in time order, the grants whose settlement falls at
// or before until; all of them when until is zero.
func (r *limRun) settleUntil(until time.Time) {
	for len(r.pending) > 0 {
		k := 0
		for j, s := range r.pending {
			if s.at.Before(r.pending[k].at) {
				k = j
			}
		}
		s := r.pending[k]
		if !until.IsZero() && s.at.After(until) {
			return
		}
		r.pending = slices.Delete(r.pending, k, k+1)
		if s.at.After(r.fc.Now()) {
			r.fc.Advance(s.at.Sub(r.fc.Now()))
		}
		g := &r.grants[s.grant]
		r.l.Settle(g.Grant, s.actual)
		r.events = append(r.events, limEvent{at: r.fc.Now(), key: g.Key, cost: s.actual, grant: s.grant})
		g.actual, g.settled = s.actual, len(r.events)-1
	}
}

// checkRefused: a refused request took nothing from any limit, and it was
// refused only when it had to be: a cost above a limit's n or burst, or a
// turn (found on a copy of the limits) that its budget does not allow.
func (r *limRun) checkRefused(ev limEvent, err error) error {
	now := r.fc.Now()
	if r.after = limSnapshot(r.l, now, r.after); !r.after.equal(r.before) {
		return fmt.Errorf("refused (%v), yet the limits changed:\nbefore %v\nafter  %v", err, r.before, r.after)
	}
	var le *LimitError
	if !errors.As(err, &le) {
		return fmt.Errorf("refused with %v, not a *LimitError", err)
	}
	if le.Reason == ReasonCostTooHigh {
		for _, lim := range r.lims {
			if ev.cost.Of(lim.dim) > lim.n {
				return nil
			}
		}
		return fmt.Errorf("refused as too costly, but no limit's n or burst is below the cost: %v", err)
	}
	if r.probe == nil {
		r.probe, r.probeClock = newLimitsOnFake(r.t, r.lims...)
	}
	limCopy(r.probe, r.probeClock, r.l, now)
	g, _, perr := r.probe.reserve(ev.key, ev.cost, budget{})
	if perr != nil {
		return fmt.Errorf("refused (%v), and a copy of the limits refuses it without a budget: %v", err, perr)
	}
	if wait := g.At.Sub(now); le.Wait != wait || ev.b.refuse(now, ev.key, 0, wait) == nil {
		return fmt.Errorf("refused (%v), but the turn is %v away", err, wait)
	}
	return nil
}

// checkGranted: a granted turn fits the budget; it took from every limit
// of a dimension it costs, and from no other: a cost of 0 in a dimension
// leaves its limits as they were, and a request costing nothing in any
// limited dimension goes at once.
func (r *limRun) checkGranted(g Grant, b budget, now time.Time) error {
	if g.At.Before(now) || b.refuse(now, g.Key, 0, g.At.Sub(now)) != nil {
		return fmt.Errorf("turn %v is %v away: outside the budget (%s)", g.At.Sub(limiterEpoch), g.At.Sub(now), limBudgetString(b, now))
	}
	r.after = limSnapshot(r.l, now, r.after)
	free := true
	for i, lim := range r.lims {
		took := !slices.Equal(r.before[i], r.after[i])
		if c := g.Cost.Of(lim.dim); took != (c > 0) {
			return fmt.Errorf("a cost of %d in %s, yet limit %d (%v) went from %v to %v", c, lim.dim, i, lim, r.before[i], r.after[i])
		}
		free = free && g.Cost.Of(lim.dim) == 0
	}
	if free && !g.At.Equal(now) {
		return fmt.Errorf("costs nothing in any limit, yet its turn is %v away", g.At.Sub(now))
	}
	return nil
}

// checkBounds checks each limit's bound over the grants of each of its
// keys (a parent limit's: the union of its children's).
func (r *limRun) checkBounds() error {
	for i, lim := range r.lims {
		byKey := map[string][]limUse{}
		for _, g := range r.grants {
			k := lim.key(g.Key)
			byKey[k] = append(byKey[k], limUse{
				step: g.step, at: g.At.Sub(limiterEpoch), est: g.Cost.Of(lim.dim),
				// A charge counts as at most the limit's n or burst.
				actual:  min(g.actual.Of(lim.dim), lim.n),
				settled: g.settled,
			})
		}
		for k, uses := range byKey {
			if err := limCheck(lim, uses, limEpsilon(lim)); err != nil {
				return fmt.Errorf("limit %d (%v), key %q: %w", i, lim, k, err)
			}
		}
	}
	return nil
}

// limEpsilon is the slack a limit's bound needs for rounding, plus 1e-9
// for the float arithmetic of the check itself. A window's arithmetic is
// exact: none. A bucket's bound does not hold exactly, but within r·1ns,
// far below a unit (with no slack, these tests fail by fractions of it: 7
// units where the bound is 6.99999998801677, at 26.2/s and a burst of 6).
// durationOf rounds up, which makes the step a grant adds to tat stricter,
// but also makes the room earliest subtracts, durationOf(burst−c), up to
// 1ns larger, so a turn can come up to 1ns early: at 3/s, a grant of 2 then
// one of burst−1 are 666666667ns − 333333334ns = 333333333ns apart, 0.33ns
// short of what burst+1 units need. A refund rounds down: it adds nothing.
func limEpsilon(lim Limit) float64 {
	if lim.window {
		return 0
	}
	return lim.rate.PerSecond()*1e-9 + 1e-9
}

// limUse is one grant as one limit counts it.
type limUse struct {
	step    int           // the step that reserved it: the order of reservation
	at      time.Duration // its turn, since the epoch
	est     int           // the units it was granted
	actual  int           // the units it cost in the end (the estimate if never settled; 0 if cancelled)
	settled int           // the step that settled it; math.MaxInt if none did
}

// counted returns the units the limit may be held to for u when the
// request reserved at step last is the last one of an interval: its actual
// cost if settled by then, else no more than the estimate (an
// under-estimate still unsettled is the bound's slack).
func (u limUse) counted(last int) int {
	if u.settled < last {
		return u.actual
	}
	return min(u.actual, u.est)
}

// limCheck checks the bound of lim over one key's grants, given in order
// of reservation: for each grant R that the limit admitted (an estimate
// above 0 in its dimension) and each interval [a, b] of turns that holds
// R's turn, the grants reserved up to R whose turns are in [a, b] count
// (see limUse.counted) at most n when b−a < w (a window), or at most
// r·(b−a) + burst + eps (a bucket). That is the Limits promise: in any
// interval, the bound plus the under-estimates of the requests still
// unsettled when the last of them the limit admitted (R) was reserved. It
// checks every interval [a, b] the promise covers (that one's last, R,
// holds its turn; the grants reserved after R are in no sum), and more:
// those also holding turns reserved after R, left out of the sum.
func limCheck(lim Limit, uses []limUse, eps float64) error {
	order := make([]int, 0, len(uses)) // uses[:R+1], by turn
	sums := make([]float64, len(uses)+1)
	for last, lu := range uses {
		pos := len(order)
		for pos > 0 && uses[order[pos-1]].at > lu.at {
			pos--
		}
		order = slices.Insert(order, pos, last)
		if lu.est == 0 {
			continue // the limit did not admit it: it took nothing
		}
		for k, u := range order {
			sums[k+1] = sums[k] + float64(uses[u].counted(lu.step))
		}
		i, j, bound := limWorst(lim, uses, order, sums, pos)
		if got := sums[j+1] - sums[i]; got > bound+eps {
			var in []string
			for _, u := range order[i : j+1] {
				settled := "never settled"
				if uses[u].settled != math.MaxInt {
					settled = fmt.Sprintf("settled at step %d", uses[u].settled)
				}
				in = append(in, fmt.Sprintf("step %d: %d (est %d, %s)", uses[u].step, uses[u].counted(lu.step), uses[u].est, settled))
			}
			return fmt.Errorf("after the grant of step %d: %v units in turns [%v, %v], bound %v:\n\t%s",
				lu.step, got, uses[order[i]].at, uses[order[j]].at, bound, strings.Join(in, "\n\t"))
		}
	}
	return nil
}

// limWorst returns the interval order[i..j] holding order[pos] whose count
// goes furthest above its bound, and that bound.
func limWorst(lim Limit, uses []limUse, order []int, sums []float64, pos int) (wi, wj int, wbound float64) {
	at := func(k int) time.Duration { return uses[order[k]].at }
	if lim.window {
		// For each first turn, the window reaching furthest after it.
		worst := math.Inf(-1)
		for i, j := 0, pos; i <= pos; i++ {
			if at(pos)-at(i) >= lim.w {
				continue
			}
			for j+1 < len(order) && at(j+1)-at(i) < lim.w {
				j++
			}
			if over := sums[j+1] - sums[i] - float64(lim.n); over > worst {
				worst, wi, wj = over, i, j
			}
		}
		return wi, wj, float64(lim.n)
	}
	// count − r·(b−a) splits into a term of a and one of b: maximise each.
	r := lim.rate.PerSecond()
	sec := func(d time.Duration) float64 { return d.Seconds() }
	left, right := math.Inf(-1), math.Inf(-1)
	for i := 0; i <= pos; i++ {
		if v := -sums[i] - r*sec(at(pos)-at(i)); v > left {
			left, wi = v, i
		}
	}
	for j := pos; j < len(order); j++ {
		if v := sums[j+1] - r*sec(at(j)-at(pos)); v > right {
			right, wj = v, j
		}
	}
	return wi, wj, r*sec(at(wj)-at(wi)) + float64(lim.n)
}

// limSnap is the state of every limit as it bears on what comes next, one
// slice per limit: for each key not at rest, in key order, a row for the
// key (a bucket's tat, or a window's own count of its grants still in the
// window), then a row for each of those grants. The keys at rest (as good
// as absent) and the grants gone from a window (which trimming drops at any
// time) are left out.
type limSnap [][]limRow

type limRow struct {
	key   string
	grant bool          // a window's grant, not the key's row
	at    time.Duration // a bucket's tat or a grant's turn, since the epoch
	n     int           // a window's count or a grant's cost
}

func (s limSnap) equal(o limSnap) bool {
	return slices.EqualFunc(s, o, func(a, b []limRow) bool { return slices.Equal(a, b) })
}

// limSnapshot returns the state of l's limits at now, in the memory of
// into.
func limSnapshot(l *Limits, now time.Time, into limSnap) limSnap {
	l.mu.Lock()
	defer l.mu.Unlock()
	into = slices.Grow(into[:0], len(l.limits))[:len(l.limits)]
	for i := range l.limits {
		var buf [8]string
		keys := buf[:0]
		for k := range l.states[i].M {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		rows := into[i][:0]
		for _, k := range keys {
			rows = limRowsOf(rows, k, l.states[i].M[k], now)
		}
		into[i] = rows
	}
	return into
}

// limRowsOf appends the rows of key's state s at now to rows.
func limRowsOf(rows []limRow, key string, s *limitState, now time.Time) []limRow {
	if s.log.W == 0 { // a bucket
		if s.bucket.TAT.After(now) {
			rows = append(rows, limRow{key: key, at: s.bucket.TAT.Sub(limiterEpoch)})
		}
		return rows
	}
	head, gone := len(rows), now.Add(-s.log.W) // a grant at or before gone has left
	rows = append(rows, limRow{key: key, n: s.log.Sum})
	for j, at := range s.log.At[s.log.First:] {
		cost := int(s.log.Cost[s.log.First+j])
		if !at.After(gone) {
			rows[head].n -= cost
			continue
		}
		rows = append(rows, limRow{key: key, grant: true, at: at.Sub(limiterEpoch), n: cost})
	}
	if len(rows) == head+1 && rows[head].n == 0 {
		rows = rows[:head] // at rest
	}
	return rows
}

// limCopy makes c, made with l's limits on the fake clock fc, a deep copy
// of l at now (not before fc's time).
func limCopy(c *Limits, fc *clock.Fake, l *Limits, now time.Time) {
	fc.Advance(now.Sub(fc.Now()))
	l.mu.Lock()
	defer l.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range l.states {
		to := &c.states[i]
		clear(to.M)
		to.Peak, to.LastSweep = l.states[i].Peak, l.states[i].LastSweep
		for k, s := range l.states[i].M {
			cs := *s
			cs.log.At, cs.log.Cost = slices.Clone(s.log.At), slices.Clone(s.log.Cost)
			to.M[k] = &cs
		}
	}
}

// trace prints the schedule, one step a line.
func (r *limRun) trace() string {
	var b strings.Builder
	for i, ev := range r.events {
		fmt.Fprintf(&b, "  step %d at %v: ", i, ev.at.Sub(limiterEpoch))
		switch {
		case ev.err != nil:
			fmt.Fprintf(&b, "reserve %q %+v, %s: %v\n", ev.key, ev.cost, limBudgetString(ev.b, ev.at), ev.err)
		case r.grants[ev.grant].step == i:
			g := r.grants[ev.grant]
			fmt.Fprintf(&b, "reserve %q %+v, %s: grant %d, turn %v\n", ev.key, ev.cost, limBudgetString(ev.b, ev.at), ev.grant, g.At.Sub(limiterEpoch))
		default:
			fmt.Fprintf(&b, "settle grant %d (%q) at %+v\n", ev.grant, ev.key, ev.cost)
		}
	}
	return b.String()
}

func limBudgetString(b budget, now time.Time) string {
	switch {
	case b.maxWait > 0:
		return fmt.Sprintf("max wait %v", b.maxWait)
	case !b.deadline.IsZero():
		return fmt.Sprintf("deadline in %v", b.deadline.Sub(now))
	}
	return "no budget"
}

// TestLimitsPropertyCheckersFail: the checkers above can fail. Hand-made
// grants over a window, a bucket and a settlement break the bound and are
// reported, while the same grants moved to fit are not; and a grant changes
// the snapshot that all or nothing compares.
func TestLimitsPropertyCheckersFail(t *testing.T) {
	const never = math.MaxInt
	ms := time.Millisecond
	use := func(step int, at time.Duration, est, actual, settled int) limUse {
		return limUse{step: step, at: at, est: est, actual: actual, settled: settled}
	}
	window := WindowOf(Requests, 2, time.Second)
	bucket := BucketOf(Requests, PerSecond(1), 1)
	for _, tc := range []struct {
		name string
		lim  Limit
		uses []limUse
		fail bool
	}{
		{"window: 3 in a second", window, []limUse{use(0, 0, 1, 1, never), use(1, 500*ms, 1, 1, never), use(2, 900*ms, 1, 1, never)}, true},
		{"window: the 1st has left", window, []limUse{use(0, 0, 1, 1, never), use(1, 500*ms, 1, 1, never), use(2, 1000*ms, 1, 1, never)}, false},
		{"window: a late turn, reserved last", window, []limUse{use(0, 900*ms, 1, 1, never), use(1, 0, 1, 1, never), use(2, 500*ms, 1, 1, never)}, true},
		{"window: a cancelled grant counts 0", window, []limUse{use(0, 0, 1, 0, 3), use(1, 500*ms, 1, 1, never), use(2, 900*ms, 1, 1, never)}, false},
		{"bucket: 2 half a second apart", bucket, []limUse{use(0, 0, 1, 1, never), use(1, 500*ms, 1, 1, never)}, true},
		{"bucket: 2 a second apart", bucket, []limUse{use(0, 0, 1, 1, never), use(1, time.Second, 1, 1, never)}, false},
		{"bucket: 2 at one turn, out of order", bucket, []limUse{use(0, 3*time.Second, 1, 1, never), use(1, 2*time.Second, 1, 1, never), use(2, 3*time.Second, 1, 1, never)}, true},
		// 1 estimated, 2 actual, settled after the 2nd was reserved: its
		// under-estimate is slack. Settled before, it is not.
		{"settle: unsettled under-estimate", window, []limUse{use(0, 0, 1, 2, 2), use(1, 500*ms, 1, 1, never)}, false},
		{"settle: settled under-estimate", window, []limUse{use(0, 0, 1, 2, 1), use(2, 500*ms, 1, 1, never)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := limCheck(tc.lim, tc.uses, limEpsilon(tc.lim))
			if tc.fail {
				assert.Error(t, err)
				return
			}
			assert.NoError(t, err)
		})
	}

	l, fc := newLimitsOnFake(t, WindowOf(Requests, 2, time.Second), BucketOf(Tokens, PerSecond(10), 10))
	before := limSnapshot(l, fc.Now(), nil)
	_, _, err := l.reserve("k", Cost{Requests: 1}, budget{})
	require.NoError(t, err)
	after := limSnapshot(l, fc.Now(), nil)
	assert.False(t, before.equal(after))
	assert.NotEqual(t, before[0], after[0], "a grant shows in its limit's snapshot")
	assert.Equal(t, before[1], after[1], "and not in a limit of a dimension it costs 0 in")
	c, cfc := newLimitsOnFake(t, l.limits...)
	limCopy(c, cfc, l, fc.Now())
	assert.True(t, after.equal(limSnapshot(c, fc.Now(), nil)), "a copy is the same")
}

// TestLimitsBucketRefundKeepsBound: the smallest schedules of the kind on
// which TestLimitsProperties found a bucket breaking its bound. A refund (a
// waiter cancelled before its turn; a grant cancelled, or settled below its
// estimate, after it) lowers the bucket's tat, which gives the capacity
// back at the end of the turns given, not at the refunded grant's turn: if
// it gave back the whole cost while a turn was given after the refunded
// one, the next request would take that same turn. (A window changes the
// grant's own entry, at its turn.)
func TestLimitsBucketRefundKeepsBound(t *testing.T) {
	type step struct {
		advance time.Duration
		cost    Cost // a reservation's estimate, or a settlement's actual cost
		settle  int  // 0 for a reservation; n to settle the n-th grant
	}
	one, ms := Cost{Requests: 1}, time.Millisecond
	for _, tc := range []struct {
		name  string
		lim   Limit
		steps []step
	}{
		{"a waiter cancelled before its turn, with one behind it", BucketOf(Requests, PerSecond(1), 1), []step{
			{0, one, 0}, {0, one, 0}, {0, one, 0}, // turns 0, 1s, 2s
			{500 * ms, Cost{}, 2}, // the 2nd waiter's context ends
			{0, one, 0},           // turn 2s, with the 3rd: 2 at one instant
		}},
		{"a settlement below the estimate, with a turn given after", BucketOf(Tokens, PerSecond(10), 10), []step{
			{0, Cost{Tokens: 10}, 0}, {0, Cost{Tokens: 10}, 0}, // turns 0, 1s
			{500 * ms, Cost{}, 1},    // the 1st used no tokens after all
			{0, Cost{Tokens: 10}, 0}, // turn 1s, with the 2nd: 20 tokens at one instant
		}},
		{"a grant cancelled after its turn and a later one", BucketOf(Requests, PerSecond(1), 1), []step{
			{0, one, 0}, {time.Second, one, 0}, // turns 0, 1s
			{500 * ms, Cost{}, 1}, // the 1st cost nothing
			{0, one, 0},           // turn 1.5s: 2 in [1s, 1.5s]
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, fc := newLimitsOnFake(t, tc.lim)
			var grants []Grant
			var uses []limUse
			for i, st := range tc.steps {
				fc.Advance(st.advance)
				if st.settle > 0 {
					l.Settle(grants[st.settle-1], st.cost)
					u := &uses[st.settle-1]
					u.actual, u.settled = st.cost.Of(tc.lim.dim), i
					continue
				}
				g, _, err := l.reserve("k", st.cost, budget{})
				require.NoError(t, err, "step %d", i)
				grants = append(grants, g)
				c := st.cost.Of(tc.lim.dim)
				uses = append(uses, limUse{step: i, at: g.At.Sub(limiterEpoch), est: c, actual: c, settled: math.MaxInt})
			}
			assert.NoError(t, limCheck(tc.lim, uses, limEpsilon(tc.lim)), "%v", tc.lim)
		})
	}
}
