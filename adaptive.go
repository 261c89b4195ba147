package egress

import (
	"context"
	"math"
	"time"
)

// How egress learns a key's limit, besides the rate it is configured with:
//
//   - Advertised: a response that states the provider's limit with its
//     window (RateLimit-Policy: "default";q=50;w=1, or X-RateLimit-Limit:
//     50;w=1, ...) sets the key's rate to min(configured, advertised), at once
//     and for the whole limiter (for a shared limiter, the whole fleet). On by
//     default; WithoutAdvertisedLimits turns it off.
//   - Discovered (opt-in, WithAdaptive): each throttling response (429, or 503
//     with Retry-After) lowers the key's rate multiplicatively, and the rate
//     climbs back toward the configured one while no throttling comes, along
//     the CUBIC curve of the AWS SDKs' adaptive retry mode.
//
// The state of a key is small: the advertised rate and until when it holds,
// and the rate at the last decrease with its time. The rate at any moment is
// a pure function of that state and the time, so it needs no update on
// success: the shared limiters compute it in the same Lua script that admits
// requests.

// AdaptivePolicy configures the discovery of a provider's unadvertised limit
// (see WithAdaptive). Every zero field means the default beside it.
type AdaptivePolicy struct {
	// Beta is the factor applied to the rate on a throttling response; in
	// (0, 1). Default 0.7.
	Beta float64
	// C scales how fast the rate climbs back (CUBIC's constant, in units per
	// second per second cubed); > 0. Default 0.4.
	C float64
	// Floor is the lowest rate adaptation may set; at most the limiter's
	// configured rate. Default: a tenth of the configured rate.
	Floor Rate
}

// The defaults of AdaptivePolicy: the constants of the AWS SDKs' adaptive
// retry mode.
const (
	defaultBeta = 0.7
	defaultC    = 0.4
)

// advertisedTTL is how long an advertised limit is believed without being
// heard again.
const advertisedTTL = 10 * time.Minute

// withDefaults returns p with its zero fields set, or an error naming the
// first invalid field. configured is the limiter's configured rate.
func (p AdaptivePolicy) withDefaults(configured Rate) (AdaptivePolicy, error) {
	bad := func(field string, v any, why string) (AdaptivePolicy, error) {
		return p, configError("WithAdaptive: AdaptivePolicy."+field, v, why)
	}
	if p.Beta == 0 {
		p.Beta = defaultBeta
	}
	if p.C == 0 {
		p.C = defaultC
	}
	if p.Floor == (Rate{}) {
		p.Floor = Rate{n: configured.n / 10, per: configured.per}
	}
	switch {
	case !(p.Beta > 0 && p.Beta < 1):
		return bad("Beta", p.Beta, "must be in (0, 1)")
	case !(p.C > 0) || math.IsInf(p.C, 0):
		return bad("C", p.C, "must be positive and finite")
	}
	if err := p.Floor.validate("WithAdaptive: AdaptivePolicy.Floor"); err != nil {
		return p, err
	}
	if p.Floor.PerSecond() > configured.PerSecond() {
		return bad("Floor", p.Floor, "must not exceed the limiter's configured rate "+configured.String())
	}
	return p, nil
}

// lesson is what one response teaches about a key's limit.
type lesson struct {
	advertised float64   // the advertised limit in units per second; 0 when none
	throttled  bool      // a throttling response, in adaptive mode
	sentAt     time.Time // when the request that got it was sent
	resume     time.Time // when the pause it asked for ends; zero for none
}

// rateAdjuster is implemented by the limiters of this package: their rate
// per key can be set below the configured one.
type rateAdjuster interface {
	// Rate returns the configured rate.
	Rate() Rate
	// EffectiveRate returns the rate key is held to now.
	EffectiveRate(key string) Rate
	// setAdaptive turns adaptive mode on with p (defaults applied).
	setAdaptive(p AdaptivePolicy)
	// learn applies a lesson and returns the key's rate, in units per
	// second, before and after.
	learn(ctx context.Context, key string, l lesson) (old, new float64, err error)
}

// adaptState is a key's learnt limit.
type adaptState struct {
	configured      float64         // the limiter's rate, units per second
	policy          *AdaptivePolicy // nil: adaptive mode is off
	advertised      float64         // units per second; 0 when none
	advertisedUntil time.Time       // when the advertised limit is forgotten
	wmax            float64         // the rate the climb back aims at (CUBIC's W_max)
	w0              float64         // the rate right after the last decrease
	decreased       time.Time       // when the climb back starts: the decrease, or the end of its pause; zero for never
}

// rate returns the key's rate at now: the configured one, lowered to the
// advertised limit and, in adaptive mode, to the CUBIC curve since the last
// decrease. A nil state is the configured rate.
func (s *adaptState) rate(now time.Time) float64 {
	r := s.configured
	if s.advertised > 0 && now.Before(s.advertisedUntil) {
		r = min(r, s.advertised)
	}
	if p := s.policy; p != nil && !s.decreased.IsZero() {
		t := max(now.Sub(s.decreased).Seconds(), 0)
		r = min(r, max(cubic(t, s.w0, s.wmax, p.C), p.Floor.PerSecond()))
	}
	return r
}

// cubic is the CUBIC rate t seconds after a decrease to w0: w0 at t = 0,
// levelling off at wmax at t = K, and growing faster beyond.
func cubic(t, w0, wmax, c float64) float64 {
	k := math.Cbrt(max(wmax-w0, 0) / c)
	return c*math.Pow(t-k, 3) + wmax
}

// atRest reports whether the state no longer lowers the rate at now, so
// that it can be dropped.
func (s *adaptState) atRest(now time.Time) bool { return s.rate(now) >= s.configured }

// learnInto applies l at now to the state *s of a key of a limiter with the
// configured rate and policy, making the state if the key has none, and
// returns the key's rate before and after.
func learnInto(s **adaptState, configured Rate, policy *AdaptivePolicy, now time.Time, l lesson) (old, new float64) {
	if *s == nil {
		*s = &adaptState{configured: configured.PerSecond(), policy: policy}
	}
	old = (*s).rate(now)
	(*s).learn(now, l)
	return old, (*s).rate(now)
}

// learn applies l at now. A throttling response to a request sent before
// the last decrease belongs to the overload episode that decrease answered:
// it counts once. The climb back starts when the response's pause ends:
// while nothing can be sent, there is nothing to learn from.
func (s *adaptState) learn(now time.Time, l lesson) {
	if l.advertised > 0 {
		s.advertised, s.advertisedUntil = l.advertised, now.Add(advertisedTTL)
	}
	if l.throttled && s.policy != nil && (s.decreased.IsZero() || l.sentAt.After(s.decreased)) {
		w := s.rate(now)
		s.wmax, s.w0, s.decreased = decreasedMax(w, s.wmax, s.policy.Beta), s.policy.Beta*w, maxTime(now, l.resume)
	}
}

// decreasedMax is the rate the climb back aims at after a decrease at rate
// w: w itself, or, when w is below the previous aim, lower still (CUBIC's
// fast convergence, RFC 8312 §4.6): the limit is lower than thought, so the
// next climb should level off sooner. The decrease itself is always to β·w.
func decreasedMax(w, prev, beta float64) float64 {
	if w < prev {
		return w * (1 + beta) / 2
	}
	return w
}

// advertisedRate returns the limit a response advertises, in units per
// second, or 0 when it advertises none with its window.
func advertisedRate(h rateLimitHint) float64 {
	if !h.HasLimit || !h.HasWindow || h.Limit <= 0 || h.Window <= 0 {
		return 0
	}
	return float64(h.Limit) / h.Window.Seconds()
}

// effective returns the rate of a key with state s (nil: none) at now.
func effective(s *adaptState, configured Rate, now time.Time) Rate {
	if s == nil {
		return configured
	}
	if r := s.rate(now); r < configured.PerSecond() {
		return PerSecond(r)
	}
	return configured
}
