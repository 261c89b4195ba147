package egress

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/egress-go/egress/internal/argv"
	"github.com/egress-go/egress/internal/caller"
	"github.com/egress-go/egress/internal/control"
	"github.com/egress-go/egress/internal/keyspace"
)

// The shared limiters keep a key's controller state in Redis beside its
// bucket (see internal/control and its control.lua): the reservation
// script reads the learnt rate and the hold on every decision, so one
// instance's lesson holds for the fleet at once. Each instance keeps a
// little of it too (learntRate): the rate and shape the last reply said,
// and the key's recent outcomes, from which it estimates the limit.

// learntRate is what this instance knows of a key's controller. Guarded by
// the shared limiter's mu.
type learntRate struct {
	rate       float64       // units per second, from the last script reply
	seen       time.Time     // when
	shape      control.Shape // from the last control reply
	zeroAt     time.Time     // a "remaining 0" this instance sent to Redis
	zeroUntil  time.Time     // its reset
	advertised float64       // the advertised limit this instance last wrote
	wrote      time.Time     // when
	meter      control.Meter
	storm      control.Storm
	probes     [control.StormProbes]time.Time // the turns of this instance's last probes (see storm)
	report     *budgetReport                  // the latest count for the key's budget not yet sent to Redis
	refill     control.Refill                 // a bucket's rate, measured from its reports when it states none
	start      control.WindowStart            // when a window that sends no reset began (see Quota.impliedReset)
}

// budgetReport is a response's count that sets a key's budget (see
// control.State.report), or drains the fleet's bucket when the provider
// refills continuously (Decision.drain), waiting to go to Redis with the
// key's next reservation: no round trip of its own.
type budgetReport struct {
	remaining float64
	reset     time.Duration // from read
	unit      time.Duration // the reset over the limit; 0 when none
	read      time.Time     // when the response was read
	sent      time.Time     // when its request was sent; zero when unknown
	inFlight  float64       // the fleet's requests in flight, as estimated without the ring
	kind      control.Shape // what the reset means, as the dialect says
	limit     float64       // the quota's limit; -1 when it states none
}

// budgetReportOf returns the report a signal makes for the key's budget
// (or its bucket), or nil when it makes none: a requests quota with a
// reset, and, from a provider known to refill continuously, only on a
// success (a refusal's hold is the script's). The rest of the fleet's
// requests in flight are estimated as live instances times this
// instance's; the script counts them exactly, from the turns it granted,
// when it can (see report in internal/control/rate.lua).
func (s *shared) budgetReportOf(resp *control.Response, q control.Quota, hasQ bool, known control.Shape) *budgetReport {
	if !hasQ || !q.HasReset || q.Reset <= 0 || resp.Scope == control.ScopeBilling ||
		((known == control.ShapeBucket || q.Kind == control.ShapeBucket) && resp.Throttled) {
		return nil
	}
	r := &budgetReport{remaining: q.Remaining, reset: q.Reset, read: resp.Now, sent: resp.SentAt,
		inFlight: float64(resp.InFlight) * float64(s.member.Live()), kind: q.Kind, limit: -1}
	if q.HasLimit {
		r.limit = q.Limit
	}
	if q.HasLimit && q.Limit >= 1 {
		r.unit = time.Duration(float64(q.Reset) / q.Limit)
	}
	return r
}

// budgetArgs returns a report's arguments to a script run at now: the
// remaining (-1 for none), the reset left, the unit, how long ago its
// request was sent (-1 when unknown), the in-flight estimate, the kind, the
// limit (-1 for none), the reset's resolution.
func budgetArgs(r *budgetReport, now time.Time) budgetArgv {
	if r == nil || r.read.Add(r.reset).Before(now) {
		return budgetArgv{remaining: -1, ago: -1, limit: -1, resolution: argv.Micros(time.Second)}
	}
	ago := int64(-1)
	if !r.sent.IsZero() {
		ago = max(argv.Micros(now.Sub(r.sent)), 0)
	}
	return budgetArgv{
		remaining: r.remaining, reset: argv.Micros(r.reset - now.Sub(r.read)), unit: argv.Micros(r.unit), ago: ago,
		inFlight: r.inFlight, kind: int(r.kind), limit: r.limit, resolution: argv.Micros(control.ResetResolution(r.reset)),
	}
}

func (l *learntRate) AtRest(now time.Time) bool { return now.Sub(l.seen) > control.AdvertisedTTL }

// Rate returns the configured rate.
func (s *shared) Rate() Rate { return s.rate }

// EffectiveRate returns the rate key was held to in this instance's last
// decision on it (no Redis round trip): the configured rate, or lower when
// the provider advertised a lower limit or discovery lowered it, anywhere
// in the fleet.
func (s *shared) EffectiveRate(key string) Rate {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.learntRateLocked(keyspace.ID(key))
}

// learntRateLocked returns key id's rate as last seen. The caller holds mu.
func (s *shared) learntRateLocked(id string) Rate {
	if l, ok := s.learnt.M[id]; ok && l.rate < s.rate.PerSecond()*(1-1e-12) {
		return PerSecond(l.rate)
	}
	return s.rate
}

// seen records the rate a script reply gave for key id, and returns its
// state. The caller holds mu.
func (s *shared) seenLocked(id string, rate float64, now time.Time) *learntRate {
	l, ok := s.learnt.Get(id, now)
	if !ok {
		l = &learntRate{}
		s.learnt.Put(id, l)
	}
	l.rate, l.seen = rate, now
	return l
}

// seen records the rate a reservation reply gave for key id.
func (s *shared) seen(id string, rate float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	if _, ok := s.learnt.M[id]; !ok && rate >= s.rate.PerSecond() {
		return // nothing learnt: nothing to remember
	}
	s.seenLocked(id, rate, now)
}

// Learn implements Learner for the fleet: key's controller runs in Redis
// (one script call) when the response says something the fleet must know —
// an exhausted quota, an advertised limit not written lately, the answer to
// a "remaining 0" that tells the quota's shape — and in the process
// otherwise. While Redis is unreachable the fallback limiter learns instead.
func (s *shared) Learn(ctx context.Context, key string, sig Signal) Decision {
	if fb := s.fallback.Load(); fb != nil {
		return fb.limiter.(Learner).Learn(ctx, key, sig)
	}
	ctx = context.WithoutCancel(ctx)
	id := keyspace.ID(key)
	r := sig.response()
	h := s.record(id, &r)
	var d Decision
	if (h.ev == control.EvOther || h.ev == control.EvExhausted) && sig.RetryAfter > 0 {
		d.NotBefore = sig.Now.Add(sig.RetryAfter)
	}
	if !h.call {
		return d
	}
	c, err := s.control(ctx, id, &r, h.ev, h.q, h.hasQ, h.adv, h.est, h.rep, h.sign)
	if err != nil {
		d.Err = fmt.Errorf("egress: shared limiter %s: learn: %w", s.name, err)
		s.failed(err)
		if fb := s.fallback.Load(); fb != nil {
			fd := fb.limiter.(Learner).Learn(ctx, key, sig)
			fd.Err = d.Err
			return fd
		}
		return d
	}
	d.Hold = s.controlledLearn(id, &r, &h, c)
	if old, new := c.old, c.new; old != new {
		d.Old, d.New, d.Why = PerSecond(old), PerSecond(new), "advertised"
		switch {
		case h.stormStarts:
			d.Why = "storm"
		case new < old && h.ev == control.EvExhausted && r.Throttled:
			d.Why = "throttled"
		case new < old && h.ev == control.EvExhausted && h.adv == 0:
			// Levelled off: the provider's count showed no room (a level
			// the script decides on a count carried by a reservation is
			// not told: there is no Decision).
			d.Why = "counted"
		}
	}
	return d
}

// heardSignal is what Learn heard in a signal before the script's call.
type heardSignal struct {
	ev       control.Evidence
	q        control.Quota // the most restrictive request quota, when hasQ
	hasQ     bool
	adv, est float64       // the limit advertised (or measured), and the meter's estimate; 0 for none
	rep      *budgetReport // the count that sets the key's budget; nil for none
	// stormStarts: a storm starts with the signal; sign: the signal is a
	// sign of one (see control.Storm.NotQuota); call: the script must hear it now.
	stormStarts, sign, call bool
}

// record keeps resp in the key's learnt state (this instance's meter, the
// storm's probes, the shape a dialect or the meter tells) and returns what
// the script must be told, and whether now (a reservation carries a report
// that need not be told at once).
func (s *shared) record(id string, resp *control.Response) heardSignal {
	var h heardSignal
	q, implied, hasQ := resp.Quota, resp.Implied, resp.HasQuota
	h.ev, h.hasQ = control.Classify(resp, q, hasQ), hasQ
	if s.learn.Advertise {
		h.adv = resp.Advertised
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	l, ok := s.learnt.Get(id, now)
	if !ok {
		l = &learntRate{rate: s.rate.PerSecond(), seen: now}
		s.learnt.Put(id, l)
	}
	if hasQ {
		l.start.Narrow(&q, implied, resp.Now)
	}
	// More than twice the limit accepted in the last second, by this
	// instance alone: a bucket (see control.Meter.Outpaced). The script is told as
	// a dialect would tell it.
	seenBucket := l.shape == control.ShapeUnknown && hasQ && q.Kind == control.ShapeUnknown && l.meter.Outpaced(resp.Now, q)
	if seenBucket {
		q.Kind = control.ShapeBucket
		l.shape = control.ShapeBucket
	}
	l.meter.Add(resp.SentAt, h.ev == control.EvExhausted && resp.Throttled, resp.Status != 0 && !resp.Throttled)
	s.hearStorm(id, l, resp, &h, now)
	if l.shape == control.ShapeUnknown && hasQ && q.Kind != control.ShapeUnknown {
		l.shape = q.Kind // the dialect says; the script is told when it runs
	}
	if s.learn.Advertise {
		if measured := l.refill.Observe(q, l.shape == control.ShapeBucket); h.adv == 0 && hasQ {
			h.adv = measured // a bucket that states no rate: its reports measure it (see refill)
		}
	}
	if est, ok := l.meter.Estimate(now, l.rate); ok {
		h.est = est
	}
	h.q, h.rep = q, s.budgetReportOf(resp, q, hasQ, l.shape)
	h.call = s.mustCall(l, resp, &h, now) || seenBucket
	if h.call {
		l.report = nil // this call carries the latest
	} else if h.rep != nil {
		l.report = h.rep // for the next reservation
	}
	return h
}

// hearStorm tells whether resp, when a throttle without counts, is a
// storm's (into h), the key's learnt state being l: as the Go controller's
// control.Storm.NotQuota does. A hold heard from the fleet counts as this
// instance's own: the probes after it tell a storm apart as well. A probe
// is one the script told as one (the fleet's probes are parted in Redis,
// whatever this instance heard of the hold); the first requests after a
// hold, by time. Called with s.mu held.
func (s *shared) hearStorm(id string, l *learntRate, resp *control.Response, h *heardSignal, now time.Time) {
	if pm, ok := s.pauses[id]; ok && pm.probes > 0 && pm.until.After(l.storm.HoldEnd.Add(10*time.Millisecond)) && !pm.until.After(now) {
		l.storm.Held(pm.heard, pm.until, pm.probes, control.ProbeGap(s.learn.Floor))
	}
	if h.ev != control.EvExhausted || h.hasQ {
		return
	}
	probe := l.probe(resp.SentAt, s.learn.Floor)
	_, first := l.storm.After(resp.SentAt, l.rate)
	var other bool
	if other, h.stormStarts, h.sign = l.storm.NotQuota(resp, &l.meter, probe, first); other {
		h.ev = control.EvOther
	}
}

// mustCall reports whether the script must hear resp now, the key's learnt
// state being l: a throttle, a window's "remaining 0", the start of a
// storm, a new advertised limit, or an acceptance that tells the shape.
func (s *shared) mustCall(l *learntRate, resp *control.Response, h *heardSignal, now time.Time) bool {
	switch h.ev {
	case control.EvOther:
		return h.stormStarts // the decreases the storm caused were mistaken: undo them
	case control.EvExhausted:
		// A bucket refills continuously: a "remaining 0" it answers a
		// success with holds for one unit only, which the rate does anyway.
		return resp.Throttled || (l.shape != control.ShapeBucket && h.q.Kind != control.ShapeBucket)
	case control.EvNone:
		accepted := resp.Status >= 200 && resp.Status < 300
		return (h.adv > 0 && !(l.advertised == h.adv && now.Sub(l.wrote) < control.AdvertisedTTL/2)) ||
			(accepted && l.shape == control.ShapeUnknown && h.q.Kind == control.ShapeUnknown &&
				!l.zeroAt.IsZero() && resp.SentAt.After(l.zeroAt) && resp.SentAt.Before(l.zeroUntil))
	}
	return false
}

// controlledLearn keeps what the script decided on resp (c) in this
// instance: the hold, heard at once by this process's waiters; the rate,
// shape, storm and zero the key is known by. It returns the hold's end;
// zero for none.
func (s *shared) controlledLearn(id string, resp *control.Response, h *heardSignal, c controlled) (hold time.Time) {
	now := s.clock.Now()
	if c.held > 0 {
		hold = now.Add(c.held)
		s.heard(id, pauseMark{until: hold, heard: now, probes: c.probes, end: c.end})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.seenLocked(id, c.new, now)
	l.shape = c.shape
	if c.stormy && !now.Before(l.storm.Until) {
		l.storm.Until = now.Add(control.StormTTL) // another instance saw the storm
	}
	if c.held > 0 && c.probes > 0 {
		l.storm.Held(resp.Now, hold, c.probes, control.ProbeGap(s.learn.Floor))
	}
	if q := h.q; h.hasQ && q.HasRemaining && q.Remaining-float64(resp.InFlight) <= 0 && q.HasReset {
		l.zeroAt, l.zeroUntil = resp.Now, resp.Now.Add(q.Reset)
	}
	if h.adv > 0 {
		l.advertised, l.wrote = h.adv, now
	}
	return hold
}

// probedLocked records a probe turn of key id at at (see storm). The
// caller holds s.mu.
func (s *shared) probedLocked(id string, at time.Time) {
	if l, ok := s.learnt.M[id]; ok {
		copy(l.probes[1:], l.probes[:])
		l.probes[0] = at
	}
}

// probe reports whether a request sent at sent went at one of this
// instance's probe turns (see atTurn), at the floor rate or at the key's,
// whichever is less.
func (l *learntRate) probe(sent time.Time, floor float64) bool {
	gap := control.ProbeGap(floor)
	if gap == 0 || !(l.rate > 0) {
		return false
	}
	u := min(gap, time.Duration(float64(time.Second)/l.rate))
	for _, at := range l.probes {
		if control.AtTurn(sent, at, at, u) {
			return true
		}
	}
	return false
}

// control runs the control script for key id: one round trip.
func (s *shared) control(ctx context.Context, id string, resp *control.Response, ev control.Evidence, q control.Quota, hasQ bool, adv, est float64, rep *budgetReport, sign bool) (controlled, error) {
	a := controlArgv{
		configured: s.rate.PerSecond(), discover: argv.Flag(s.learn.Discover), c: s.learn.C, floor: s.learn.Floor, beta: s.learn.Beta,
		advertised: adv, advTTL: argv.Micros(control.AdvertisedTTL),
		exhausted: argv.Flag(ev == control.EvExhausted), throttled: argv.Flag(resp.Throttled),
		accepted: argv.Flag(resp.Status >= 200 && resp.Status < http.StatusMultipleChoices),
		ago:      -1, reset: -1, retryAfter: -1, remaining: -1, limit: -1,
		zero:     argv.Flag(hasQ && q.HasRemaining && q.Remaining-float64(resp.InFlight) <= 0),
		estimate: est, usable: s.usable, probeHold: argv.Micros(control.ProbeHold), channel: s.keyChannel(id), id: id,
		kind: int(q.Kind), other: argv.Flag(ev == control.EvOther), bare: argv.Flag(!hasQ), stormTTL: argv.Micros(control.StormTTL),
		budget: argv.Flag(rep != nil), sign: argv.Flag(sign),
	}
	if !resp.SentAt.IsZero() {
		a.ago = max(argv.Micros(resp.Now.Sub(resp.SentAt)), 0)
	}
	if hasQ && q.HasReset {
		a.reset = argv.Micros(q.Reset)
	}
	if resp.HasRetryAfter {
		a.retryAfter = argv.Micros(resp.RetryAfter)
	}
	if hasQ {
		a.remaining = q.Remaining
	}
	if hasQ && q.HasLimit {
		a.limit = q.Limit
	}
	if rep != nil {
		a.unit, a.inFlight = argv.Micros(rep.unit), rep.inFlight
	}
	probes, gap, long := s.throttleProbes(resp, hasQ)
	a.probes, a.probeGap, a.long = probes, argv.Micros(gap), argv.Flag(long)
	keys := s.redisKeys(id)
	var reply []any
	err := s.calls.Do(ctx, func(ctx context.Context) error {
		var err error
		reply, err = caller.Run(ctx, s.rdb, s.clock, s.controlScript, []string{keys[2], keys[1], keys[0], keys[3]}, argv.Append(make([]any, 0, 33), &a)...).Slice()
		return err
	})
	if err != nil {
		return controlled{}, err
	}
	return parseControl(reply)
}

// throttleProbes returns the probes after the hold that a throttle
// without counts sets (resp, hasQ false), after a sign or a long hold (see
// storm), which the control script arms for the fleet: how many, the gap
// between them, and whether the hold is long (see longHold). Another
// signal sets none.
func (s *shared) throttleProbes(resp *control.Response, hasQ bool) (k int, gap time.Duration, long bool) {
	if !hasQ && resp.Throttled {
		// (The hold without a Retry-After is a unit at the floor rate, or
		// at the key's, which is not below it: see unsaid.)
		hold := control.ProbeGap(s.learn.Floor)
		if resp.HasRetryAfter {
			hold = resp.RetryAfter
		}
		k, gap = control.Probing(s.learn.Floor, hold)
		long = control.LongHold(s.learn.Floor, hold)
	}
	return k, gap, long
}

// parseControl checks and reads the control script's reply: the rate
// before and after, the hold left, the shape, whether a storm is believed,
// how many probes follow the hold (see storm), and the hold's end on the
// server's clock (which names it: see heard). A malformed reply is an error,
// never a panic.
func parseControl(reply []any) (c controlled, err error) {
	if len(reply) == 7 {
		old, ok1 := parseRate(reply[0])
		new, ok2 := parseRate(reply[1])
		h, ok3 := reply[2].(int64)
		sh, ok4 := reply[3].(int64)
		st, ok5 := reply[4].(int64)
		k, ok6 := reply[5].(int64)
		e, ok7 := reply[6].(string)
		end, err := strconv.ParseInt(e, 10, 64)
		if ok1 && ok2 && ok3 && ok4 && ok5 && ok6 && ok7 && err == nil && h >= 0 && sh >= 0 && sh <= int64(control.ShapeBucket) &&
			(st == 0 || st == 1) && k >= 0 && k <= control.StormProbes && end >= 0 {
			return controlled{old: old, new: new, held: time.Duration(h) * time.Microsecond, shape: control.Shape(sh),
				stormy: st == 1, probes: int(k), end: end}, nil
		}
	}
	return controlled{}, fmt.Errorf("malformed reply %v", reply)
}

// controlled is what the control script decided.
type controlled struct {
	old, new float64       // the key's rate before and after
	held     time.Duration // the hold left; 0 for none
	shape    control.Shape
	stormy   bool  // a storm is believed
	probes   int   // the probes that follow the hold
	end      int64 // the hold's end, in us of the server's clock
}

// fallbackLearn is how the fallback limiter at rate share learns: as this
// limiter does, scaled to the share.
func (s *shared) fallbackLearn(share Rate) control.Config {
	lc := s.learn
	f := share.PerSecond() / s.rate.PerSecond()
	lc.Configured, lc.Floor = share.PerSecond(), lc.Floor*f
	lc.Fleet, lc.Burst = false, 0 // one instance's: no start-up collision
	return lc
}

// seedFallback returns the controller state a key starts with in the
// fallback limiter: the rate the fleet learnt for it, at the fallback's
// share, or nil when it learnt nothing.
func (s *shared) seedFallback(key string, now time.Time) *control.State {
	s.mu.Lock()
	l, ok := s.learnt.M[keyspace.ID(key)]
	rate := 0.0
	if ok {
		rate = l.rate
	}
	s.mu.Unlock()
	if !ok || rate >= s.rate.PerSecond() {
		return nil
	}
	f := math.Float64frombits(s.fallbackShare.Load())
	return &control.State{Advertised: rate * f, AdvertisedUntil: now.Add(control.AdvertisedTTL)}
}
