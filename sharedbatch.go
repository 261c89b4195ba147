package egress

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/egress-go/egress/internal/argv"
	"github.com/egress-go/egress/internal/caller"
	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/control"
)

// Coalescing: concurrent waiters of one key in one process share a script
// call. Waiters join the key's queue; one goroutine at a time (the lead,
// started by the first waiter to find none) takes the queue, up to maxBatch,
// and runs one script call for all of it. The script serves a batch in
// order, exactly as it would serve the calls one by one, so the fleet-wide
// bound holds.
//
// While this process already holds turns in the future for a key, the
// lead waits a fifth of the way from its last call to the last turn it
// holds (see coalesceShare; a pacer's lead, until shortly before that
// turn), and the waiters that arrive meanwhile go in one call. A process with 64 busy waiters on a key thus makes one round
// trip per a dozen admissions instead of one each. The lead exits when the
// queue is empty: no goroutine runs for an idle key.

// batchLane is the coalescing state of one key. Its fields are guarded by
// the shared limiter's mu.
type batchLane struct {
	queue   []*pending    // waiting for a call
	leading bool          // a lead goroutine is running for the key
	held    time.Time     // the latest turn this process holds
	heldAt  uint64        // the changes of the key's rate that had moved the turns when held was given (see retimings)
	rtt     time.Duration // the last round trip's duration
	called  time.Time     // when the last call returned
	turns   []heldTurn    // pacer: the turns this process holds, in order; those past are dropped lazily
	paused  time.Time     // the end of the key's hold, as the last reply said (a spent budget's is not told)
	born    time.Time     // when the process first asked for the key's turns (see startMargin)
}

// startMargin: for startWindow after a process first asks for a key's
// turns, its calls give the fleet's bucket startTransit more of margin
// (see jitterMargin): the first requests of a process open its
// connections to the provider, and reach it tens of milliseconds after
// their turns (28 to 48 ms, with 64 instances starting on two cores),
// beside requests whose turns came later and went at once. The provider's
// bucket, full before the first of them arrives, does not count the time
// between, which the fleet's bucket gave as burst: the first second of 64
// instances met a refusal in one run of two, and its hold (the
// provider's Retry-After, a second) took a tenth of the run.
//
// The margin caps what the fleet's bucket holds as of such a call; it
// does not make the bucket smaller (reserve.lua's ARGV[20]). The
// provider's bucket stays behind the fleet's by the time it did not
// count for as long as the fleet keeps it from filling, and so the units
// kept back come back only as the fleet's bucket refills. (Given back as
// a larger burst at the end of the window, they went as turns among
// those already given, 1.2 s ahead at 256 instances: six in 30 ms, which
// the provider had not, and a refusal at 2.24 to 2.28 s in most runs of
// 16 processes of 16.)
const (
	startWindow  = time.Second
	startTransit = 30 * time.Millisecond
	startFleet   = 32
)

// usableAt returns the most the fleet's bucket holds as of a call on key
// id at now: the usable burst, less the start margin (see startMargin).
// The margin grows with the fleet counted, to its whole at startFleet
// instances and more: the late first requests are those of instances
// starting together (a machine's or a deployment's), and a few
// instances' are as late as the transit margin allows. The caller holds
// mu.
func (s *shared) usableAt(id string, now time.Time) float64 {
	l, ok := s.lanes.M[id]
	if s.burst == 0 || !ok || now.Sub(l.born) >= startWindow {
		return s.usable
	}
	f := min(1, float64(s.member.Live()-1)/startFleet)
	if f <= 0 {
		return s.usable
	}
	d := time.Duration(f * float64(startTransit))
	return max(min(s.usable, 1), s.usable-jitterMargin(s.rate, s.burst, d))
}

// queueFull reports whether a request of cost would find the pacer's
// queue full: this process's own waiters already hold turns after from,
// and they and cost are more than depth units. The caller holds mu.
func (l *batchLane) queueFull(now, from time.Time, cost, depth int) bool {
	n := l.waiting(now, from)
	return n > 0 && n+cost > depth
}

// heldTurn is a turn a pacer's waiter in this process was given.
type heldTurn struct {
	at    time.Time
	cost  int
	moves uint64 // the changes of the key's rate that had moved the turns when it was given
}

// retime moves the turns this process holds as change seq of the key's
// rate moves them, by factor from from (see retimings): those given
// before it. (Changes heard out of order are applied in the order heard:
// these are a bound for the process's own calls, which the script checks.)
// The caller holds mu.
func (l *batchLane) retime(from time.Time, factor float64, seq uint64) {
	change := control.Lowering{From: from, Factor: factor}
	move := func(at time.Time, moves uint64) time.Time {
		if moves >= seq {
			return at
		}
		return change.Move(at)
	}
	for i := range l.turns {
		l.turns[i].at = move(l.turns[i].at, l.turns[i].moves)
	}
	l.held = move(l.held, l.heldAt)
}

// waiting returns the units of this process's waiters whose turns come
// after from, dropping the turns past at now: a lower bound of the
// fleet's queue, which the script counts the same way.
func (l *batchLane) waiting(now, from time.Time) int {
	i := 0
	for i < len(l.turns) && !l.turns[i].at.After(now) {
		i++
	}
	l.turns = slices.Delete(l.turns, 0, i)
	n := 0
	for _, t := range l.turns {
		if t.at.After(from) {
			n += t.cost
		}
	}
	return n
}

// coalesceShare: while the process holds turns, the lead keeps new waiters
// back after a call for at most 1/coalesceShare of the time to the last
// turn held — long enough to gather the waiters of a busy key in one call
// (64 waiters a process make one call per a dozen of them), short enough
// that a waiter's place in the fleet's order is taken soon after it
// arrives.
const coalesceShare = 5

func (l *batchLane) AtRest(now time.Time) bool {
	return !l.leading && len(l.queue) == 0 && !l.held.After(now)
}

// pending is one waiter's request.
type pending struct {
	gone  bool // its waiter left before the call; guarded by the shared limiter's mu
	cost  int
	limit time.Time     // the latest turn it accepts; zero for none
	turn  fleetTurn     // its place in the fleet's priority order
	res   chan reserved // buffered: the one result
}

// reserved is what the script said of one request.
type reserved struct {
	code  int           // 0 admitted, 1 too long for its max wait, 2 queue full, 4 held back (come back after wait)
	wait  time.Duration // from the script's now until the turn
	err   error
	moves uint64    // the changes of the key's rate that had moved its turns (see retimings)
	at    time.Time // when the reply came: the turn is wait after, give or take half a round trip
	probe bool      // the turn is a probe after a hold (see storm)
}

// reserve asks Redis for a turn of cost on key id, within b. A waiter whose
// context ends leaves at once; if its request was already sent, the turn
// is lost (the fleet sends less, never more).
func (s *shared) reserve(ctx context.Context, id string, cost int, b budget, now time.Time) reserved {
	p := &pending{cost: cost, limit: b.deadline, turn: fleetTurnOf(ctx), res: make(chan reserved, 1)}
	if b.maxWait > 0 && (p.limit.IsZero() || now.Add(b.maxWait).Before(p.limit)) {
		p.limit = now.Add(b.maxWait)
	}
	if !s.coalesce {
		results, _, err := s.runReserve(id, []*pending{p})
		if err != nil {
			return reserved{err: err}
		}
		return results[0]
	}
	s.mu.Lock()
	l, ok := s.lanes.Get(id, now)
	if !ok {
		l = &batchLane{born: now}
		s.lanes.Put(id, l)
	}
	if r, refused := s.refusedAtOnce(id, l, p, now); refused {
		s.mu.Unlock()
		return r
	}
	l.queue = append(l.queue, p)
	if !l.leading {
		l.leading = true
		go s.lead(id, l)
	}
	s.mu.Unlock()
	select {
	case r := <-p.res:
		return r
	case <-ctx.Done():
		// Marked, not searched for: the lead drops it, so that many
		// waiters cancelled at once leave in linear time.
		s.mu.Lock()
		p.gone = true
		s.mu.Unlock()
		return reserved{err: ctx.Err()}
	}
}

// refusedAtOnce returns the refusal of p, a request on key id at now
// whose lane is l, and true, when p cannot wait for the turns this
// process already holds: no turn comes before the last one held, so a
// request that cannot wait that long is refused at once, not after the
// lead's call. (Its turn is at least its own cost after the last held one
// in a token bucket, at least one unit after it in a pacer.) The rate is
// the one the script last said the key is held to, which the script
// itself uses (not the configured one). Called with s.mu held.
func (s *shared) refusedAtOnce(id string, l *batchLane, p *pending, now time.Time) (reserved, bool) {
	if !l.held.After(now) {
		return reserved{}, false
	}
	after := p.cost
	if s.burst == 0 {
		after = 1
	}
	r := s.learntRateLocked(id)
	wait := l.held.Sub(now) + durationOf(after, r)
	// A pacer's queue is full when this process's own waiters fill it:
	// the script counts theirs and the fleet's, from the end of the
	// key's hold, whether the hold was told on the channel or only in
	// a reply. Counting the time their turns span instead refused
	// callers while fewer waited, after a rise of the rate or a
	// spent budget's hold, and they came back at once, in a loop.
	from := clock.Later(now, l.paused)
	if pm, ok := s.pauses[id]; ok {
		from = clock.Later(from, pm.until)
	}
	switch {
	case s.depth >= 0 && l.queueFull(now, from, p.cost, s.depth):
		return reserved{code: 2, wait: wait}, true
	case !p.limit.IsZero() && now.Add(wait).After(p.limit):
		return reserved{code: 1, wait: wait}, true
	}
	return reserved{}, false
}

// lead runs the script calls of key id until its queue is empty.
func (s *shared) lead(id string, l *batchLane) {
	for {
		due, moved := s.nextCall(id, l)
		if d := due.Sub(s.clock.Now()); d > 0 {
			t := s.clock.NewTimer(d)
			select {
			case <-t.C():
			case <-moved:
				t.Stop()
				continue
			case <-s.stop:
				// Closed: the waiters still queued go to the fallback
				// rather than wait for a call that will not come.
				t.Stop()
				s.mu.Lock()
				queue := l.queue
				l.queue, l.leading = nil, false
				s.mu.Unlock()
				for _, p := range queue {
					p.res <- reserved{err: fmt.Errorf("egress: shared limiter %s: closed", s.name)}
				}
				return
			}
		}
		s.mu.Lock()
		var batch []*pending
		taken := 0
		for _, p := range l.queue {
			if len(batch) == maxBatch {
				break
			}
			taken++
			if !p.gone {
				batch = append(batch, p)
			}
		}
		l.queue = slices.Delete(l.queue, 0, taken)
		if len(batch) == 0 {
			if len(l.queue) == 0 {
				l.leading = false
				s.mu.Unlock()
				return
			}
			s.mu.Unlock()
			continue
		}
		s.mu.Unlock()
		s.callBatch(id, l, batch)
	}
}

// nextCall returns when the lead of key id, whose lane is l, makes its
// next call, and the channel closed at the next change of the key's rate,
// which moves that time (the lead then asks again). The lead's wait keeps
// the key's changes from being dropped as at rest (see retimings.AtRest).
// It takes s.mu.
func (s *shared) nextCall(id string, l *batchLane) (due time.Time, moved <-chan struct{}) {
	s.mu.Lock()
	// Call again shortly before the last turn held, so that the new
	// turns follow on without a gap; but no later than a fifth of the
	// way from the last call to that turn: a waiter's place in the
	// fleet's order is taken at the call, and one kept back until the
	// last held turn would queue behind every other process's waiters
	// that came after it. Its wait is then at most about 1.2 times
	// the wait of a first come, first served queue. (A pacer keeps its
	// waiters back until then: its queue's depth counts what is
	// reserved in Redis, and a process that reserved for its waiters
	// early would fill the fleet's queue with them.)
	// A change of the key's rate moves the turns held (batchLane.retime)
	// and so this call: a raise brings it in. (Kept to the old due, the
	// waiters kept back reserved when the turns held at the old rate
	// would have ended, half a second after those brought in.)
	due = l.held.Add(-2*l.rtt - time.Millisecond)
	if cap := l.called.Add(l.held.Sub(l.called) / coalesceShare); s.burst > 0 && cap.Before(due) {
		due = cap
	}
	now := s.clock.Now()
	r := s.retimingsLocked(id, now)
	r.last = clock.Later(r.last, now)
	moved = r.moved
	s.mu.Unlock()
	return due, moved
}

// callBatch runs the script call for batch, the waiters the lead of key
// id took from its lane l, notes what the reply says of the turns this
// process holds, and then gives each waiter its result, or the call's
// error.
func (s *shared) callBatch(id string, l *batchLane, batch []*pending) {
	start := s.clock.Now()
	results, paused, err := s.runReserve(id, batch)
	now := s.clock.Now()
	s.mu.Lock()
	l.rtt, l.called = now.Sub(start), now
	if err == nil {
		l.paused = now.Add(paused)
	}
	for i, r := range results {
		if r.probe {
			s.probedLocked(id, r.at.Add(r.wait))
		}
		if r.code == 0 {
			if at := r.at.Add(r.wait); at.After(l.held) {
				l.held, l.heldAt = at, r.moves
			}
			if s.depth >= 0 {
				l.turns = append(l.turns, heldTurn{at: r.at.Add(r.wait), cost: batch[i].cost, moves: r.moves})
			}
		}
	}
	s.mu.Unlock()
	for i, p := range batch {
		if err != nil {
			p.res <- reserved{err: err}
		} else {
			p.res <- results[i]
		}
	}
}

// runReserve runs the reservation script for batch: one round trip. It
// returns each request's result and the key's hold left, as the script
// saw it.
func (s *shared) runReserve(id string, batch []*pending) ([]reserved, time.Duration, error) {
	keys, args, first := s.reserveArgs(id, batch)
	s.roundTrips.Add(1)
	var reply any
	beat := s.beatDue()
	wait := s.calls.CommandTimeout(time.Now())
	if first {
		wait = max(wait, caller.MaxCommandWait)
	}
	err := s.calls.DoWithin(context.Background(), wait, func(ctx context.Context) error {
		var err error
		if beat {
			reply, err = s.reserveBeating(ctx, keys, args)
			return err
		}
		reply, err = caller.Run(ctx, s.rdb, s.clock, s.reserveScript, keys, args...).Result()
		return err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("egress: shared limiter %s: %w", s.name, err)
	}
	results, rate, err := parseReserve(reply, len(batch))
	if err != nil {
		return nil, 0, fmt.Errorf("egress: shared limiter %s: %w", s.name, err)
	}
	replied := s.clock.Now()
	for i := range results {
		results[i].at = replied
	}
	s.seen(id, rate)
	paused := pauseOf(reply)
	if paused > 0 {
		s.pausedByBudget(id, paused)
	}
	for _, r := range results {
		if r.code == 0 {
			s.admitted.Add(1)
		}
	}
	return results, paused, nil
}

// reserveArgs returns the reservation script's arguments for batch on
// key id, the key's budget report not yet sent among them (taken from its
// learnt state, so that it goes once), and whether the call is the
// process's first on the key. It takes s.mu.
func (s *shared) reserveArgs(id string, batch []*pending) (keys []string, args []any, first bool) {
	now := s.clock.Now()
	s.mu.Lock()
	// A process's first call on a key is waited for up to caller.MaxCommandWait:
	// the first requests of a process meet its busiest moment (its
	// connections opened, its scripts loaded, every instance of a fleet
	// started at once doing the same: with 256 in one process, the first
	// calls took 150 ms and more, and 38 to 146 of them went to the
	// fallback).
	ln, ok := s.lanes.M[id]
	first = ok && ln.called.IsZero()
	a := reserveArgv{
		configured: s.rate.PerSecond(), usable: s.usable, most: s.usableAt(id, now), depth: s.depth,
		discover: argv.Flag(s.learn.Discover), c: s.learn.C, floor: s.learn.Floor,
		probeHold: argv.Micros(control.ProbeHold), channel: s.keyChannel(id), id: id, read: -1,
	}
	var rep *budgetReport
	if l, ok := s.learnt.M[id]; ok {
		rep, l.report = l.report, nil
	}
	s.mu.Unlock()
	s.ann.Want(a.channel, now)
	a.budgetArgv = budgetArgs(rep, now)
	if rep != nil {
		a.read = max(argv.Micros(now.Sub(rep.read)), 0)
	}
	// Without priorities the requests go as (cost, max wait) pairs: the
	// script then skips the fleet's order (horizon 0).
	ordered := slices.ContainsFunc(batch, func(p *pending) bool { return p.turn.share > 0 })
	group := 2
	keys = s.redisKeys(id)
	if ordered {
		a.horizon, group = argv.Micros(fleetHorizon), 6
		keys = append(keys, s.sharesKey(id))
	}
	args = argv.Append(make([]any, 0, 21+group*len(batch)), &a)
	for _, p := range batch {
		r := reserveRequest{reservePair: reservePair{cost: p.cost, maxWait: maxWaitArg(p.limit, now)},
			level: p.turn.level, share: p.turn.share, tenant: p.turn.tenant, weight: p.turn.weight}
		if !ordered {
			args = argv.Append(args, &r.reservePair)
			continue
		}
		args = argv.Append(args, &r)
	}
	return keys, args, first
}

// reserveBeating runs the reservation script with a heartbeat beside it,
// in one pipeline: one round trip (see idleBeat). When Redis does not know
// the scripts yet (NOSCRIPT: a new or flushed server), one more round trip
// sends their source (EVAL, which also loads them), the pair again in one
// pipeline: a fleet that starts together on a new server pays one round
// trip each for the loading, not two (EVALSHA, then EVAL). A failed
// heartbeat changes nothing: the reservation's result decides.
func (s *shared) reserveBeating(ctx context.Context, keys []string, args []any) (any, error) {
	rc := s.pipeBeating(ctx, keys, args, (*redis.Script).EvalSha)
	if err := rc.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		rc = s.pipeBeating(ctx, keys, args, (*redis.Script).Eval)
	}
	return rc.Result()
}

// pipeBeating sends the reservation and a heartbeat in one pipeline, each
// by run (EVALSHA or EVAL), and records the heartbeat Redis took.
func (s *shared) pipeBeating(ctx context.Context, keys []string, args []any,
	run func(*redis.Script, context.Context, redis.Scripter, []string, ...any) *redis.Cmd) *redis.Cmd {
	pipe := s.rdb.Pipeline()
	now := caller.Now(s.clock)
	rc := run(s.reserveScript, ctx, pipe, keys, append(args, now)...)
	hc := s.member.Pipe(ctx, pipe, now, run)
	_, _ = pipe.Exec(ctx)
	if r, ok := s.member.Took(hc); ok {
		s.ann.Heard(r.Sharded)
	}
	return rc
}

// parseReserve checks and reads the script's reply: the pause left, the
// key's rate in units per second (a string), how many changes of the rate
// had moved its turns (see retimings), then a (code, wait) pair a request.
// A malformed reply is an error, never a panic.
func parseReserve(reply any, n int) ([]reserved, float64, error) {
	vals, ok := reply.([]any)
	if !ok || len(vals) != 3+2*n {
		return nil, 0, fmt.Errorf("malformed reply %v: want %d values", reply, 3+2*n)
	}
	rate, ok := parseRate(vals[1])
	if !ok {
		return nil, 0, fmt.Errorf("malformed reply %v: rate", reply)
	}
	moves, ok := vals[2].(int64)
	if !ok || moves < 0 {
		return nil, 0, fmt.Errorf("malformed reply %v: moves", reply)
	}
	out := make([]reserved, n)
	for i := range out {
		code, ok1 := vals[3+2*i].(int64)
		wait, ok2 := vals[4+2*i].(int64)
		if !ok1 || !ok2 || code < 0 || code > 4 || wait < 0 {
			return nil, 0, fmt.Errorf("malformed reply %v at request %d", reply, i)
		}
		r := reserved{code: int(code), wait: time.Duration(wait) * time.Microsecond, moves: uint64(moves)}
		if code == 3 { // admitted, a probe
			r.code, r.probe = 0, true
		}
		out[i] = r
	}
	return out, rate, nil
}

// pauseOf returns the pause left that a reply parseReserve accepted
// reports; 0 when none, or when it is not a non-negative integer.
func pauseOf(reply any) time.Duration {
	if vals, ok := reply.([]any); ok && len(vals) > 0 {
		if us, ok := vals[0].(int64); ok && us > 0 {
			return time.Duration(us) * time.Microsecond
		}
	}
	return 0
}

// pausedByBudget notes that key id is held for left, as a reservation
// said: when the key's shape is not known yet, the hold may be the
// budget's (see control.State.Spend), and the answer to the probe sent after
// it tells the shape, so that answer goes to the control script (see
// Learn).
func (s *shared) pausedByBudget(id string, left time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	if l, ok := s.learnt.M[id]; ok && l.shape == control.ShapeUnknown && !l.zeroUntil.After(now) {
		l.zeroAt, l.zeroUntil = now, now.Add(left+2*control.ProbeHold)
	}
}

// parseRate reads a rate a script returned as a string: positive and
// finite, or not ok.
func parseRate(v any) (float64, bool) {
	s, ok := v.(string)
	if !ok {
		return 0, false
	}
	r, err := strconv.ParseFloat(s, 64)
	return r, err == nil && r > 0 && !math.IsInf(r, 0)
}
