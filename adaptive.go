package egress

import (
	"math"
	"time"

	"github.com/egress-go/egress/internal/control"
)

// How a limiter learns a key's limit, besides the rate it is configured
// with (the rules are in internal/control):
//
//   - Advertised: a response that states the provider's limit with its
//     window (RateLimit-Policy: "default";q=50;w=1, or X-RateLimit-Limit:
//     50;w=1, ...) sets the key's rate to min(configured, advertised), at once
//     and for the whole limiter (for a shared limiter, the whole fleet). On by
//     default; WithoutAdvertisedLimits turns it off.
//   - Discovered: a throttle that says the key's quota is exhausted lowers
//     the key's rate to just under the limit the key's recent outcomes show
//     (or by AdaptivePolicy.Beta when there are too few), and the rate climbs
//     back toward the configured one along a CUBIC curve while no throttling
//     comes. Never above the configured rate, never below AdaptivePolicy.Floor.
//     On by default; WithoutDiscovery turns it off, WithAdaptive tunes it.
//
// The state of a key is small, and the rate at any moment is a pure function
// of it and the time, so it needs no update on success: the shared limiters
// compute it in the same Lua script that admits requests.

// learnOptions gathers the options of a limiter.
type learnOptions struct {
	policy     *AdaptivePolicy
	noDiscover bool
	noAdvert   bool
	margin     *time.Duration // WithTransitMargin; nil: jitterTolerance
}

// AdaptivePolicy tunes the discovery of a provider's unadvertised limit
// (see WithAdaptive). Every zero field means the default beside it.
type AdaptivePolicy struct {
	// Beta is the factor applied to the rate on a throttle when the key's
	// recent outcomes are too few to estimate the limit; in (0, 1).
	// Default 0.7.
	Beta float64
	// C scales how fast the rate climbs back: CUBIC's constant, relative to
	// the rate aimed at (the curve gains C·aim units per second for each
	// second cubed away from the aim); > 0. Default 0.005, which takes
	// about 2.5 s back from 92% of the aim to the aim, and doubles the aim
	// some 6 s after that while nothing is throttled.
	C float64
	// Floor is the lowest rate discovery may set; at most the limiter's
	// configured rate. Default: a tenth of the configured rate.
	Floor Rate
}

// learnSettings applies a limiter's learning options for rate r, or fails
// naming the first invalid one. op names the constructor.
func learnSettings(op string, r Rate, o learnOptions) (control.Config, error) {
	cfg := control.DefaultConfig(r.PerSecond())
	cfg.Discover, cfg.Advertise = !o.noDiscover, !o.noAdvert
	if o.margin != nil && *o.margin < 0 {
		return cfg, configError(op+": WithTransitMargin", *o.margin, "must not be negative")
	}
	if o.policy == nil {
		return cfg, nil
	}
	p, err := o.policy.withDefaults(op, r)
	if err != nil {
		return cfg, err
	}
	cfg.Beta, cfg.C, cfg.Floor = p.Beta, p.C, p.Floor.PerSecond()
	return cfg, nil
}

// withDefaults returns p with its zero fields set, or an error naming the
// first invalid field. configured is the limiter's configured rate.
func (p AdaptivePolicy) withDefaults(op string, configured Rate) (AdaptivePolicy, error) {
	bad := func(field string, v any, why string) (AdaptivePolicy, error) {
		return p, configError(op+": WithAdaptive: AdaptivePolicy."+field, v, why)
	}
	if p.Beta == 0 {
		p.Beta = control.DefaultBeta
	}
	if p.C == 0 {
		p.C = control.DefaultC
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
	if err := p.Floor.validate(op + ": WithAdaptive: AdaptivePolicy.Floor"); err != nil {
		return p, err
	}
	if p.Floor.PerSecond() > configured.PerSecond() {
		return bad("Floor", p.Floor, "must not exceed the limiter's configured rate "+configured.String())
	}
	return p, nil
}

// limiterOptions applies a local limiter's options for rate r: the
// learning settings and the options themselves, or an error naming every
// invalid one (see limiterSettingsFor). op names the constructor.
func limiterOptions(op string, r Rate, opts []LimiterOption) (control.Config, learnOptions, error) {
	set, err := limiterSettingsFor(op, localRate, opts)
	if err != nil {
		return control.Config{}, set.learn, err
	}
	lc, err := learnSettings(op, r, set.learn)
	return lc, set.learn, err
}

// effectiveRate returns the rate of a key with controller state s (nil:
// none) at now, as a Rate: the configured one when nothing lowers it.
func effectiveRate(s *control.State, cfg *control.Config, configured Rate, now time.Time) Rate {
	if s == nil {
		return configured
	}
	if r := s.Rate(cfg, now); r < cfg.Configured {
		return PerSecond(r)
	}
	return configured
}
