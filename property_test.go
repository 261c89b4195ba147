package egress

// Property tests of the two limiters: thousands of random arrival schedules,
// driven synchronously on a fake clock (no goroutines, no sleeping), each
// checked against the limiter's promise and against an independent model.
//
// Every schedule is drawn from its own PCG stream, (seed, schedule index), so
// that a failure names the one schedule to replay. Set EGRESS_PROPERTY_SEED
// to run another seed.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/keyed"
)

const (
	defaultPropertySeed = 0x6567726573730001
	propertySchedules   = 10_000
)

// propertyRuns is how many random schedules a property test draws: all of
// propertySchedules, or a quarter with -short (make fast, the loop of a
// change in progress; make test runs them all).
func propertyRuns(all int) int {
	if testing.Short() {
		return all / 4
	}
	return all
}

func propertySeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(defaultPropertySeed)
	if s := os.Getenv("EGRESS_PROPERTY_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 0, 64)
		require.NoError(t, err, "EGRESS_PROPERTY_SEED")
		seed = v
	}
	t.Logf("seed %#x (EGRESS_PROPERTY_SEED)", seed)
	return seed
}

func propRand(seed uint64, i int) *rand.Rand {
	return rand.New(rand.NewPCG(seed, uint64(i)))
}

// propRate draws a rate in one of the forms a caller writes, from a few a
// minute to a couple of hundred a second.
func propRate(rng *rand.Rand) Rate {
	switch rng.IntN(4) {
	case 0:
		return PerSecond(0.5 + rng.Float64()*200)
	case 1:
		return Per(float64(1+rng.IntN(100)), []time.Duration{100 * time.Millisecond, time.Second, 7 * time.Second, time.Minute}[rng.IntN(4)])
	case 2:
		return Every(time.Millisecond + time.Duration(rng.Int64N(int64(2*time.Second))))
	default:
		return PerSecond(float64(1 + rng.IntN(50)))
	}
}

// propGap draws the time between two arrivals: often none (simultaneous
// arrivals), mostly around the rate's interval, sometimes a long idle time
// across several sweeps.
func propGap(rng *rand.Rand, interval time.Duration) time.Duration {
	switch p := rng.IntN(100); {
	case p < 30:
		return 0
	case p < 50:
		return time.Duration(rng.Int64N(int64(interval/10) + 1))
	case p < 92:
		return time.Duration(rng.Int64N(int64(2*interval) + 1))
	default:
		return keyed.SweepEvery/2 + time.Duration(rng.Int64N(int64(10*keyed.SweepEvery)))
	}
}

// propBudget draws a maximum wait (none half the time) and, sometimes, a
// deadline (relative to the arrival) in the range of a few intervals.
func propBudget(rng *rand.Rand, scale time.Duration) (maxWait time.Duration, hasDeadline bool, deadline time.Duration) {
	if rng.IntN(2) == 0 {
		maxWait = 1 + time.Duration(rng.Int64N(int64(scale)))
	}
	if rng.IntN(5) == 0 {
		hasDeadline = true
		deadline = time.Duration(rng.Int64N(int64(scale)))
	}
	return maxWait, hasDeadline, deadline
}

// propArrival is one request of a random schedule.
type propArrival struct {
	gap         time.Duration // since the previous arrival
	key         string
	cost        int
	maxWait     time.Duration
	hasDeadline bool
	deadline    time.Duration // after the arrival

	// Leaky bucket only.
	cancel     float64 // < propCancelShare: first cancel a queued waiter...
	cancelPick float64 // ...this one, as a share of the queued ones
	arriveLast bool    // at a tie with a head's turn, the head goes first
}

func (a propArrival) budget(now time.Time) budget {
	b := budget{maxWait: a.maxWait}
	if a.hasDeadline {
		b.deadline = now.Add(a.deadline)
	}
	return b
}

func (a propArrival) String() string {
	s := fmt.Sprintf("+%v %s cost %d", a.gap, a.key, a.cost)
	if a.maxWait > 0 {
		s += fmt.Sprintf(" maxWait %v", a.maxWait)
	}
	if a.hasDeadline {
		s += fmt.Sprintf(" deadline +%v", a.deadline)
	}
	return s
}

// propOutcome is what a limiter did with one arrival or one release.
type propOutcome struct {
	i      int // the arrival
	at     time.Duration
	key    string
	cost   int
	delay  time.Duration // token bucket: the wait granted
	queued bool          // leaky bucket: queued rather than gone at once
	reason Reason        // refused for this reason
	wait   time.Duration // refused: the LimitError's Wait
	event  string        // leaky bucket: "arrive", "release" or "cancel"
	lag    time.Duration // leaky bucket, release: how late its goroutine woke
}

func (o propOutcome) String() string {
	s := fmt.Sprintf("#%d %-7s at %v %s cost %d", o.i, o.event, o.at, o.key, o.cost)
	switch {
	case o.reason != 0:
		s += fmt.Sprintf(": refused (%s, wait %v)", o.reason, o.wait)
	case o.delay > 0:
		s += fmt.Sprintf(": delay %v", o.delay)
	case o.queued:
		s += ": queued"
	case o.lag > 0:
		s += fmt.Sprintf(" (woke %v late)", o.lag)
	}
	return s
}

func propFormat(header string, arrivals []propArrival, trace []propOutcome) string {
	var b strings.Builder
	b.WriteString(header + "\narrivals:\n")
	for i, a := range arrivals {
		fmt.Fprintf(&b, "  #%d %v\n", i, a)
	}
	b.WriteString("trace:\n")
	for _, o := range trace {
		fmt.Fprintf(&b, "  %v\n", o)
	}
	return b.String()
}

// propLimitErr returns err's *LimitError, or an error saying it is not one.
func propLimitErr(err error) (*LimitError, error) {
	var le *LimitError
	if !errors.As(err, &le) {
		return nil, fmt.Errorf("error %v is not a *LimitError", err)
	}
	return le, nil
}

// propWindowBound checks that in every window [s_i, s_j] between two grant
// times the granted cost is at most perSec·(s_j−s_i) + slack (+ eps).
func propWindowBound(grants []propOutcome, perSec, slack, eps float64) error {
	slices.SortStableFunc(grants, func(a, b propOutcome) int { return int(a.at - b.at) })
	sum := make([]float64, len(grants)+1)
	for i, g := range grants {
		sum[i+1] = sum[i] + float64(g.cost)
	}
	for i := range grants {
		for j := i; j < len(grants); j++ {
			w := (grants[j].at - grants[i].at).Seconds()
			if got, bound := sum[j+1]-sum[i], perSec*w+slack; got > bound+eps {
				return fmt.Errorf("%v units granted in [%v, %v] (key %s), bound %v·%v+%v = %v",
					got, grants[i].at, grants[j].at, grants[i].key, perSec, w, slack, bound)
			}
		}
	}
	return nil
}

// ---------------------------------------------------------------- token bucket

type propTokenSchedule struct {
	rate     Rate
	burst    int
	arrivals []propArrival
}

func propRandomTokenSchedule(rng *rand.Rand) propTokenSchedule {
	s := propTokenSchedule{rate: propRate(rng), burst: 1 + rng.IntN(8)}
	keys := 1 + rng.IntN(3)
	interval := s.rate.Interval()
	for range 20 + rng.IntN(21) {
		a := propArrival{
			gap:  propGap(rng, interval),
			key:  string(rune('a' + rng.IntN(keys))),
			cost: 1 + rng.IntN(s.burst),
		}
		a.maxWait, a.hasDeadline, a.deadline = propBudget(rng, time.Duration(3*s.burst)*interval)
		s.arrivals = append(s.arrivals, a)
	}
	return s
}

// propRunToken drives the schedule through tb.reserve on fc.
func propRunToken(tb *TokenBucket, fc *clock.Fake, s propTokenSchedule) []propOutcome {
	var trace []propOutcome
	for i, a := range s.arrivals {
		fc.Advance(a.gap)
		now := fc.Now()
		delay, err := delayOf(tb.reserve(a.key, a.cost, a.budget(now)))
		o := propOutcome{i: i, at: now.Sub(limiterEpoch), key: a.key, cost: a.cost, delay: delay, event: "arrive"}
		if err != nil {
			le, lerr := propLimitErr(err)
			if lerr != nil {
				o.reason = propNotLimitError
			} else {
				o.reason, o.wait = le.Reason, le.Wait
			}
		}
		trace = append(trace, o)
	}
	return trace
}

// propNotLimitError marks, in a trace, a refusal whose error is not a
// *LimitError.
const propNotLimitError Reason = 255

// propTokenModel is an independent token bucket: tokens = min(B, tokens + R·dt);
// a request goes at once iff tokens >= cost and no earlier one is pending;
// a granted request takes its tokens, going below zero when it waits.
type propTokenModel struct {
	tokens  float64
	last    time.Time
	pending time.Time // when the last waiting request goes
}

func propCheckToken(s propTokenSchedule, trace []propOutcome) error {
	perSec := s.rate.PerSecond()
	burst := float64(s.burst)
	const epsTokens = 1e-6
	// Two nanoseconds of truncation in x/time/rate's durations, and some.
	tol := 3 * time.Nanosecond
	models := map[string]*propTokenModel{}
	grants := map[string][]propOutcome{}

	for _, o := range trace {
		a := s.arrivals[o.i]
		now := limiterEpoch.Add(o.at)
		m := models[a.key]
		if m == nil {
			m = &propTokenModel{tokens: burst, last: now}
			models[a.key] = m
		}
		m.tokens = math.Min(burst, m.tokens+perSec*now.Sub(m.last).Seconds())
		m.last = now
		free := m.tokens >= float64(a.cost) && !m.pending.After(now)
		need := time.Duration(math.Max(0, float64(a.cost)-m.tokens) / perSec * float64(time.Second))
		near := func(d time.Duration) bool { return (d - need).Abs() <= tol+time.Duration(float64(need)*1e-9) }

		switch {
		case o.reason == propNotLimitError:
			return fmt.Errorf("#%d: refused with an error that is not a *LimitError", o.i)
		case o.reason != 0:
			// (b) refused: the model would not have let it go at once
			// either, and its wait really did not fit.
			if free && m.tokens >= float64(a.cost)+epsTokens {
				return fmt.Errorf("#%d: refused (%s) but the model has %.9f tokens for cost %d", o.i, o.reason, m.tokens, a.cost)
			}
			if !near(o.wait) {
				return fmt.Errorf("#%d: refused with wait %v, model needs %v", o.i, o.wait, need)
			}
			switch o.reason {
			case ReasonMaxWait:
				if a.maxWait == 0 || need <= a.maxWait-tol {
					return fmt.Errorf("#%d: refused for max wait %v, model needs %v", o.i, a.maxWait, need)
				}
			case ReasonDeadline:
				if !a.hasDeadline || need <= a.deadline-tol {
					return fmt.Errorf("#%d: refused for deadline +%v, model needs %v", o.i, a.deadline, need)
				}
			default:
				return fmt.Errorf("#%d: refused for %s", o.i, o.reason)
			}
			continue // a refusal takes nothing
		case o.delay == 0:
			if m.tokens < float64(a.cost)-epsTokens || m.pending.After(now) {
				return fmt.Errorf("#%d: went at once but the model has %.9f tokens for cost %d (pending until %v)",
					o.i, m.tokens, a.cost, m.pending.Sub(limiterEpoch))
			}
		default:
			// (b) delayed: the model would not have let it go at once.
			if free && m.tokens >= float64(a.cost)+epsTokens {
				return fmt.Errorf("#%d: delayed %v but the model has %.9f tokens for cost %d", o.i, o.delay, m.tokens, a.cost)
			}
			if !near(o.delay) {
				return fmt.Errorf("#%d: delayed %v, model needs %v", o.i, o.delay, need)
			}
			if a.maxWait > 0 && o.delay > a.maxWait {
				return fmt.Errorf("#%d: delayed %v, past max wait %v", o.i, o.delay, a.maxWait)
			}
			if a.hasDeadline && o.delay > a.deadline {
				return fmt.Errorf("#%d: delayed %v, past its deadline +%v", o.i, o.delay, a.deadline)
			}
			m.pending = now.Add(o.delay)
		}
		m.tokens -= float64(a.cost)
		o.at += o.delay // granted then
		grants[a.key] = append(grants[a.key], o)
	}
	// (a) at most R·w + B in every window.
	for _, g := range grants {
		if err := propWindowBound(g, perSec, burst, perSec*(2*time.Nanosecond).Seconds()+1e-6); err != nil {
			return err
		}
	}
	return nil
}

func TestTokenBucketProperties(t *testing.T) {
	t.Parallel() // CPU-bound on the fake clock: runs beside the other heavy tests
	seed := propertySeed(t)
	for i := range propertyRuns(propertySchedules) {
		s := propRandomTokenSchedule(propRand(seed, i))
		tb, fc := newTokenBucketOnFake(t, s.rate, s.burst)
		trace := propRunToken(tb, fc, s)
		header := func() string {
			return fmt.Sprintf("seed %#x schedule %d: rate %v (%v/s), burst %d", seed, i, s.rate, s.rate.PerSecond(), s.burst)
		}
		if err := propCheckToken(s, trace); err != nil {
			t.Fatalf("%v\n%s", err, propFormat(header(), s.arrivals, trace))
		}

		// A bucket that sweeps at every call answers the same: eviction is
		// invisible. (One schedule in four, to keep the test quick.)
		if i%4 != 0 {
			continue
		}
		twin, fcTwin := newTokenBucketOnFake(t, s.rate, s.burst)
		twin.buckets.Every = time.Nanosecond
		if twinTrace := propRunToken(twin, fcTwin, s); !slices.Equal(trace, twinTrace) {
			t.Fatalf("eviction changed the answers\n%s\nwith a sweep at every call:\n%s",
				propFormat(header(), s.arrivals, trace), propFormat("", s.arrivals, twinTrace))
		}
	}
}

// ---------------------------------------------------------------- leaky bucket

const propCancelShare = 0.1

type propLeakySchedule struct {
	rate     Rate
	depth    int
	maxCost  int
	arrivals []propArrival
	lagSeed  uint64 // draws how late the heads' goroutines wake
}

func propRandomLeakySchedule(rng *rand.Rand, mixed bool) propLeakySchedule {
	s := propLeakySchedule{rate: propRate(rng), depth: rng.IntN(9), maxCost: 1, lagSeed: rng.Uint64()}
	if mixed {
		s.depth = 1 + rng.IntN(8)
		s.maxCost = 1 + rng.IntN(s.depth)
	}
	keys := 1 + rng.IntN(2)
	interval := s.rate.Interval()
	for range 20 + rng.IntN(21) {
		a := propArrival{
			gap:        propGap(rng, interval),
			key:        string(rune('a' + rng.IntN(keys))),
			cost:       1 + rng.IntN(s.maxCost),
			cancel:     rng.Float64(),
			cancelPick: rng.Float64(),
			arriveLast: rng.IntN(2) == 0,
		}
		a.maxWait, a.hasDeadline, a.deadline = propBudget(rng, time.Duration(s.depth+2)*interval)
		s.arrivals = append(s.arrivals, a)
	}
	return s
}

// propQueued is a request in the driver's copy of a queue.
type propQueued struct {
	i    int
	w    *waiter
	wake time.Time     // the head: when its goroutine polls next (zero: at once)
	lag  time.Duration // the head: how late its goroutine has woken, in all
}

// propRunLeaky drives the schedule through lb on fc: a small
// discrete-event loop that moves the clock to the next arrival or to the
// time a head's goroutine wakes (at its turn, sometimes late), whichever is
// first, polls the heads that are awake, and sometimes cancels a queued
// waiter (leave) before an arrival. It depends only on the schedule and the
// limiter's answers, so two limiters that answer alike give equal traces.
func propRunLeaky(lb *LeakyBucket, fc *clock.Fake, s propLeakySchedule) ([]propOutcome, error) {
	var trace []propOutcome
	lags := rand.New(rand.NewPCG(s.lagSeed, 0))
	keys := []string{"a", "b"}
	queues := map[string][]propQueued{}
	at := func() time.Duration { return fc.Now().Sub(limiterEpoch) }

	next := 0 // the next arrival
	nextAt := fc.Now()
	if len(s.arrivals) > 0 {
		nextAt = nextAt.Add(s.arrivals[0].gap)
	}
	for step := 0; ; step++ {
		if step > 100*len(s.arrivals)+100 {
			return trace, fmt.Errorf("the loop does not end")
		}
		// Poll the heads whose goroutines are awake: those whose turn has
		// come are released. Note when the next one wakes: at its turn, or a
		// little after (a goroutine is not always prompt), while arrivals
		// keep coming.
		var headAt time.Time
		for _, k := range keys {
			for len(queues[k]) > 0 {
				h := &queues[k][0]
				if !h.wake.IsZero() && fc.Now().Before(h.wake) {
					break // not awake yet
				}
				turn, now, done := lb.poll(k, h.w)
				if done {
					trace = append(trace, propOutcome{i: h.i, at: now.Sub(limiterEpoch), key: k, cost: h.w.cost, event: "release", lag: h.lag})
					queues[k] = queues[k][1:]
					continue
				}
				if turn <= 0 {
					return trace, fmt.Errorf("#%d is not the head of %s's queue (FIFO broken)", h.i, k)
				}
				lag := time.Duration(0)
				if lags.IntN(10) < 3 {
					lag = time.Duration(lags.Int64N(int64(2*s.rate.Interval()) + 1))
				}
				h.wake, h.lag = now.Add(turn+lag), h.lag+lag
				break
			}
			if len(queues[k]) > 0 && (headAt.IsZero() || queues[k][0].wake.Before(headAt)) {
				headAt = queues[k][0].wake
			}
		}
		if next == len(s.arrivals) && headAt.IsZero() {
			return trace, nil
		}

		a := propArrival{}
		if next < len(s.arrivals) {
			a = s.arrivals[next]
		}
		switch {
		case next < len(s.arrivals) && (headAt.IsZero() || nextAt.Before(headAt) || nextAt.Equal(headAt) && !a.arriveLast):
			limAdvanceTo(fc, nextAt)
		default:
			limAdvanceTo(fc, headAt)
			continue // the head's turn
		}

		if a.cancel < propCancelShare {
			var all []propQueued
			var allKeys []string
			for _, k := range keys {
				for _, q := range queues[k] {
					all, allKeys = append(all, q), append(allKeys, k)
				}
			}
			if len(all) > 0 {
				p := min(int(a.cancelPick*float64(len(all))), len(all)-1)
				q, k := all[p], allKeys[p]
				lb.leave(k, q.w)
				queues[k] = slices.DeleteFunc(queues[k], func(r propQueued) bool { return r.w == q.w })
				trace = append(trace, propOutcome{i: q.i, at: at(), key: k, cost: q.w.cost, event: "cancel"})
			}
		}

		w, now, err := lb.arrive(a.key, a.cost, a.budget(fc.Now()))
		o := propOutcome{i: next, at: now.Sub(limiterEpoch), key: a.key, cost: a.cost, event: "arrive", queued: w != nil}
		if err != nil {
			le, lerr := propLimitErr(err)
			if lerr != nil {
				return trace, fmt.Errorf("#%d: %w", next, lerr)
			}
			o.reason, o.wait = le.Reason, le.Wait
		}
		if w != nil {
			if w.cost != a.cost {
				return trace, fmt.Errorf("#%d: waiter of cost %d", next, w.cost)
			}
			queues[a.key] = append(queues[a.key], propQueued{i: next, w: w})
		}
		trace = append(trace, o)

		next++
		if next < len(s.arrivals) {
			nextAt = fc.Now().Add(s.arrivals[next].gap)
		}
	}
}

// nsDur shows a float number of nanoseconds (a wait, or a time as an offset
// from limiterEpoch) as a Duration.
func nsDur(ns float64) time.Duration {
	if math.IsInf(ns, -1) {
		return math.MinInt64
	}
	return time.Duration(math.Round(ns))
}

// propLeakyMirror is the checker's own view of one key's lane.
type propLeakyMirror struct {
	queue     []int // arrivals waiting, in order
	queued    int   // their cost
	released  bool
	last      time.Duration // the last release
	lastCost  int
	headSince time.Duration // when the head before the current one left the queue unreleased
}

func propCheckLeaky(s propLeakySchedule, trace []propOutcome) error {
	perSec := s.rate.PerSecond()
	// gap is c/R in nanoseconds, exactly (as a float).
	gap := func(c int) float64 { return float64(c) / perSec * 1e9 }
	mirrors := map[string]*propLeakyMirror{}
	arrivedAt := map[int]time.Duration{}
	grants := map[string][]propOutcome{}

	for _, o := range trace {
		m := mirrors[o.key]
		if m == nil {
			m = &propLeakyMirror{}
			mirrors[o.key] = m
		}
		// next is when the lane is free again, exactly.
		next := func() float64 {
			if !m.released {
				return math.Inf(-1)
			}
			return float64(m.last) + gap(m.lastCost)
		}
		release := func() {
			m.released, m.last, m.lastCost = true, o.at, o.cost
			grants[o.key] = append(grants[o.key], o)
		}

		switch o.event {
		case "cancel":
			k := slices.Index(m.queue, o.i)
			if k < 0 {
				return fmt.Errorf("#%d cancelled but not queued", o.i)
			}
			m.queue = slices.Delete(m.queue, k, k+1)
			m.queued -= o.cost
			if k == 0 {
				m.headSince = o.at // the next one is the head from now
			}

		case "release":
			// (c) FIFO and spaced at least c_prev/R.
			if len(m.queue) == 0 || m.queue[0] != o.i {
				return fmt.Errorf("#%d released out of order (queue %v)", o.i, m.queue)
			}
			if float64(o.at) < next()-0.5 {
				return fmt.Errorf("#%d released at %v, %v after the last release of cost %d: less than c/R = %v",
					o.i, o.at, o.at-m.last, m.lastCost, nsDur(gap(m.lastCost)))
			}
			// And no later than it could: at its turn, or when it came, or
			// when the head before it left, or when its goroutine woke, if
			// it was late.
			due := math.Max(next(), float64(max(arrivedAt[o.i], m.headSince)))
			if float64(o.at) > math.Ceil(due)+1+float64(o.lag) {
				return fmt.Errorf("#%d released at %v, its turn was at %v (its goroutine %v late)", o.i, o.at, nsDur(due), o.lag)
			}
			m.queue = m.queue[1:]
			m.queued -= o.cost
			release()

		case "arrive":
			a := s.arrivals[o.i]
			arrivedAt[o.i] = o.at
			now := float64(o.at)
			laneFreeBy := next() // the lane's next free time, exactly
			empty := len(m.queue) == 0
			// est is the wait the request would have: the lane's next free
			// time, then the queue ahead of it.
			est := math.Max(laneFreeBy-now, 0)
			for _, i := range m.queue {
				est += gap(s.arrivals[i].cost)
			}
			tol := float64(len(m.queue) + 2) // ns of rounding
			switch {
			case o.reason == 0 && !o.queued:
				if !empty || now < laneFreeBy-0.5 {
					return fmt.Errorf("#%d went at once with %d queued and the lane free at %v", o.i, len(m.queue), nsDur(laneFreeBy))
				}
				release()
				continue
			// (b) queued or refused: someone was queued, or the last
			// release was less than c_prev/R ago.
			case empty && now >= laneFreeBy+1:
				what := "queued"
				if o.reason != 0 {
					what = "refused (" + o.reason.String() + ")"
				}
				return fmt.Errorf("#%d %s with an empty queue, the lane free since %v", o.i, what, nsDur(laneFreeBy))
			case o.queued:
				if m.queued+a.cost > s.depth {
					return fmt.Errorf("#%d queued past the depth: %d queued + %d > %d", o.i, m.queued, a.cost, s.depth)
				}
				if a.maxWait > 0 && est > float64(a.maxWait)+tol {
					return fmt.Errorf("#%d queued for %v, past max wait %v", o.i, nsDur(est), a.maxWait)
				}
				if a.hasDeadline && est > float64(a.deadline)+tol {
					return fmt.Errorf("#%d queued for %v, past its deadline +%v", o.i, nsDur(est), a.deadline)
				}
				m.queue = append(m.queue, o.i)
				m.queued += a.cost
				continue
			}
			// Refused: for a reason that holds, with the estimated wait.
			if math.Abs(float64(o.wait)-est) > tol {
				return fmt.Errorf("#%d refused (%s) with wait %v, want %v", o.i, o.reason, o.wait, nsDur(est))
			}
			switch o.reason {
			case ReasonQueueFull:
				if m.queued+a.cost <= s.depth {
					return fmt.Errorf("#%d refused as queue full: %d queued + %d <= %d", o.i, m.queued, a.cost, s.depth)
				}
			case ReasonMaxWait:
				if m.queued+a.cost > s.depth || a.maxWait == 0 || est < float64(a.maxWait)-tol {
					return fmt.Errorf("#%d refused for max wait %v, wait %v (queued %d + %d, depth %d)", o.i, a.maxWait, nsDur(est), m.queued, a.cost, s.depth)
				}
			case ReasonDeadline:
				if m.queued+a.cost > s.depth || !a.hasDeadline || est < float64(a.deadline)-tol ||
					a.maxWait > 0 && est > float64(a.maxWait)+tol {
					return fmt.Errorf("#%d refused for deadline +%v, wait %v", o.i, a.deadline, nsDur(est))
				}
			default:
				return fmt.Errorf("#%d refused for %s", o.i, o.reason)
			}
		}
	}
	for k, m := range mirrors {
		if len(m.queue) > 0 {
			return fmt.Errorf("key %s: %v still queued at the end", k, m.queue)
		}
	}
	// (a) at most R·w + 1 in every window, or R·w + the largest cost.
	for _, g := range grants {
		if err := propWindowBound(g, perSec, float64(s.maxCost), 1e-9); err != nil {
			return err
		}
	}
	return nil
}

func TestLeakyBucketProperties(t *testing.T) {
	t.Parallel() // CPU-bound on the fake clock: runs beside the other heavy tests
	seed := propertySeed(t)
	runs := propertyRuns(propertySchedules)
	for _, variant := range []struct {
		name      string
		mixed     bool
		schedules [2]int // the schedule indexes [from, to): the variants draw apart
	}{
		{"unit costs, bound R·w+1", false, [2]int{0, runs * 6 / 10}},
		{"mixed costs, bound R·w+max cost", true, [2]int{runs * 6 / 10, runs}},
	} {
		t.Run(variant.name, func(t *testing.T) {
			for i := variant.schedules[0]; i < variant.schedules[1]; i++ {
				s := propRandomLeakySchedule(propRand(seed, i), variant.mixed)
				header := func() string {
					return fmt.Sprintf("seed %#x schedule %d: rate %v (%v/s), depth %d, max cost %d",
						seed, i, s.rate, s.rate.PerSecond(), s.depth, s.maxCost)
				}
				lb, fc := newLeakyBucketOnFake(t, s.rate, s.depth)
				trace, err := propRunLeaky(lb, fc, s)
				if err == nil {
					err = propCheckLeaky(s, trace)
				}
				if err != nil {
					t.Fatalf("%v\n%s", err, propFormat(header(), s.arrivals, trace))
				}

				if i%4 != 0 {
					continue // the twin runs one schedule in four
				}
				twin, fcTwin := newLeakyBucketOnFake(t, s.rate, s.depth)
				twin.lanes.Every = time.Nanosecond
				twinTrace, err := propRunLeaky(twin, fcTwin, s)
				if err != nil || !slices.Equal(trace, twinTrace) {
					t.Fatalf("eviction changed the answers (%v)\n%s\nwith a sweep at every call:\n%s",
						err, propFormat(header(), s.arrivals, trace), propFormat("", s.arrivals, twinTrace))
				}
			}
		})
	}
}

// TestTokenBucketKnowsItsTokens: the tokens a bucket works out after a
// grant at once (tokensAt, from what it knows) are x/time/rate's own, to
// the bit, over the property schedules with holds and decreases learnt
// between the grants.
func TestTokenBucketKnowsItsTokens(t *testing.T) {
	t.Parallel()
	seed := propertySeed(t)
	ctx := context.Background()
	checked := 0
	for i := range propertyRuns(propertySchedules) {
		rng := propRand(seed, i)
		s := propRandomTokenSchedule(rng)
		margin := time.Duration(rng.IntN(3)) * time.Millisecond
		tb, fc := newTokenBucketOnFake(t, s.rate, s.burst, WithTransitMargin(margin))
		for j, a := range s.arrivals {
			fc.Advance(a.gap)
			now := fc.Now()
			_, _ = delayOf(tb.reserve(a.key, a.cost, a.budget(now)))
			switch rng.IntN(10) {
			case 0: // a throttle: discovery lowers the rate
				tb.Learn(ctx, a.key, Signal{Now: now, SentAt: now, Status: http.StatusTooManyRequests})
			case 1: // a hold, after which the bucket resumes with one token
				tb.Learn(ctx, a.key, Signal{Now: now, SentAt: now, Status: http.StatusTooManyRequests,
					RetryAfter: time.Duration(1+rng.IntN(100)) * time.Millisecond, HasRetryAfter: true})
			}
			bk := tb.buckets.M[a.key]
			if bk == nil || !bk.known.ok {
				continue
			}
			checked++
			for _, d := range []time.Duration{0, a.gap, time.Duration(rng.Int64N(int64(2 * time.Second)))} {
				at := now.Add(d)
				if got, want := bk.tokensAt(at, tb.burst), bk.rl.TokensAt(at); got != want {
					t.Fatalf("seed %#x schedule %d arrival %d (rate %v, burst %d, margin %v): at +%v the bucket works out %v tokens, x/time/rate holds %v",
						seed, i, j, s.rate, s.burst, margin, d, got, want)
				}
			}
		}
	}
	require.Positive(t, checked, "no grant at once left the bucket knowing its tokens: the test checked nothing")
	t.Logf("%d states checked", checked)
}
