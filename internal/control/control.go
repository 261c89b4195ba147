// Package control is a key's controller: it turns what a response says (a
// Response, read by the root package from a Signal) into what the key does
// next (a Decision). It is a pure function of the key's State, the response
// and the time: the local limiters keep the State beside their buckets, the
// shared limiters keep the fleet's in Redis (control.lua applies the same
// rules in the same script that keeps the rate). Its choices:
//
//   - hold the key, for every request of the limiter (the fleet, when it is
//     shared), until a time: the provider's quota is exhausted;
//   - lower or raise the key's rate: the provider advertised its limit, or
//     throttled the key while it sent at its rate (discovery);
//   - delay only the request that got the signal: a throttle that is not
//     about the caller's quota (a lock, a shared resource, load shedding);
//   - nothing.
//
// It owns the rules and their arithmetic (the CUBIC climb back, the
// outcome meter, the storm, the send pace, the drain mark, the refill
// measure) and the tuning constants that internal/lua's tune.lua is
// generated from, and control.lua and rate.lua, the same rules and
// arithmetic for the fleet (embedded as Lua and RateLua; internal/lua
// composes the scripts from them), and the grammar of what those scripts
// tell the fleet on a key's channel (Told). It reads no clock, no
// header and no option, keeps no key, sends nothing, and imports nothing
// of the module but internal/clock's Later and Earlier: the root package
// reads a response into a Response (Signal.response), keeps each key's
// State beside its bucket, and applies the Decision. The rules, response
// by response, are in the README's "How egress learns a limit" and in the
// root's controller_test.go step tables, which controller_lua_test.go runs
// through this package and through control.lua on one fake clock.
package control

import (
	"math"
	"time"

	"github.com/egress-go/egress/internal/clock"
)

// Decision is what a key's controller decided after a response.
type Decision struct {
	// Hold is when the key's hold ends; zero: the response did not hold it.
	Hold time.Time
	// NotBefore is the earliest time the request that got the response may
	// be sent again; zero: no constraint.
	NotBefore time.Time
	// Old and New are the key's rate before and after the response, in
	// units per second, when it changed (Why is then set): see the root
	// package's Decision.
	Old, New float64
	Why      string
	// Drain: the provider's bucket holds Keep units as of the response
	// (its remaining less the requests still in flight, which will spend
	// it: below 0 when they are more); a limiter keeps no more in its own
	// (in debt, below 0), rather than hold the key.
	Drain bool
	Keep  float64
	// From and To: the key's rate before and after the response, told or
	// not (a climb sped by room is not told), in units per second.
	From, To float64
}

// Shape is what a key's reset means, as learnt from the provider, or as
// its dialect says (Quota.Kind; the values match ResetKind's).
type Shape uint8

const (
	// ShapeUnknown: nothing learnt yet. A "remaining 0" holds the key
	// briefly (ProbeHold); an acceptance before the reset shows a bucket.
	ShapeUnknown Shape = iota
	// ShapeWindow: the quota comes back at the reset, all at once.
	ShapeWindow
	// ShapeBucket: the provider refills continuously; the reset is when
	// its bucket is full again, the next unit comes after 1/rate.
	ShapeBucket
)

// Config is how a limiter's controllers learn: set by the limiter's
// options (WithAdaptive, WithoutDiscovery, WithoutAdvertisedLimits).
type Config struct {
	Configured float64 // the limiter's rate, units per second
	Discover   bool    // throttling lowers the rate (default on)
	Advertise  bool    // advertised limits lower the rate (default on)
	Beta       float64 // the decrease factor without an estimate
	C          float64 // CUBIC's constant, relative to the aim: 1/s³
	Floor      float64 // the lowest discovered rate, units per second
	// Fleet: the controller of a shared limiter, whose instances' first
	// requests may collide at start-up (see collides); burst is its usable
	// burst in units, 0 for a pacer. (The fleet's controller runs in
	// control.lua; this is its Go twin, run beside it on the same steps.)
	Fleet bool
	Burst float64
}

// State is one key's controller state. The zero value is a key that
// has learnt nothing.
type State struct {
	Advertised      float64   // units per second; 0 when none
	AdvertisedUntil time.Time // when the advertised limit is forgotten
	Wmax, W0        float64   // discovery: the aim of the climb back, and the rate right after the last decrease
	Plateau         float64   // seconds the climb stays at its aim before it grows beyond (see plateauFor)
	Good            float64   // a rate the provider accepted for a second before a throttle without counts; 0 for none (see aimBack)
	Back            time.Time // when the key tries good again; zero for never
	backN           int       // the tries of good refused since it was set
	Climb           time.Time // when the climb back starts (the decrease, or the end of its hold); zero for never
	Decreased       time.Time // when the last decrease was decided (or the end of the turns given before it)
	Hold            time.Time // the key is held until then
	Shape           Shape
	zeroAt          time.Time     // when a "remaining 0" (less the requests in flight) was last seen
	zeroUntil       time.Time     // the reset it came with
	zeroUnit        time.Duration // its reset over its limit: the longest a bucket takes to refill a unit; 0 when unknown
	zeroRes         time.Duration // its reset's resolution (ResetResolution)
	budget          float64       // the units that may still be granted before budgetUntil (see Spend)
	budgetUntil     time.Time     // the reset the budget came with; zero for none
	budgetRem       float64       // the provider's remaining the budget came with
	budgetSent      time.Time     // when the request of the report the budget came with was sent
	budgetRes       time.Duration // its reset's resolution (ResetResolution)
	budgetUnit      time.Duration // the report's reset over its limit; 0 when it states no limit
	ambiguous       uint8         // acceptances after a zero in a row that had the whole limit back (see learnShape)
	spentAgain      uint8         // acceptances after the zero, read within its reset's resolution, that said none was left (see learnShape)
	roomAgain       bool          // one of them, or another, said some was left, short of the whole limit
	Meter           Meter         // the key's recent outcomes, for the estimate of its limit
	Storm           Storm         // whether throttles without counts are about the quota
	refill          Refill        // a bucket's rate, measured from its reports when it states none
	start           WindowStart   // when a window that sends no reset began (see Quota.impliedReset)
	room            time.Time     // when a bucket's count last showed room (see roomy)
	RoomRate        float64       // the rate it was sent at then (see roomy)
	Sent            SendPace      // when the key's last requests went (see roomy)
	Drain           DrainMark     // the first count of a bucket below full (see DrainMark)
	bucketWait      time.Time     // the end of the latest Retry-After a refusal from a bucket stated (see bucketHold)
}

// Rate returns the key's rate at now: the configured one, lowered to the
// advertised limit and, after a decrease, to the CUBIC curve climbing back.
func (s *State) Rate(cfg *Config, now time.Time) float64 {
	r := cfg.Configured
	if s.Advertised > 0 && now.Before(s.AdvertisedUntil) {
		r = min(r, s.Advertised)
	}
	if cfg.Discover && !s.Climb.IsZero() {
		t := max(now.Sub(s.Climb).Seconds(), 0)
		c := max(Cubic(t, s.W0, s.Wmax, cfg.C, s.Plateau), cfg.Floor)
		if s.TriesBack(now) {
			c = max(c, Cubic(now.Sub(s.Back).Seconds(), AimUnder*s.Good, s.Good, cfg.C, 0))
		}
		r = min(r, c)
	}
	return r
}

// TriesBack reports whether the key tries good again at t (see aimBack):
// from back on, while good is above the climb's aim by BackOver or more.
// The try is a climb of its own, from AimUnder of good back to it (and
// beyond, as CUBIC's): sent at the very limit that came back, from a
// provider's bucket the key kept empty, the first request a millisecond
// early is refused (the fleet benchmark's local TokenBucket, in scenario
// B').
func (s *State) TriesBack(t time.Time) bool {
	return s.Good > BackOver*s.Wmax && !s.Back.IsZero() && !t.Before(s.Back)
}

// AtRest reports whether the state no longer matters at now, so that the
// key can be dropped.
func (s *State) AtRest(cfg *Config, now time.Time) bool {
	return !s.Hold.After(now) && s.Rate(cfg, now) >= cfg.Configured && now.Sub(s.Decreased) > AdvertisedTTL &&
		s.Shape == ShapeUnknown && s.zeroAt.IsZero() && !s.budgetUntil.After(now)
}

// Cubic is the CUBIC rate t seconds after a decrease to w0: w0 at t = 0,
// levelling off at wmax at t = K, staying there plateau seconds more, and
// growing beyond. c is relative to wmax, so that the curve's shape does
// not depend on the rate's scale.
func Cubic(t, w0, wmax, c, plateau float64) float64 {
	if wmax <= 0 {
		return w0
	}
	k := cubicK(w0, wmax, c)
	if t > k {
		t = max(k, t-plateau)
	}
	return wmax + c*wmax*math.Pow(t-k, 3)
}

// cubicK is K, the seconds the CUBIC climb from w0 takes to reach wmax
// (wmax above 0).
func cubicK(w0, wmax, c float64) float64 {
	return math.Cbrt(max(wmax-w0, 0) / (c * wmax))
}

// Evidence is what a signal means for the key's controller.
type Evidence uint8

const (
	EvNone      Evidence = iota // nothing to act on
	EvExhausted                 // the key's quota is exhausted: hold
	EvOther                     // throttled for another reason: delay only this request
	EvBilling                   // a billing error: neither hold nor retry
)

// ProbeHold is how long a "remaining 0" holds a key whose reset's meaning
// is not known yet, when that is shorter than the reset: a request accepted
// after it, before the reset, shows a bucket (see learnShape).
const ProbeHold = 100 * time.Millisecond

// Learn applies the response s at s.Now to the key's state and decides. A
// response that says nothing of the limit (Silent) is only counted
// (Quiet): the allowed path's, whose reading LearnAll would make at a
// third of the path's cost, to decide nothing.
func (st *State) Learn(cfg *Config, s *Response) Decision {
	if st.Silent(s) {
		st.Quiet(s.SentAt)
		return Decision{}
	}
	return st.LearnAll(cfg, s)
}

// LearnAll is Learn for any response: TestQuietIsLearn holds Quiet to it.
func (st *State) LearnAll(cfg *Config, s *Response) Decision {
	now := s.Now
	var d Decision
	old := st.Rate(cfg, now)
	q, implied, hasQ := s.Quota, s.Implied, s.HasQuota
	if hasQ {
		st.start.Narrow(&q, implied, s.Now)
	}
	ev, collision, stormStarts := st.hear(cfg, s, q, hasQ, old)
	if cfg.Advertise {
		st.believe(s, q, hasQ, old)
	}
	roomy, levelled := false, false
	switch ev {
	case EvOther:
		if s.RetryAfter > 0 {
			d.NotBefore = now.Add(s.RetryAfter)
		}
	case EvNone:
		// A bucket's count on a success, less the requests in flight: the
		// limiter keeps no more than that in its own (Decision.drain).
		if st.Shape == ShapeBucket && hasQ && !s.Throttled {
			d.Drain, d.Keep = true, q.Remaining-float64(s.InFlight)
			roomy = q.HasLimit && q.Limit >= 2 && q.HasReset && d.Keep >= q.Limit-1
			levelled = st.counted(cfg, s, q, false, old)
		}
	case EvExhausted:
		levelled = st.exhausted(cfg, s, q, hasQ, old, collision, &d)
	}
	d.From, d.To = old, st.Rate(cfg, now)
	if new := d.To; new != old {
		d.Old, d.New, d.Why = old, new, "advertised"
		switch {
		case stormStarts:
			d.Why = "storm"
		case new < old && ev == EvExhausted && s.Throttled:
			d.Why = "throttled"
		case levelled:
			d.Why = "counted" // levelled off: the provider's counts showed no room, or fell
		}
	}
	if roomy {
		// (after the rate change is told: a faster climb back is a climb
		// back, whose rates in between are not told either)
		if st.roomy(cfg, now, old) {
			d.To = st.Rate(cfg, now)
		}
	}
	return d
}

// Plain reports whether a response says nothing of a key's limit,
// whatever the key has learnt: an answer (status not 0) that is no
// throttle (throttled) and no billing error (scope), with no quota of any
// dimension (counts). The root package asks it of a Signal before it reads
// one into a Response (see Silent).
func Plain(counts bool, status int, scope Scope, throttled bool) bool {
	return !counts && status != 0 && scope != ScopeBilling && !throttled
}

// Silent reports whether s says nothing of the key's limit to st: it is
// Plain, and the key does not listen for the meaning of its reset
// (Listens). Learn's reading of such a response comes to Quiet's, and
// decides nothing.
//
// The reasoning, step by step through Learn: no quota, so Classify says
// EvNone, and the request was accepted; learnShape has nothing to learn
// (no quota to outpace, and no zero whose meaning a 2xx would tell);
// report, with no quota, only forgets a bucket's budget (a bucket has
// none); the meter counts an acceptance at s.SentAt, and the bucket's
// drain mark a success; what Learn does for an exhausted key (a storm's
// probes, a hold, a decrease) does not run; no limit is advertised and
// Refill.Observe finds no bounds (no quota); EvNone decides nothing
// without a quota. The rate is a function of fields none of these change,
// so the decision is no change of it: no hold, no wait, no drain. Nothing
// there reads s.Now either: a Transport need not read the clock for it
// (see the root's TokenBucket.learnAt). TestQuietIsLearn checks this
// against Learn, on states that Learn built.
func (st *State) Silent(s *Response) bool {
	return Plain(s.Counts, s.Status, s.Scope, s.Throttled) && !st.Listens()
}

// Listens reports whether the key waits for an answer that tells what its
// reset means: no shape learnt, and a "remaining 0" heard (see
// learnShape). Until then even a plain response is read whole.
func (st *State) Listens() bool {
	return st.Shape == ShapeUnknown && !st.zeroAt.IsZero()
}

// Quiet applies a response that is silent (see Silent), to a request sent
// at sent, to the key's state, as Learn would. What it skips is the
// reading (the quota, the classification, the shape, the advertised
// limit), not what is recorded: the meter and the drain mark feed later
// decisions (estimate, aimBack, counted), and the send pace was recorded
// at the grant (Spend).
func (st *State) Quiet(sent time.Time) {
	if st.Shape == ShapeBucket {
		st.budget, st.budgetUntil, st.budgetUnit = 0, time.Time{}, 0
	}
	st.Meter.Add(sent, false, true)
	st.Drain.N++
}

// hear records what s says of the key (its quota q, when hasQ), the key
// being at rate old: its evidence, the provider's shape, the report's
// budget, the key's meter and the storm. It returns the evidence (a
// throttle a storm explains is EvOther), whether s is a start-up collision
// (see collides), and whether a storm starts with it.
func (st *State) hear(cfg *Config, s *Response, q Quota, hasQ bool, old float64) (ev Evidence, collision, stormStarts bool) {
	ev = Classify(s, q, hasQ)
	collision = cfg.Fleet && st.collides(cfg, s, ev, old)
	if hasQ && q.Kind != ShapeUnknown {
		st.Shape = q.Kind // the dialect says what its reset means
	} else {
		st.learnShape(s, q, hasQ, collision)
	}
	st.report(s, q, hasQ)
	st.Meter.Add(s.SentAt, ev == EvExhausted && s.Throttled, s.Status != 0 && !s.Throttled)
	if s.Status != 0 && !s.Throttled {
		st.Drain.N++ // accepted: it took a unit from the provider's bucket
	}
	if ev == EvExhausted && !hasQ {
		probe, first := st.Storm.After(s.SentAt, old)
		if other, entered, _ := st.Storm.NotQuota(s, &st.Meter, probe, first); other {
			ev, stormStarts = EvOther, entered
			if entered {
				// The decreases the storm caused were mistaken.
				st.Wmax, st.W0, st.Climb, st.Plateau = 0, 0, time.Time{}, 0
				st.stopTrying()
			}
		}
	}
	return ev, collision, stormStarts
}

// believe takes the limit s advertises (or, for a bucket that states no
// rate, the refill its reports measure) as the key's, for AdvertisedTTL;
// the key is at rate old.
func (st *State) believe(s *Response, q Quota, hasQ bool, old float64) {
	adv := s.Advertised
	if measured := st.refill.Observe(q, st.Shape == ShapeBucket); adv == 0 && hasQ {
		adv = measured // a bucket that states no rate: its reports measure it
	}
	if adv > 0 {
		st.Advertised, st.AdvertisedUntil = adv, s.Now.Add(AdvertisedTTL)
		if adv < old {
			// Throttles to requests sent before this lowering belong
			// to the old rate: they lower nothing further.
			st.Decreased = s.Now
		}
	}
}

// exhausted decides, into d, on s that says the key's quota is exhausted
// (its quota q, when hasQ; the key at rate old): a bucket's drain, the
// hold, the request's own wait, and discovery's decrease (none for a
// start-up collision). It reports whether a bucket's count levelled the
// climb off (see counted).
func (st *State) exhausted(cfg *Config, s *Response, q Quota, hasQ bool, old float64, collision bool, d *Decision) (levelled bool) {
	now := s.Now
	// A bucket that says "nothing left" on a success (nothing once the
	// requests in flight are counted) is empty now, or owes: the
	// limiter empties its own (Decision.drain) rather than hold.
	d.Drain = st.Shape == ShapeBucket && !s.Throttled
	if d.Drain && hasQ {
		d.Keep = min(q.Remaining-float64(s.InFlight), 0)
		levelled = st.counted(cfg, s, q, true, old)
	}
	// A hold only ever extends: Decision.Hold says it was.
	if until := st.holdUntil(cfg, s, q, hasQ, old, collision); until.After(st.Hold) && until.After(now) {
		st.Hold, d.Hold = until, until
		if !hasQ {
			k, gap := st.Storm.probing(now, until, cfg.Floor)
			st.Storm.Held(now, until, k, gap)
		}
	}
	if s.RetryAfter > 0 {
		d.NotBefore = now.Add(s.RetryAfter)
	}
	// An advertised limit is believed: a throttle at it holds the key
	// and lowers nothing (discovery is for limits nobody states).
	advertised := st.Advertised > 0 && now.Before(st.AdvertisedUntil)
	if !s.Throttled || !cfg.Discover || advertised || collision || !(st.Decreased.IsZero() || s.SentAt.After(st.Decreased)) {
		return levelled
	}
	if st.TriesBack(s.SentAt) && s.SentAt.Before(st.Back.Add(Sustained)) {
		st.backOff(now)
		return levelled
	}
	var b bounds
	if hasQ && st.Shape == ShapeBucket {
		b.lo, b.hi, b.ok = BucketBounds(q)
	}
	st.decrease(cfg, now, old, !hasQ, s.HasRetryAfter && s.RetryAfter > ProbeGap(cfg.Floor), b)
	return levelled
}

// collides reports whether the refusal s, to a key at rate, is a start-up
// collision of a fleet: a refusal to a request sent in the key's first
// second (from its first grant) at the configured rate, that asks a wait
// of a second at most, while the refusals of the last second (this one
// too) are few: no more than the burst (two for a pacer), or a tenth of the
// units granted in that second. A fleet's instances open their connections
// together and their first requests land late, side by side; that says
// nothing of the limit, nor of the provider's shape. Such a refusal lowers
// nothing and tells no shape (learnShape), and while the shape is not
// known and the refusal carries a count, it holds the key a unit at the
// rate (holdUntil) rather than for the Retry-After; the refused request
// still waits its own Retry-After. More refusals, or one after the first
// second, are heard as any other: a limit configured at twice the
// provider's is refused half its turns once its burst is gone. (Held for
// the second and lowered by beta, a fleet of 64 lost an eighth of a
// ten-second run to one collision at start; 256 instances draw one to
// fourteen such refusals in the first half second, and read as a window's,
// they held the fleet for a second.)
//
// control.lua applies the rule to the fleet; the grants it counts are its
// ring's, by slots of 10 ms, where these are the last 32 grants of
// SendPace (fewer than the units granted when more went in the second: a
// stricter test). A turn given in the first second is the start's when it
// is sent after it too: the fleet's script gives turns ahead, and 256
// instances queue theirs up to 1.3 s from the start, where a refusal sent
// at 1.2 s lowered the fleet to 140/s of its 200: about 5% of a 10-second
// run. So the script keeps the latest turn the first second gave before
// any refusal was heard (given blind; hend, up to CollisionQueue past the
// second). Not after one: turns given once the fleet has heard refusals
// are the limit's to judge (a fleet configured at twice its provider's
// limit, without its headers, queues its first second's turns behind the
// start's collisions, and forgiving their refusals at 1.1 s slowed its
// climb: 92% of the limit over the last 5 s where it used 97%). A local
// limiter gives a turn as it grants it (Spend): the turns it gave in the
// first second were all sent in it.
func (st *State) collides(cfg *Config, s *Response, ev Evidence, rate float64) bool {
	first := st.Sent.First
	if ev != EvExhausted || !s.Throttled || s.SentAt.IsZero() || rate < cfg.Configured ||
		s.HasRetryAfter && s.RetryAfter > CollisionSpan ||
		first == 0 || s.SentAt.UnixNano() >= first+int64(CollisionSpan) {
		return false
	}
	_, ref := st.Meter.LastSecond(s.Now)
	r := float64(ref) + 1 // this one, which the meter counts next
	to := s.Now.UnixNano()
	return r <= max(CollisionMin, cfg.Burst) || r <= CollisionShare*st.Sent.units(max(to-int64(time.Second), first), to)
}

// CollisionSpan is the start-up a collision belongs to (the key's first
// second), and the longest wait it asks; CollisionQueue the furthest past
// it that a turn given in it may lie and still be the start's (a fleet's
// turns are given ahead: see collides); CollisionMin and CollisionShare
// are the refusals of the last second that are few: up to the burst, at
// least CollisionMin, or up to CollisionShare of the units granted (see
// collides).
const (
	CollisionSpan  = time.Second
	CollisionQueue = time.Second
	CollisionMin   = 2
	CollisionShare = 0.1
)

// Classify reads what a signal means for the key, q being its most
// restrictive request quota (when hasQ).
func Classify(s *Response, q Quota, hasQ bool) Evidence {
	switch {
	case s.Scope == ScopeBilling:
		return EvBilling
	case s.notAboutQuota(q, hasQ):
		// The provider says, or its own count shows, that the quota is
		// not the reason.
		return EvOther
	case s.Throttled:
		return EvExhausted
	case hasQ && q.Remaining-float64(s.InFlight) <= 0 && q.HasReset && q.Reset > 0:
		// Nothing left, or the requests in flight, which the provider has
		// not counted yet, will spend what is left.
		return EvExhausted
	}
	return EvNone
}

// learnShape learns what the key's reset means from a response to a request
// sent after a "remaining 0" (or nothing left once the requests in flight
// are counted) and before its reset: accepted with less than its whole
// limit back (or twice in a row with it back), the provider refills
// continuously (a bucket). A refusal mostly proves nothing — a bucket
// refuses too while it is sent to faster than it refills — except when the
// request was sent a unit's refill or more after the zero, a unit being
// the reset over the limit (the slowest a bucket that reports them
// refills; a reset rounded up makes it slower still): then it is a
// window. Otherwise a window is known only from its dialect (Quota.Kind);
// until then the key is held as holdUntil says of an unknown shape. Without
// a zero, a quota the key's meter shows outpaced (meter.outpaced) is a
// bucket too. A shape learnt is kept. A start-up collision tells nothing
// (see collides).
func (st *State) learnShape(s *Response, q Quota, hasQ, collision bool) {
	if st.Shape == ShapeUnknown && hasQ && st.Meter.Outpaced(s.Now, q) {
		st.Shape, st.ambiguous = ShapeBucket, 0
		st.zeroAt, st.zeroUntil = time.Time{}, time.Time{}
		return
	}
	if st.Shape != ShapeUnknown || st.zeroAt.IsZero() || !s.SentAt.After(st.zeroAt) || !s.SentAt.Before(st.zeroUntil) {
		return
	}
	switch {
	case s.Status >= 200 && s.Status < 300:
		if !s.Now.Before(st.zeroUntil.Add(-st.zeroRes)) {
			// Read a resolution or less before the reset: a window whose
			// reset was rounded up (whole seconds), or whose report was
			// read late, may have reset before this request arrived.
			// Nothing is learnt from one such answer. Two that each say
			// none is left (the requests in flight not counted), and one
			// that said some was left, short of the whole limit, are a
			// bucket's: a window that reset accepts until it is spent,
			// and refuses after that until its next reset, past this
			// zero's. (Without this, a bucket of two units that states
			// its reset in whole seconds, "0 left, full in 1 s" after
			// every other request, was held for the probe at every zero:
			// 17 a second of its 50. A bucket of one unit, which never
			// says any is left, is still held for the probe: taken for a
			// bucket at a limit it advertises, it was sent to at that
			// limit and refused a third of the time.)
			if hasQ && q.Remaining == 0 {
				st.spentAgain++
			} else if hasQ && q.Remaining >= 1 && q.HasLimit && q.Remaining < q.Limit-1 {
				st.roomAgain = true
			}
			if st.spentAgain >= 2 && st.roomAgain {
				st.Shape, st.ambiguous, st.spentAgain, st.roomAgain = ShapeBucket, 0, 0, false
				st.zeroAt, st.zeroUntil = time.Time{}, time.Time{}
			}
			return
		}
		// Unless the whole limit came back at once: a window that reset
		// before the time it stated (rounded up to the second), or a
		// small bucket full again. The first answer after a zero tells;
		// twice in a row such an answer is a bucket's (a window resets
		// within the probe's hold only by chance).
		st.zeroAt, st.zeroUntil = time.Time{}, time.Time{}
		if hasQ && q.HasLimit && q.Remaining >= q.Limit-1 {
			if st.ambiguous++; st.ambiguous < 2 {
				return
			}
		}
		st.Shape, st.ambiguous = ShapeBucket, 0
	case s.Throttled && hasQ && q.Remaining == 0 && s.Scope != ScopeOther && !collision &&
		st.zeroUnit > 0 && s.SentAt.Sub(st.zeroAt) >= st.zeroUnit:
		// Refused a unit's refill or more (the reset over the limit, the
		// slowest a bucket that states them can refill) after it said
		// nothing was left: no bucket, a window.
		st.Shape, st.ambiguous = ShapeWindow, 0
	}
}

// holdUntil returns until when an exhausted quota holds the key: a window
// until its reset (or the Retry-After, if later); a bucket until its next
// unit, or its Retry-After when a unit is known to fall short (see
// bucketHold; the request that got a throttle waits its own Retry-After,
// through NotBefore); a shape not yet known for the Retry-After, or briefly
// (ProbeHold) when there is none, so that the next request tells; a
// throttle with no count at all for its Retry-After, or one unit. rate is
// the key's rate in units per second. A start-up collision with a count,
// while the shape is not known, holds the key a unit more (see collides).
func (st *State) holdUntil(cfg *Config, s *Response, q Quota, hasQ bool, rate float64, collision bool) time.Time {
	now := s.Now
	if collision && hasQ && st.Shape == ShapeUnknown {
		// A unit more for each such refusal: the provider had one unit
		// less than the limiter counted.
		return clock.Later(st.Hold, now).Add(time.Duration(float64(time.Second) / rate))
	}
	if !hasQ || !q.HasReset {
		if s.HasRetryAfter {
			return now.Add(s.RetryAfter)
		}
		return now.Add(unsaid(cfg.Floor, rate, !hasQ && s.Throttled))
	}
	reset := q.Reset
	if q.Remaining-float64(s.InFlight) <= 0 && !st.zeroUntil.After(now) {
		// (The first zero counts until its reset: the answers to requests
		// sent before it, heard later, do not move it on.)
		st.zeroAt, st.zeroUntil, st.zeroUnit, st.zeroRes = now, now.Add(reset), st.budgetUnit, ResetResolution(reset)
		st.spentAgain, st.roomAgain = 0, false
	}
	switch st.Shape {
	case ShapeWindow:
		// Until the reset, or the earliest end a report of the same window
		// stated (the budget's: see report).
		end := now.Add(reset)
		if st.budgetUntil.After(now) && st.budgetUntil.Before(end) {
			end = st.budgetUntil
		}
		return clock.Later(end, now.Add(s.RetryAfter))
	case ShapeBucket:
		if !s.Throttled {
			return now // a success: the limiter's own pacing is the wait (see Drain)
		}
		return st.bucketHold(s, q, rate, st.Advertised > 0 && now.Before(st.AdvertisedUntil))
	}
	// Not known yet: hold briefly, so that the next request (one: the
	// budget's probe) tells; a throttle's own Retry-After holds the key all
	// the same.
	if st.budgetUntil.After(now) {
		st.budget = 1
	}
	return now.Add(max(s.RetryAfter, probeFor(reset, rate)))
}

// bucketHold returns until when a refusal s from a bucket (its quota q,
// with a reset) holds the key at rate units per second: a unit at the
// rate, as a bucket that refills continuously has its next unit by then;
// until the refusal's Retry-After when that unit is known to fall short —
// the key was sent faster than the report says the bucket can refill at
// all (above its upper bound, see BucketBounds; unless a limit advertised
// or measured is believed, which the key's rate keeps to), or the request
// was sent before an earlier refusal's Retry-After ended: the bucket said
// nothing would come back before then. Such a bucket refills in steps (Anthropic's
// small buckets: every second, or every quarter second), or far slower
// than the key: each request a unit apart until the next step is refused
// too, and each lowered the rate once more. The Retry-After holds no longer
// than the bucket's reset less its resolution, the soonest it may be full
// again, after which its refill would be lost (a bucket full again within
// the resolution, whose whole-second Retry-After says nothing of its unit,
// is held for the unit only); a Retry-After rounded up to the second costs
// no more than the rest of that second, which the bucket keeps.
func (st *State) bucketHold(s *Response, q Quota, rate float64, believed bool) time.Time {
	now := s.Now
	hold := now.Add(min(q.Reset, time.Duration(float64(time.Second)/rate)))
	sent, said := s.SentAt, st.bucketWait
	if sent.IsZero() {
		sent = now
	}
	if s.HasRetryAfter {
		st.bucketWait = clock.Later(st.bucketWait, now.Add(s.RetryAfter))
	}
	if _, hi, ok := BucketBounds(q); sent.Before(said) || (ok && !believed && rate > hi) {
		hold = clock.Later(hold, now.Add(min(s.RetryAfter, q.Reset-ResetResolution(q.Reset))))
	}
	return hold
}

// unsaid is how long a throttle without a Retry-After holds a key at rate
// units per second: a unit at the rate; for one that says nothing at all
// (bare: no count either), at least a unit at the floor rate, so that the
// first request after the hold is a probe (see Storm). (Held a unit at
// the rate, a storm of bare 429s went untold, each of them lowered the
// rate, and the key sent at its floor: a seventh of what a client that
// only backs off sent.)
func unsaid(floor, rate float64, bare bool) time.Duration {
	unit := time.Duration(float64(time.Second) / rate)
	if bare {
		unit = max(unit, ProbeGap(floor))
	}
	return unit
}

// probeFor is how long a key of unknown shape whose quota is exhausted
// until reset is held before a probe, at rate units per second.
func probeFor(reset time.Duration, rate float64) time.Duration {
	return min(reset, max(ProbeHold, time.Duration(float64(time.Second)/rate)))
}

// report keeps what a report leaves of a window's quota, or of one whose
// shape is not known yet, as the key's budget: its remaining less the
// requests in flight (which the provider has not counted yet and which
// will spend it), until its reset. A later report replaces it: the
// provider's count is the truth, and the budget is never more than what it
// says remains; of the same window (a count no higher), the earliest end
// any report stated stays. A bucket has no budget: it refills continuously
// (see Decision.drain); neither has a report with neither a reset nor a
// window that implies one (nothing says when the quota comes back).
func (st *State) report(s *Response, q Quota, hasQ bool) {
	if st.Shape == ShapeBucket {
		st.budget, st.budgetUntil, st.budgetUnit = 0, time.Time{}, 0
		return
	}
	if !hasQ || !q.HasReset || q.Reset <= 0 || s.Scope == ScopeBilling {
		return
	}
	if st.budgetUntil.After(s.Now) && q.Remaining > st.budgetRem && !s.SentAt.IsZero() && s.SentAt.Before(st.budgetSent) {
		// A higher count, read late, of a request sent before the budget's
		// own: the provider counted it first, and the budget's report
		// counts after it. It gives nothing back. (Taken for a window that
		// reset, two such answers read after a "remaining 0" let two
		// requests go beside the probe at the hold's end, which a window
		// refuses: TestControllerBudgetSteps. Answers are read out of order
		// often on a machine short of CPU, where Zendesk/late met three
		// refusals at a hold's end now and then.) The fleet's script needs
		// no such rule: its budget is the count less the turns given since
		// the reported request was sent (rate.lua's report), which hold the
		// requests the provider counted after it.
		return
	}
	until := s.Now.Add(q.Reset)
	if st.budgetUntil.After(s.Now) && q.Remaining <= st.budgetRem && st.budgetUntil.Before(until) {
		// The same window (its count has not come back): it ends the
		// earliest any of its reports said. A reset rounded up ends later
		// than the real one, and a window's implied reset is narrowed only
		// by the answers that dated its start (a fleet's other instances
		// report a whole window).
		until = st.budgetUntil
	}
	st.budget, st.budgetUntil, st.budgetUnit, st.budgetRem = q.Remaining-float64(s.InFlight), until, 0, q.Remaining
	st.budgetSent = s.SentAt
	st.budgetRes = ResetResolution(q.Reset)
	if q.HasLimit && q.Limit >= 1 {
		st.budgetUnit = time.Duration(float64(q.Reset) / q.Limit)
	}
}

// Spend takes cost units of the key's budget for a request granted at now,
// its turn in the limiter's schedule being turn (now, or earlier when its
// waiter woke late), and reports whether they were there. When they were
// not, the key is held: a window until the budget's reset; a key whose
// shape is not known yet briefly (as a "remaining 0" holds it), after
// which one request goes, whose answer tells the shape. rate is the key's
// rate in units per second. Without a budget, or past its reset,
// everything is granted. A request granted while the probes after a hold
// go holds the key a gap after its turn (see Storm).
func (st *State) Spend(now, turn time.Time, cost int, rate float64) bool {
	budgeted := st.budgetUntil.After(now) && st.Shape != ShapeBucket
	if budgeted && st.budget < float64(cost) {
		if !st.zeroUntil.After(now) {
			st.zeroAt, st.zeroUntil, st.zeroUnit = now, st.budgetUntil, st.budgetUnit
			st.zeroRes, st.spentAgain, st.roomAgain = st.budgetRes, 0, false
		}
		if st.Shape == ShapeWindow {
			st.Hold = clock.Later(st.Hold, st.budgetUntil)
		} else {
			st.Hold = clock.Later(st.Hold, now.Add(probeFor(st.budgetUntil.Sub(now), rate)))
			st.budget = float64(cost) // the probe, after the hold
		}
		return false
	}
	if budgeted {
		st.budget -= float64(cost)
	}
	st.Sent.add(now, cost)
	// A probe after a hold: the next request goes a gap later (see Storm).
	if next := st.Storm.Space(now, turn); !next.IsZero() {
		st.Hold = clock.Later(st.Hold, next)
	}
	return true
}

// decrease lowers the key's rate after a throttle at rate w: to just under
// the limit the key's recent outcomes show (the share of its requests the
// provider accepted, times the rate they were sent at; at most to beta twice
// in one decrease), or by beta when there are too few of them (by NearBeta
// near a limit found before, the climb back then aiming at NearAim of w; by
// beta twice after a bare throttle early in the climb that asked for a wait,
// see early); and the climb back aims at that limit, or without an estimate
// at w (CUBIC's fast convergence when it is below the last aim, RFC 8312
// §4.6), AimUnder under it unless the key is a bucket. A bucket's refused
// report (b: see BucketBounds) that puts its refill under that aim moves
// the aim, and the start when it is above, to the least the bucket surely
// refills: from ten times a small bucket's rate, each decrease by beta took
// a refusal of its own. bare: the throttle carried no count at all; waits:
// it asked for a wait (Retry-After) longer than a unit at the floor rate,
// the hold of a throttle that says nothing (see unsaid).
func (st *State) decrease(cfg *Config, now time.Time, w float64, bare, waits bool, b bounds) {
	wmax, w0 := w, cfg.Beta*w
	deepest := cfg.Beta * cfg.Beta * w // the lowest one decrease goes
	if est, ok := st.Meter.Estimate(now, w); ok && est < w {
		// One decrease goes at most to beta twice: outcomes far below
		// that were not sent at w. A TokenBucket's start burst of ten,
		// all at once, to a provider with no burst drew eight refusals,
		// and three refusals later, still in the meter's last second,
		// they made an estimate of 20/s at 75/s; a limit that low is
		// found by the next refusal. (The rate went to 18/s, and the
		// climb back took the rest of scenario G of the fleet
		// benchmark: 42 to 50% of its limit over the last 5 s.)
		wmax = max(est, deepest/EstimateMargin)
		w0 = wmax * EstimateMargin
	} else if bare && waits && early(st.W0, st.Wmax, w) {
		wmax, w0 = cfg.Beta*w, deepest
		if st.Shape != ShapeBucket {
			wmax *= AimUnder
		}
	} else {
		if w < st.Wmax {
			wmax = w * (1 + cfg.Beta) / 2
		}
		if st.Shape != ShapeBucket {
			wmax *= AimUnder
		} else if st.Wmax > 0 && w > NearLow*st.Wmax && w < NearLimit*st.Wmax {
			// Near a limit found before: gently, and aiming just under the
			// rate refused, which is above the limit. (Aimed at w, the
			// climb is back above the limit as soon as it levels off, and
			// probes it by a refusal every few seconds.)
			w0 = max(w0, NearBeta*w)
			wmax = max(NearAim*w, w0)
		}
	}
	if b.ok && b.hi < wmax {
		// The refused report says the bucket refills no faster than b.hi,
		// under the aim: the climb starts again from the least it surely
		// refills, b.lo, and grows beyond it as CUBIC does, steered by the
		// counts (see roomy and counted).
		wmax = b.hi
		if b.lo > 0 {
			wmax = b.lo
		}
		w0 = min(w0, wmax)
	}
	st.Wmax, st.W0 = wmax, max(w0, cfg.Floor)
	st.Decreased = now
	st.Climb = clock.Later(now, st.Hold)
	st.Plateau = 0
	if bare {
		st.Plateau = plateauFor(st.Climb.Sub(now), st.W0, st.Wmax, cfg.C)
		st.aimBack(now, w, st.Climb.Sub(now))
	}
}

// bounds are the bounds a bucket's report puts on its refill rate (see
// BucketBounds); ok false for none.
type bounds struct {
	lo, hi float64
	ok     bool
}

// aimBack schedules, after a decrease from w by a throttle without counts
// that held the key for held, when the key tries again the rate the
// provider accepted before its limit fell. A throttle at w after a second
// of acceptances (the provider accepted half of w or more, and refused
// nothing else, over the second before) says the limit was w a moment
// ago: a limit that fell (a provider shedding load, a quota shared with
// others) is likely to rise again, and without counts nothing but a
// request above the rate shows that it did. So BackHolds of the key's
// holds after the last hold's end, the key goes at about good again (see
// triesBack), when that is BackOver or more above the aim of its climb.
// Accepted for a second, the rate stays (a throttle after that is a
// decrease from it); refused, the try cost one hold, the rate goes back
// to the climb, and the next try waits twice as long (backOff), until
// the wait would be over MaxPlateau: then the key stops trying good. A
// decrease of the climb's own puts a try due sooner than two holds after
// its hold off until then. A limit that did not move costs five tries and
// five holds in the first minute or so after the fall, at holds of 1 s; a
// limit that came back is followed two holds after the fall's last hold
// at the soonest. (The fleet benchmark's scenario B', without counts:
// 40/s back to 100/s was followed 1.2 to 1.9 s after the raise, and not by
// the end of the run before, the climb at its aim for eight holds.) A
// throttle at a rate never accepted for a second (a configured rate above
// the provider's limit from the start) sets no good: it is a rate that
// was wrong, not a limit that fell.
func (st *State) aimBack(now time.Time, w float64, held time.Duration) {
	if acc, ref := st.Meter.LastSecond(now); ref <= 1 && float64(acc) >= w/2 && st.Meter.covers(now, Sustained) && w >= st.Good {
		st.Good, st.backN, st.Back = w, 0, time.Time{}
	}
	if st.Good <= 0 || held <= 0 {
		st.stopTrying()
		return
	}
	// Never sooner than two holds after a hold's end: a throttle of the
	// climb's own puts a try off, and leaves one due later where it is.
	st.Back = clock.Later(st.Back, st.Climb.Add(scaled(held, BackHolds)))
}

// backOff applies a throttle to one of the requests sent at good when the
// key tried it (see aimBack), decided at now: the throttles to requests
// sent before now lower nothing further, and the next try waits twice as
// long after the throttle's hold as this one did, or none follows when
// that is over MaxPlateau (or the throttle held nothing).
func (st *State) backOff(now time.Time) {
	st.Decreased = now
	st.backN++
	held := st.Hold.Sub(now)
	wait := scaled(held, BackHolds*math.Pow(2, float64(st.backN)))
	if held <= 0 || wait > MaxPlateau {
		st.stopTrying()
		return
	}
	st.Back = st.Hold.Add(wait)
}

// stopTrying forgets the rate accepted before the limit fell: no try of it
// follows (see aimBack).
func (st *State) stopTrying() {
	st.Good, st.Back, st.backN = 0, time.Time{}, 0
}

// BackHolds is how many of its holds after the last one ends a key tries
// again a rate the provider accepted before its limit fell, and BackOver
// how far above the climb's aim that rate must be (see aimBack);
// sustained is how long a rate must have been accepted to be tried again,
// and how long a try must go before a throttle is a decrease from it.
const (
	BackHolds = 2
	BackOver  = 1.25
	Sustained = time.Second
)

// roomy records a bucket's count on a success that shows room — the
// bucket full, all but one unit left once the requests in flight are
// counted — at now, when the key's rate is rate. Sent to below its limit, a
// bucket stays full whatever the limit: nothing but sending faster tells
// how far below. So while the climb back after a decrease (CUBIC) goes on
// and the counts show room, its clock runs RoomBoost times as fast (the
// time since the last such count, at most RoomGap of it, is added
// RoomBoost-1 times): the climb from a plateau at 40 to 90 a second takes
// 1 to 3 s instead of 6. Past the limit the bucket drains, the counts show
// it, and the climb goes at its own pace before the bucket is empty;
// counts that fall, or show no room, level it off at the refill they show
// (see counted). (Half full, rather than full, was room at first: a bucket
// refilling a unit or two a second faster than it is sent to, just under
// its limit, then sped the climb into refusals: 3 to 8 in 5 s in the fleet
// benchmark's scenario B, against 0 to 2.)
//
// Room says the limit is at least the rate the requests went at, which is
// the key's rate only while they keep up with it: a caller may send less
// than its rate, and a limiter's turns given ahead go at the rate they
// were given at until a change moves them (a TokenBucket's climb between
// responses leaves them where they are; see tokenBucket.retime). So the
// climb is sped only while the key's last requests went at KeepUp of its
// rate or more, and the rate remembered for a level-off is the lower of
// the two: the rate room was shown at. (The fleet's script remembers the
// key's rate while its turns keep up: see Drain in rate.lua.) This is
// TCP's rule for a window the sender does not fill (RFC 7661): it is not
// grown on the evidence of traffic sent below it. roomy reports whether
// it sped the climb.
func (st *State) roomy(cfg *Config, now time.Time, rate float64) (sped bool) {
	went := st.Sent.rate(now, rate)
	kept := went >= KeepUp*rate
	if cfg.Discover && !st.Climb.IsZero() && now.After(st.Climb) && rate < cfg.Configured && !st.room.IsZero() && kept {
		ahead := min(now.Sub(st.room), RoomGap) * (RoomBoost - 1)
		st.Climb = st.Climb.Add(-min(ahead, now.Sub(st.Climb)))
		sped = ahead > 0
	}
	st.room, st.RoomRate = now, min(rate, went)
	return sped
}

// KeepUp is the share of the key's rate its last requests must have gone
// at for room to speed the climb (see roomy). A climb sped four times
// runs ahead of what went in the quarter second before by a tenth or
// more: at 0.9, the fleet's climb in scenario B' of the fleet benchmark
// was held to CUBIC's pace half the time, and reached 90/s 3.6 s after
// the raise, not 2.5.
const KeepUp = 0.75

// SendPace is when a key's last requests went, granted by its limiter,
// and their costs: the rate they went at (see roomy). (Unix nanoseconds,
// and costs up to 2³¹: 384 bytes a key.)
type SendPace struct {
	At    [32]int64
	cost  [32]int32
	next  int
	First int64 // the first request recorded; 0 for none
}

// PaceUnits, PaceMin and PaceMax bound the time over which SendPace.rate
// measures: that of 16 units at the key's rate, a quarter second to two.
const (
	PaceUnits = 16
	PaceMin   = 250 * time.Millisecond
	PaceMax   = 2 * time.Second
)

// add records a request of cost units granted at t.
func (p *SendPace) add(t time.Time, cost int) {
	ns := t.UnixNano()
	if p.First == 0 {
		p.First = ns
	}
	p.At[p.next], p.cost[p.next] = ns, int32(min(cost, math.MaxInt32))
	p.next = (p.next + 1) % len(p.At)
}

// units returns the units of the recorded requests granted from from to
// to (Unix nanoseconds, both included).
func (p *SendPace) units(from, to int64) float64 {
	u := 0.0
	for i, t := range p.At {
		if t != 0 && t >= from && t <= to {
			u += float64(p.cost[i])
		}
	}
	return u
}

// rate returns the rate the key's requests went at as of now, when its
// rate is r: the units granted in the time of PaceUnits units at r (at
// least PaceMin, at most PaceMax), over that time; +Inf when the record does
// not cover it (too soon to tell: as if they kept up). More requests in
// that time than the record holds went at the rate of the record: its
// units after its oldest, over the time since. The fleet's script counts
// its turns granted in the same time (rate.lua's drain).
func (p *SendPace) rate(now time.Time, r float64) float64 {
	w := min(max(PaceUnits/r, PaceMin.Seconds()), PaceMax.Seconds())
	to := now.UnixNano()
	from := to - int64(w*float64(time.Second))
	if p.First == 0 || from < p.First {
		return math.Inf(1)
	}
	units := 0.0
	for i, t := range p.At {
		if t > from && t <= to {
			units += float64(p.cost[i])
		}
	}
	if oldest := p.At[p.next]; oldest > from {
		if oldest >= to {
			return math.Inf(1)
		}
		return (units - float64(p.cost[p.next])) / time.Duration(to-oldest).Seconds()
	}
	return units / w
}

// counted applies a bucket's count on a success s (quota q), the key's
// rate being rate, to the climb back after a decrease; empty: the count
// shows no room once the requests in flight are counted. It reports
// whether the climb levelled off below rate. Climbing back, a bucket with
// no room left says the limit is about here: the climb levels off rather
// than climb into a refusal, at the rate of the last count that showed
// room when that was lately and lower (the rate climbed past the limit
// since), or at the rate the counts show the bucket refills at (see
// DrainMark) when lower still; it resumes once the bucket shows room
// again. Counts that fall by DrainFall or more while the bucket still has
// room level it off at that measured rate too, when it is lower than the
// key's: before the bucket is empty, while the requests sent at the
// higher rate still find room. A level-off on a measure is NearAim of it:
// the measure is the most whole counts allow, up to a unit over its span
// above the refill, and a key levelled there drained the bucket to a
// refusal a few seconds later, every few seconds (two refusals in 5 s now
// and then in the fleet benchmark's scenario B, with the headers); under
// it, the bucket fills again, shows room, and the climb finds the limit
// by its counts, not by a refusal.
//
// A bucket of one unit (its limit under 2) shows 0 after every request it
// accepts, full before it or not, sent to under its limit or over it: its
// counts tell nothing of room, and the climb goes at its own pace, to the
// refusal that tells the limit. (Levelled off by its counts of 0, a key
// sent to a provider enforcing 62/s with a burst of 1 stayed at the rate
// of its last decrease, and each refusal after lowered it further: 47/s,
// then 42/s, 38/s, in the fleet benchmark's scenario E.)
func (st *State) counted(cfg *Config, s *Response, q Quota, empty bool, rate float64) bool {
	now, sent := s.Now, s.SentAt
	if sent.IsZero() {
		sent = now
	}
	oneUnit := q.HasLimit && q.Limit < 2
	if !cfg.Discover || st.Climb.IsZero() || !now.After(st.Climb) || rate >= cfg.Configured || oneUnit {
		st.Drain.Count(sent, q) // not climbing back, or not steered by these counts (as drain in rate.lua)
		return false
	}
	est, measured := st.Drain.Refills(sent, q.Remaining)
	lvl := rate
	switch {
	case empty && measured:
		lvl = min(rate, max(est*NearAim, DrainLow*rate, cfg.Floor))
	case empty:
		if now.Sub(st.room) < RoomMemory && st.RoomRate < lvl && st.RoomRate >= DrainLow*rate {
			lvl = max(st.RoomRate, cfg.Floor)
		}
	case measured && st.Drain.Rem-q.Remaining >= DrainFall && est < rate:
		lvl = max(est*NearAim, DrainLow*rate, cfg.Floor)
	default:
		st.Drain.Count(sent, q)
		return false
	}
	st.Wmax, st.W0, st.Climb, st.Plateau = lvl, lvl, now, 0
	if lvl < rate {
		st.Drain = DrainMark{At: sent, Rem: q.Remaining}
	} else {
		// Levelled where it was, the stretch goes on measuring: taken
		// again at every count of an empty bucket, a mark never reached
		// DrainMin while a key above the limit kept it empty, and the
		// climb stayed there, refused every 0.14 s for a second (scenario B
		// of the fleet benchmark, with the headers).
		st.Drain.Count(sent, q)
	}
	return lvl < rate
}

// DrainMark is the first count of a stretch in which a bucket's counts
// showed it below full: a bucket that is not full keeps all it refills, so
// from there its counts measure its rate. A bucket whose remaining fell by
// d while it accepted n requests in dt refilled n − d units: it refills at
// (n − d)/dt. The requests are the successes heard since the mark's (those
// in flight at either count are in neither it nor n); dt is between the
// reported requests' send times, when the provider counted them. Whole
// counts hide up to a unit of the fall, so the measure is the most they
// allow, (n − d + 1)/dt: a measure that could be low by a unit would level
// the climb off below the limit on noise, a little lower each time. A
// count that shows the bucket full (all but one unit left) ends the
// stretch (a full bucket throws its refill away); a mark older than
// DrainSpan is taken again, so that what it measures is recent, and so is
// one the counts rose DrainFall or more above (from a mark taken at the
// bottom of a dip, the fall after it does not show until the counts are
// back down there: a climb that emptied the bucket again went unmeasured
// to a refusal, in scenario B' of the fleet benchmark). (The fleet's
// script counts the turns it granted, less the refusals heard since the
// mark, instead of the successes.)
type DrainMark struct {
	At  time.Time
	Rem float64 // the remaining then
	N   float64 // the requests accepted since (the successes heard)
}

// DrainSpan is the longest a mark is kept; DrainMin the shortest time
// after it from which a count measures; DrainFall how far counts with
// room must fall to level the climb off; DrainLow the lowest share of the
// key's rate a level-off goes down to on a count's measure (lower, it is
// for a refusal to tell).
const (
	DrainSpan = 2 * time.Second
	DrainMin  = 250 * time.Millisecond
	DrainFall = 2
	DrainLow  = 0.5
)

// Count takes a bucket's count on a success (quota q) whose request was
// sent at now.
func (m *DrainMark) Count(now time.Time, q Quota) {
	switch {
	case q.HasLimit && q.Limit >= 2 && q.Remaining >= q.Limit-1:
		*m = DrainMark{}
	case m.At.IsZero() || now.Sub(m.At) >= DrainSpan || q.Remaining >= m.Rem+DrainFall:
		*m = DrainMark{At: now, Rem: q.Remaining}
	}
}

// Refills returns the rate the counts show the bucket refills at, from the
// mark to a count of rem remaining of a request sent at now; false when
// they do not show it (no mark, too soon after it, or a rise). Counts that
// stay where they were measure too: a bucket kept empty by a key above its
// limit refills what it accepts, the refusals aside.
func (m *DrainMark) Refills(now time.Time, rem float64) (float64, bool) {
	dt := now.Sub(m.At).Seconds()
	if m.At.IsZero() || dt < DrainMin.Seconds() || rem > m.Rem {
		return 0, false
	}
	est := (m.N - (m.Rem - rem) + 1) / dt
	return est, est > 0
}

// RoomBoost is how much faster the climb back goes while a bucket shows
// room; RoomGap is the most time one such count speeds it for; RoomMemory
// is how long the rate of the last one is where a count with no room
// levels the climb off.
const (
	RoomBoost  = 4
	RoomGap    = 250 * time.Millisecond
	RoomMemory = 2 * time.Second
)

// Near a limit found before (between NearLow and NearLimit times the last
// aim: the rate climbed back to it), from a provider whose counts show a
// bucket (a refusal then holds the key for one unit only), a decrease
// without an estimate is by NearBeta, not beta, and the climb back aims at
// NearAim times the rate refused: it levels off for seconds just under it,
// so that the limit is probed by a refusal about every five seconds (at
// the default C). Where a refusal holds the key for its Retry-After, a deep
// decrease and a long climb back cost less than many shallow ones.
const (
	NearLow   = 0.9
	NearLimit = 1.25
	NearBeta  = 0.9
	NearAim   = 0.97
)

// early reports whether a throttle at rate w came early in the climb back
// after a decrease to w0 aiming at wmax: in its lower half, the rate
// hardly up from where the decrease set it. A throttle without counts that
// asks for a wait then shows that the decrease was too small by as much
// again, and the next is by beta twice, aiming at beta of w, AimUnder
// under it unless the key is a bucket (the multiplicative decrease
// compounds, as TCP's backoff doubles on a loss soon after the last).
// Without counts each throttle holds the key for its Retry-After, a second
// as providers round it up, and tells nothing of how far the limit is
// below: from a rate five times a provider's limit, decreases by beta
// alone took five holds to get under it, with the key sending for a few
// milliseconds between them (a fifth of the limit over the fleet
// benchmark's scenario B at 20/s), and a limit dropped from 100/s to 40/s
// took three (its last refusal 3 s after the drop, in scenario B'). A
// throttle that asks for no wait holds the key a unit at the floor rate
// only (see unsaid), and decreases by beta cost that much each:
// compounded, three refusals of a provider with a burst of one, a tenth of
// a second apart, set the key at its floor (scenario G of the fleet
// benchmark, the local TokenBucket).
func early(w0, wmax, w float64) bool {
	return w0 > 0 && wmax > w0 && w <= (w0+wmax)/2
}

// plateauFor returns how long the climb back after a decrease to w0,
// aiming at wmax, stays at its aim before it grows beyond, when the
// throttle that caused it carried no count and held the key for hold:
// until probeHolds holds after the climb began, at most MaxPlateau.
// Without counts only a refusal finds the limit, and each refusal holds
// the key for its Retry-After (a second, as providers round it up) and
// lowers the rate: the curve's growth beyond its aim probes the limit at
// that price, and CUBIC's own, from the aim, found it five to seven
// seconds after each hold's end (K, then the growth past a provider's
// burst), a hold and a decrease each time: a sixth to an eighth of the
// time held. Probing an unchanged limit less often costs less; a raised
// limit, which nothing but a probe shows without counts, is found that
// much later.
func plateauFor(hold time.Duration, w0, wmax, c float64) float64 {
	if wmax <= 0 || hold <= 0 {
		return 0
	}
	return max(min(probeHolds*hold.Seconds(), MaxPlateau.Seconds())-cubicK(w0, wmax, c), 0)
}

// probeHolds is how many of its holds after the climb back began a key
// without counts probes its limit again, and MaxPlateau how long after
// at most (a minute: a limit raised is found within a minute or so
// however long the provider's Retry-After; see plateauFor).
const (
	probeHolds = 8
	MaxPlateau = time.Minute
)

// AimUnder is how far under the rate refused (or, below the last aim,
// under CUBIC's fast-convergence aim) a decrease without an estimate aims
// the climb back, unless the key's counts show a bucket (a refusal then
// holds it for a unit only, and the climb is steered by the counts: see
// counted and NearAim). A provider with a burst refuses only once the key's
// excess over its limit has spent the burst: sent a little too fast, it
// refuses seconds later, the rate refused above its limit. Aimed at that
// rate, the climb levelled off above the limit and met the next refusal
// within six seconds, each holding the key for its Retry-After (1 s, as
// providers round it up); aimed a twentieth under, it levels off under
// the limit and probes it by the curve's slow growth beyond the aim.
const AimUnder = 0.95

// EstimateMargin is how far under its estimate of the limit discovery sets
// the rate after a throttle: the climb back from there to the estimate
// takes several seconds (see Cubic), and the estimate is noisy.
const EstimateMargin = 0.92

// Meter counts a key's recent outcomes in four slots of a quarter second,
// by the time the request was sent.
type Meter struct {
	First    int64    // the first outcome's send time, Unix nanoseconds; 0 for none
	slot     [4]int64 // the slot's start, in quarter seconds since the epoch
	accepted [4]int32
	refused  [4]int32
}

// MeterSlot is the span of one of the meter's slots.
const MeterSlot = 250 * time.Millisecond

// Add counts an outcome of a request sent at sent.
func (m *Meter) Add(sent time.Time, refused, accepted bool) {
	if sent.IsZero() || (!refused && !accepted) {
		return
	}
	if m.First == 0 || sent.UnixNano() < m.First {
		m.First = sent.UnixNano()
	}
	n := sent.UnixNano() / int64(MeterSlot)
	if refused {
		m.addN(n, 1, 0)
	} else {
		m.addN(n, 0, 1)
	}
}

// addN counts outcomes of requests sent in slot n (quarter seconds since
// the epoch).
func (m *Meter) addN(n int64, refused, accepted int32) {
	i := n % int64(len(m.slot))
	if i < 0 {
		i += int64(len(m.slot)) // sent before 1970: a caller's own Signal may say so
	}
	if m.slot[i] != n {
		m.slot[i], m.accepted[i], m.refused[i] = n, 0, 0
	}
	m.refused[i] += refused
	m.accepted[i] += accepted
}

// LastSecond returns the outcomes of the requests sent in the last
// second: accepted and refused.
func (m *Meter) LastSecond(now time.Time) (acc, ref int32) {
	n := now.UnixNano() / int64(MeterSlot)
	for i, s := range m.slot {
		if s > n-int64(len(m.slot)) && s <= n {
			acc, ref = acc+m.accepted[i], ref+m.refused[i]
		}
	}
	return acc, ref
}

// covers reports whether the meter has counted outcomes since d before
// now or longer.
func (m *Meter) covers(now time.Time, d time.Duration) bool {
	return m.First != 0 && now.UnixNano()-m.First >= int64(d)
}

// Outpaced reports whether the provider accepted more than twice q's
// limit of the requests sent in the last second: then q refills
// continuously. A window admits at most its limit, twice across its end,
// unless it is shorter than a second — and then it is as good as a bucket.
func (m *Meter) Outpaced(now time.Time, q Quota) bool {
	acc, _ := m.LastSecond(now)
	return q.HasLimit && q.Limit >= 1 && float64(acc) > 2*q.Limit
}

// refusedShare returns the share of the last second's outcomes that were
// refusals, and how many outcomes there were.
func (m *Meter) refusedShare(now time.Time) (float64, int) {
	acc, ref := m.LastSecond(now)
	if acc+ref == 0 {
		return 0, 0
	}
	return float64(ref) / float64(acc+ref), int(acc + ref)
}

// Storm tells throttles that carry no count and are not about the caller's
// quota (a storm of lock timeouts, load shedding) from an exhausted quota,
// by probes: requests sent after a hold that such a throttle set (for its
// Retry-After, or see unsaid), each alone, the provider's bucket having
// refilled a unit for it whatever its burst. The first request after the
// hold is one: the wait the provider asked for gave it a unit. The holds
// after a sign of a storm, and long holds (see LongHold), have more (see
// probing), each held a gap (a unit at the floor rate, which a limit at or
// above the floor refills) after the one before (Spend holds the key that
// long after each). A refused probe was not refused for the quota: from
// then on, for StormTTL, such throttles delay only their own request;
// unless most of the key's recent requests are refused, which is an
// exhausted quota whatever the headers say.
//
// A sign is a refusal among the first stormFirst requests after a hold (by
// time at the key's rate), which a storm gives often, and so does a
// provider whose burst is a few units (sent to faster than its limit, its
// bucket is empty after them). Taken for a storm, a refusal of the second
// request after a hold undid the key's decreases, and the key sent at the
// configured rate with half its requests refused for as long as it ran.
// Probes after every hold cost a scenario whose provider refuses for its
// quota only (a refusal every few seconds as the climb finds the limit) a
// floor's unit or two at every hold; after a sign only, they cost nothing
// there. (At an episode's first hold too, they moved the climb's refusals
// of the fleet benchmark's scenario B by a second or more, into its last
// five seconds.)
type Storm struct {
	from    time.Time              // when the last hold a throttle without counts set was decided
	HoldEnd time.Time              // its end: the probes follow
	gap     time.Duration          // a unit at the floor rate; 0 when no probes follow
	probes  int                    // how many probes follow holdEnd
	granted int                    // how many of them the limiter granted (see Space)
	turns   [StormProbes]time.Time // when it granted them
	armed   time.Time              // a sign was seen: the holds until then have more probes (see Probing)
	Until   time.Time              // throttles without counts are not about the quota until then
}

// StormProbes is how many requests after a hold are probes, at most;
// stormProbeShare the share of the hold their gaps may take in all after
// a sign, longProbeShare after a long hold (see LongHold). A storm not
// told costs another hold, so the probes may cost a quarter of one after
// a sign, whose holds come back at every refusal of a climb against a
// provider with a small burst (scenario E of the fleet benchmark), and
// half of one after a long hold, which a climb's refusals never set (at
// 100/s configured, whose floor's unit is 100 ms: three probes after a
// sign's hold of 1 s, ten after a hold of 2 s; fewer at a low floor: a key
// configured under forty a second, at the default floor, has one probe
// after a hold of 1 s, the first request after it). stormFirst is how many
// of the first requests after a hold (at the key's rate, after its probes)
// a refusal among is a sign; StormTTL is how long a storm, or a sign, is
// believed without new evidence; stormExit is the share of refusals, over
// at least stormExitSamples outcomes in the last second, that ends a
// storm. (With at most three probes, each hold telling the storm with a
// chance of 0.66 at 30% refused, a storm with a Retry-After of 2 s was told
// after four holds, 8 s, in one draw of five, and egress sent a third of
// what a client that only waits each refused request's Retry-After sent.
// With six after a hold of 2 s, a quarter of it, they were all accepted in
// one draw of eight (0.7⁶), and a storm of scenario C without headers went
// untold for two holds at two seeds of six: 300 successes against the
// per-pod peer's 410; with ten, one in thirty-six. Six after a sign's hold
// of 1 s cost scenario E without headers about ten points of its limit.)
const (
	StormProbes      = 10
	stormProbeShare  = 0.25
	longProbeShare   = 0.5
	stormFirst       = 5
	StormTTL         = time.Minute
	stormExit        = 0.6
	stormExitSamples = 20
)

// Probing returns how many requests are probes after a hold of length
// hold, after a sign or a long hold, and the gap between them, at floor
// units per second: none without a floor; after the first, as many as
// stormProbeShare of the hold has room for (longProbeShare of a long
// hold), up to StormProbes in all.
func Probing(floor float64, hold time.Duration) (int, time.Duration) {
	gap := ProbeGap(floor)
	if gap <= 0 || hold <= 0 {
		return 0, 0
	}
	share := stormProbeShare
	if LongHold(floor, hold) {
		share = longProbeShare
	}
	return 1 + int(min(StormProbes-1, int64(time.Duration(float64(hold)*share)/gap))), gap
}

// ProbeGap is the gap between probes: a unit at floor units per second; 0
// without a floor.
func ProbeGap(floor float64) time.Duration {
	if !(floor > 0) || math.IsInf(floor, 0) {
		return 0
	}
	return max(time.Duration(float64(time.Second)/floor), 0)
}

// probing returns how many probes follow a hold until until decided at
// now (as many as probing says after a sign or after a long hold, one
// otherwise, none without a floor; a hold that extends one not yet ended
// keeps its probes), and the gap between them.
func (st *Storm) probing(now, until time.Time, floor float64) (int, time.Duration) {
	k, gap := Probing(floor, until.Sub(now))
	switch {
	case now.Before(st.HoldEnd):
		k = min(k, max(st.probes, 1))
	case !now.Before(st.armed) && !LongHold(floor, until.Sub(now)):
		k = min(k, 1)
	}
	return k, gap
}

// LongHold reports whether a hold of length hold, that a throttle without
// counts set with its Retry-After, is longer than any a provider's bucket
// whose limit is at or above floor asks of a request sent early: the time
// it takes to refill a unit, in whole seconds as Retry-After counts (1 s
// at the default floor, a tenth of the configured rate, for a key
// configured at ten a second or more). Such a hold is a window's reset, or
// a throttle not about the rate (a storm of lock timeouts, load shedding,
// maintenance); the climb's refusals of a bucket never set one. All its
// probes follow it, sign or not: they cost half the hold at most,
// and do not come back at every refusal of a climb. (With one probe after
// an unarmed hold, a storm with a Retry-After of 2 s that refused none of
// the first requests after a hold went untold for two holds or three, and
// egress sent less than a client that waits each refused request's
// Retry-After: BENCHMARKS §6.)
func LongHold(floor float64, hold time.Duration) bool {
	gap := ProbeGap(floor)
	return gap > 0 && hold > time.Duration(math.Ceil(gap.Seconds()))*time.Second
}

// Held records a hold until until that a throttle without counts set at
// now, and the k probes, gap apart, that follow it.
func (st *Storm) Held(now, until time.Time, k int, gap time.Duration) {
	st.from, st.HoldEnd, st.gap, st.probes, st.granted, st.turns = now, until, gap, k, 0, [StormProbes]time.Time{}
	if k == 0 {
		st.gap = 0
	}
}

// Space records a request the limiter granted at now, at its turn turn
// (see Spend). While the probes go (and no storm is believed) it is one,
// and it returns when the next may go: a gap after its turn, but after the
// last probe. Otherwise zero. (A turn before the hold's end, given before
// the hold and taken late, is the hold's end; one after now is now.)
func (st *Storm) Space(now, turn time.Time) time.Time {
	if st.gap == 0 || now.Before(st.HoldEnd) || st.granted >= st.probes || now.Before(st.Until) {
		return time.Time{}
	}
	turn = clock.Later(clock.Earlier(turn, now), st.HoldEnd)
	st.turns[st.granted] = turn
	st.granted++
	if st.granted < st.probes {
		return turn.Add(st.gap)
	}
	return time.Time{}
}

// AtTurn reports whether a request sent at sent went at a probe's turn,
// the limiter's turn at (zero for none; see Spend), due at due, the next
// request being due a unit after the later of them: from a moment before
// the turn (a fleet's turns are on Redis's clock, their wait counted from a
// reply) until nearly the next. (A waiter woken late by a busy process
// still sends first; counted from the hold's end instead, the first
// request after a hold sent 8 ms late at 70/s was not a probe. But a
// limiter that keeps its pace whatever the timer slack sends the next one
// a unit after the first's turn, not after it went: 4 ms after it there,
// which a burst of one refuses. And a turn the limiter gives later than
// it was due is still the probe's: a local TokenBucket's first turn after
// a hold waits for its transit margin, and its probes went a unit late at
// 72/s, too late for a window counted from when they were due; the storm
// of scenario C without headers went untold for three holds of 2 s.)
func AtTurn(sent, at, due time.Time, unit time.Duration) bool {
	margin := 2 * time.Millisecond
	return !at.IsZero() && !sent.Before(at.Add(-margin)) && sent.Before(clock.Later(due, at).Add(max(unit/2, unit-margin)))
}

// After reports where a request sent at sent falls after the last hold, at
// the key's rate: at one of the probes' turns this limiter granted, or
// among the first stormFirst requests after the hold's end and its probes.
// (Sent a little before the end as this instance measured it counts too: a
// fleet's hold ends on Redis's clock, heard a moment late.)
func (st *Storm) After(sent time.Time, rate float64) (probe, first bool) {
	if st.gap == 0 || st.HoldEnd.IsZero() || sent.Before(st.from) || !(rate > 0) {
		return false, false
	}
	unit := time.Duration(float64(time.Second) / rate)
	u := min(st.gap, unit)
	due := st.HoldEnd // the earliest the first could go; each next, a gap after the one before
	for _, at := range st.turns[:st.granted] {
		probe = probe || AtTurn(sent, at, due, u)
		due = at.Add(st.gap)
	}
	last := st.HoldEnd.Add(time.Duration(st.probes-1) * st.gap)
	if st.granted > 0 {
		last = clock.Later(last, st.turns[st.granted-1])
	}
	return probe, !sent.Before(st.HoldEnd.Add(-u/2)) && sent.Before(last.Add(stormFirst*unit))
}

// NotQuota reports whether s, a throttle without counts, is not about the
// key's quota (other), learning from it, and whether it is the first sign
// of a storm (entered): the rate decreases made before were mistaken.
// probe and first say where its request fell after the last hold (see
// after). A refusal that is a sign only arms the probes (sign).
func (st *Storm) NotQuota(s *Response, m *Meter, probe, first bool) (other, entered, sign bool) {
	now := s.Now
	if now.Before(st.Until) {
		if share, n := m.refusedShare(now); n >= stormExitSamples && share >= stormExit {
			st.Until = time.Time{}
			return false, false, false
		}
		st.Until = now.Add(StormTTL)
		return true, false, false
	}
	switch {
	case probe:
		st.Until, st.armed = now.Add(StormTTL), time.Time{}
		return true, true, false
	case first:
		st.armed = now.Add(StormTTL)
		return false, false, true
	}
	return false, false, false
}

// minEstimateSamples and minEstimateRefusals are how many outcomes, and
// refusals among them, the meter needs for an estimate.
const (
	minEstimateSamples  = 10
	minEstimateRefusals = 3
)

// Estimate returns the limit the outcomes of the last second show: the
// share accepted times the rate w they were sent at.
func (m *Meter) Estimate(now time.Time, w float64) (float64, bool) {
	acc, ref := m.LastSecond(now)
	// Until the provider has refused several, the share it accepted is
	// inflated by the burst it held when the key started sending: the
	// first refusal comes exactly when that burst runs out.
	if acc+ref < minEstimateSamples || ref < minEstimateRefusals {
		return 0, false
	}
	return w * float64(acc) / float64(acc+ref), true
}

// The defaults of the root's AdaptivePolicy.
const (
	DefaultBeta = 0.7
	DefaultC    = 0.005
)

// AdvertisedTTL is how long an advertised limit is believed without being
// heard again.
const AdvertisedTTL = 10 * time.Minute

// DefaultConfig returns the learning settings of a limiter at rate r, in
// units per second.
func DefaultConfig(r float64) Config {
	return Config{
		Configured: r, Discover: true, Advertise: true,
		Beta: DefaultBeta, C: DefaultC, Floor: r / 10,
	}
}

// Lowering is a change of a key's rate decided at at, by factor (old over
// new), that moves the turns given ahead of time after from (the end of
// the key's hold, or at: the turns inside a hold are taken again after
// it): a decrease spreads them at the new rate; a raise, factor below 1,
// brings them in (a TokenBucket's, see retime; the fleet's, see
// retimings).
type Lowering struct {
	At, From time.Time
	Factor   float64
}

// Move returns when a turn due at due is due once l is applied: moved by
// l.factor from l.from when it is due after it.
func (l Lowering) Move(due time.Time) time.Time {
	if !due.After(l.From) {
		return due
	}
	return l.From.Add(scaled(due.Sub(l.From), l.Factor))
}

// scaled returns d times factor, at most a year: a hostile factor never
// overflows a time.
func scaled(d time.Duration, factor float64) time.Duration {
	const most = 365 * 24 * time.Hour
	if x := float64(d) * factor; x < float64(most) {
		return time.Duration(x)
	}
	return most
}
