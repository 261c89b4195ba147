package egress

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egress-go/egress/internal/control"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Tests of the key's controller (internal/control): the limiter options, the
// rules as step tables of recorded response sequences → decisions on
// explicit times, and the rules through the local limiters and the
// Transport. The Go and Lua versions of the same arithmetic are compared in
// controller_lua_test.go. No test here sleeps.

var ctlEpoch = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// nopLimiter is a Limiter of another package's kind: it grants everything
// and learns nothing.
type nopLimiter struct{}

func (nopLimiter) Wait(context.Context, string, int, time.Duration) (time.Duration, error) {
	return 0, nil
}

func TestLimiterOptionValidation(t *testing.T) {
	nan := math.NaN()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	t.Cleanup(func() { _ = rdb.Close() })
	for _, tc := range []struct {
		name string
		opt  LimiterOption
		want []string // each must appear in the error: the option, the field and the value
	}{
		{"beta one", WithAdaptive(AdaptivePolicy{Beta: 1}), []string{"AdaptivePolicy.Beta", " 1:", "(0, 1)"}},
		{"beta above one", WithAdaptive(AdaptivePolicy{Beta: 1.5}), []string{"AdaptivePolicy.Beta", "1.5"}},
		{"negative beta", WithAdaptive(AdaptivePolicy{Beta: -0.1}), []string{"AdaptivePolicy.Beta", "-0.1"}},
		{"NaN beta", WithAdaptive(AdaptivePolicy{Beta: nan}), []string{"AdaptivePolicy.Beta", "NaN"}},
		{"negative C", WithAdaptive(AdaptivePolicy{C: -0.4}), []string{"AdaptivePolicy.C", "-0.4"}},
		{"infinite C", WithAdaptive(AdaptivePolicy{C: math.Inf(1)}), []string{"AdaptivePolicy.C", "+Inf"}},
		{"floor above configured", WithAdaptive(AdaptivePolicy{Floor: PerSecond(200)}), []string{"AdaptivePolicy.Floor", "200/s", "100/s"}},
		{"zero floor", WithAdaptive(AdaptivePolicy{Floor: PerSecond(0)}), []string{"AdaptivePolicy.Floor", "0/s"}},
		{"NaN floor", WithAdaptive(AdaptivePolicy{Floor: PerSecond(nan)}), []string{"AdaptivePolicy.Floor", "NaN/s"}},
		{"negative transit margin", WithTransitMargin(-time.Millisecond), []string{"WithTransitMargin", "-1ms"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, make := range []struct {
				op string
				f  func() (any, error)
			}{
				{"NewTokenBucket", func() (any, error) { return NewTokenBucket(PerSecond(100), 10, tc.opt) }},
				{"NewLeakyBucket", func() (any, error) { return NewLeakyBucket(PerSecond(100), 10, tc.opt) }},
				{"NewSharedTokenBucket", func() (any, error) {
					return NewSharedTokenBucket(rdb, "x", PerSecond(100), 10, tc.opt)
				}},
			} {
				l, err := make.f()
				require.Error(t, err, make.op)
				assert.ErrorIs(t, err, ErrInvalidConfig)
				assert.Contains(t, err.Error(), make.op)
				for _, w := range tc.want {
					assert.Contains(t, err.Error(), w, make.op)
				}
				assert.Nil(t, l)
			}
		})
	}
	_, err := NewTokenBucket(PerSecond(100), 10, nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "NewTokenBucket: option")
}

func TestLimiterOptionDefaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    Rate
		opts []LimiterOption
		want control.Config
	}{
		{"defaults: discovery and advertised limits on", PerSecond(100), nil,
			control.Config{Configured: 100, Discover: true, Advertise: true, Beta: 0.7, C: 0.005, Floor: 10}},
		{"WithAdaptive tunes", PerSecond(100), []LimiterOption{WithAdaptive(AdaptivePolicy{Beta: 0.5, C: 0.01, Floor: PerSecond(20)})},
			control.Config{Configured: 100, Discover: true, Advertise: true, Beta: 0.5, C: 0.01, Floor: 20}},
		{"the default floor keeps the unit", PerMinute(600), []LimiterOption{WithAdaptive(AdaptivePolicy{})},
			control.Config{Configured: 10, Discover: true, Advertise: true, Beta: 0.7, C: 0.005, Floor: 1}},
		{"WithoutDiscovery", PerSecond(100), []LimiterOption{WithoutDiscovery()},
			control.Config{Configured: 100, Discover: false, Advertise: true, Beta: 0.7, C: 0.005, Floor: 10}},
		{"WithoutAdvertisedLimits", PerSecond(100), []LimiterOption{WithoutAdvertisedLimits()},
			control.Config{Configured: 100, Discover: true, Advertise: false, Beta: 0.7, C: 0.005, Floor: 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb, err := NewTokenBucket(tc.r, 10, tc.opts...)
			require.NoError(t, err)
			assert.InDelta(t, tc.want.Configured, tb.learn.Configured, 1e-9)
			assert.InDelta(t, tc.want.Floor, tb.learn.Floor, 1e-9)
			tc.want.Configured, tc.want.Floor = tb.learn.Configured, tb.learn.Floor
			assert.Equal(t, tc.want, tb.learn)
			lb, err := NewLeakyBucket(tc.r, 10, tc.opts...)
			require.NoError(t, err)
			assert.Equal(t, tb.learn, lb.learn)
		})
	}
}

func TestJitterMargin(t *testing.T) {
	for _, tc := range []struct {
		r     Rate
		burst int
		d     time.Duration
		want  float64
	}{
		{PerSecond(100), 10, 5 * time.Millisecond, 0.5},
		{PerSecond(1000), 10, 5 * time.Millisecond, 5},
		{PerSecond(1000), 4, 5 * time.Millisecond, 3}, // always one unit left to use
		{PerSecond(100), 1, 5 * time.Millisecond, 0},  // a burst of one has nothing to spare
		{PerSecond(100), 10, 0, 0},                    // WithTransitMargin(0)
		{PerMinute(60), 5, 5 * time.Millisecond, 0.005},
	} {
		assert.InDelta(t, tc.want, jitterMargin(tc.r, tc.burst, tc.d), 1e-9, "%v burst %d margin %v", tc.r, tc.burst, tc.d)
	}
}

// ---- the rules, step by step ----

// sig is a recorded response for the step tables: at is when it was read,
// sent when its request was sent (both from ctlEpoch).
type sig struct {
	at, sent  time.Duration
	status    int
	ra        time.Duration // Retry-After; -1 for none
	remaining float64       // -1 for none
	reset     time.Duration // -1 for none
	limit     float64       // advertised quota; 0 for none
	window    time.Duration
	scope     Scope
	kind      ResetKind
	inFlight  int     // the other requests of the key in flight when it was read
	quota     float64 // the quota's limit, stated without a window; 0 for none
	granted   int     // the requests the limiter granted at sent, this one among them (0: as if it had, see storm)
}

// grant has the limiter of st grant the step's requests at sent, or, when
// it says none, marks this one granted then (see storm).
func (s sig) grant(st *control.State, cfg *control.Config, sent time.Time) {
	if s.granted == 0 {
		st.Storm.Space(sent, sent)
	}
	for range s.granted {
		st.Spend(sent, sent, 1, st.Rate(cfg, sent))
	}
}

func (s sig) signal() *Signal {
	out := &Signal{Now: ctlEpoch.Add(s.at), SentAt: ctlEpoch.Add(s.sent), Status: s.status, Scope: s.scope, InFlight: s.inFlight}
	if s.ra >= 0 {
		out.RetryAfter, out.HasRetryAfter = s.ra, true
	}
	q := Quota{}
	has := false
	if s.remaining >= 0 {
		q.Remaining, q.HasRemaining, has = s.remaining, true, true
	}
	if s.reset >= 0 {
		q.Reset, q.HasReset, has = s.reset, true, true
	}
	if s.limit > 0 {
		q.Limit, q.HasLimit, q.Window, q.HasWindow, has = s.limit, true, s.window, true, true
	}
	if s.quota > 0 {
		q.Limit, q.HasLimit, has = s.quota, true, true
	}
	q.Kind = s.kind
	if has {
		out.Quotas = []Quota{q}
	}
	return out
}

// ok, throttle and zero are the recorded responses of the tables.
func ok(at, sent time.Duration) sig {
	return sig{at: at, sent: sent, status: 200, ra: -1, remaining: -1, reset: -1}
}

func throttle(at, sent, ra time.Duration) sig {
	return sig{at: at, sent: sent, status: 429, ra: ra, remaining: -1, reset: -1}
}

func withQuota(s sig, remaining float64, reset time.Duration) sig {
	s.remaining, s.reset = remaining, reset
	return s
}

// granting is s, whose request was one of n the limiter granted at its
// sent time.
func granting(s sig, n int) sig {
	s.granted = n
	return s
}

// want is a step's expected decision; offsets from ctlEpoch, 0 for none.
type want struct {
	hold, notBefore time.Duration
	rate            float64 // the key's rate right after; 0: the configured 100
	why             string
	shape           control.Shape
	drain           bool
}

// ctlTable is a recorded response sequence and the decisions it must get,
// for a limiter at 100/s with opts; fleet: a shared limiter's, with a
// burst of ctlBurst (control.Config.fleet).
type ctlTable struct {
	name  string
	opts  []LimiterOption
	fleet bool
	steps []sig
	wants []want
}

// ctlBurst is the burst of the fleet's tables.
const ctlBurst = 10

// ctlTables are the controller's rules, one table each; TestControllerSteps
// runs them through the Go, TestSharedControllerSteps through the script.
func ctlTables() []ctlTable {
	const ms = time.Millisecond
	s := time.Second
	return []ctlTable{
		{
			name:  "a 429 with no count holds the key for its Retry-After and lowers the rate by beta",
			steps: []sig{throttle(0, 0, 2*s)},
			wants: []want{{hold: 2 * s, notBefore: 2 * s, rate: 70, why: "throttled"}},
		},
		{
			name:  "a start-up collision: refusals in the fleet's first second, at its rate, hold the key a unit each and lower nothing; after it, a refusal is heard as any",
			fleet: true,
			steps: []sig{
				granting(withQuota(throttle(50*ms, 0, s), 0, s), 3), // with the key's first grants
				withQuota(throttle(55*ms, 0, s), 0, s),
				granting(withQuota(throttle(1250*ms, 1200*ms, s), 0, s), 1),
			},
			wants: []want{
				{hold: 60 * ms, notBefore: 1050 * ms},
				{hold: 70 * ms, notBefore: 1055 * ms},
				{hold: 2250 * ms, notBefore: 2250 * ms, rate: 70, why: "throttled"},
			},
		},
		{
			name:  "a 429 whose count shows quota left delays only its request",
			steps: []sig{withQuota(throttle(0, 0, 2*s), 5, s)},
			wants: []want{{notBefore: 2 * s}},
		},
		{
			name:  "a 429 the provider marks as not about the quota delays only its request",
			steps: []sig{{status: 429, ra: 2 * s, remaining: -1, reset: -1, scope: ScopeOther}},
			wants: []want{{notBefore: 2 * s}},
		},
		{
			name:  "a billing error neither holds nor lowers",
			steps: []sig{{status: 429, ra: 2 * s, remaining: 0, reset: s, scope: ScopeBilling}},
			wants: []want{{}},
		},
		{
			name:  "a 503 with Retry-After is a throttle; a 500 is not",
			steps: []sig{{at: 0, status: 500, ra: s, remaining: -1, reset: -1}, {at: ms, sent: ms, status: 503, ra: s, remaining: -1, reset: -1}},
			wants: []want{{}, {hold: ms + s, notBefore: ms + s, rate: 70, why: "throttled"}},
		},
		{
			name: "remaining 0 from a provider not known yet: a short hold, and an acceptance after it says bucket",
			steps: []sig{
				withQuota(ok(0, 0), 0, 2*s),
				withQuota(ok(150*ms, 120*ms), 0, 2*s), // sent after the zero, before its reset: accepted
				withQuota(ok(300*ms, 290*ms), 0, 2*s),
			},
			wants: []want{
				{hold: control.ProbeHold},
				{shape: control.ShapeBucket, drain: true}, // a bucket: the limiter empties its own, no hold
				{shape: control.ShapeBucket, drain: true},
			},
		},
		{
			name: "remaining 0, then a refusal sent before the reset: the shape stays unknown (a bucket refuses too), held for the Retry-After",
			steps: []sig{
				withQuota(ok(0, 0), 0, 2*s),
				withQuota(throttle(150*ms, 120*ms, s), 0, 1850*ms),
			},
			wants: []want{
				{hold: control.ProbeHold},
				{hold: 150*ms + s, notBefore: 150*ms + s, rate: 70, why: "throttled"},
			},
		},
		{
			// C = 0.05: K = cbrt((95 − 70)/(0.05·95)) = 1.74 s.
			name: "without counts, the climb back aims a twentieth under the rate refused (aimUnder)",
			opts: []LimiterOption{WithAdaptive(AdaptivePolicy{C: 0.05})},
			steps: []sig{
				throttle(0, 0, s),             // at 100/s: by beta, held 1 s, aiming at 95
				ok(2739*ms, 2730*ms),          // K after the hold's end: levelled off at 95, not 100
				throttle(2800*ms, 2790*ms, s), // refused at 95: aiming at 90.25
				ok(5539*ms, 5530*ms),          // K after this hold's end: 90.25
			},
			wants: []want{
				{hold: s, notBefore: s, rate: 70, why: "throttled"},
				{rate: 95},
				{hold: 3800 * ms, notBefore: 3800 * ms, rate: 66.5, why: "throttled"},
				{rate: 90.25},
			},
		},
		{
			// K = cbrt((95 − 70)/(0.005·95)) = 3.75 s: 0.19 s into the
			// climb it is at 73.6, in its lower half (70 to 82.5); from
			// 36.1 to 48.9 (0.95 × 0.7 × 73.6), its lower half ends 0.77 s
			// in.
			name: "without counts, a throttle early in the climb back lowers by beta twice; later in it, by beta",
			steps: []sig{
				throttle(0, 0, s),
				ok(1005*ms, 1001*ms),          // the one probe of this hold
				throttle(1200*ms, 1190*ms, s), // at 73.6: early, to 0.49 of it, aiming under 0.7 of it
				ok(2205*ms, 2201*ms),
				throttle(3700*ms, 3690*ms, s), // 1.5 s into the climb, at 46.2: by beta
			},
			wants: []want{
				{hold: s, notBefore: s, rate: 70, why: "throttled"},
				{rate: 70},
				{hold: 2200 * ms, notBefore: 2200 * ms, rate: 36.1, why: "throttled"},
				{rate: 36.1},
				{hold: 4700 * ms, notBefore: 4700 * ms, rate: 32.4, why: "throttled"},
			},
		},
		{
			// C = 2: K = cbrt((95 − 70)/(2·95)) = 0.51 s. Held 250 ms, the
			// plateau ends 2 s after the hold's end, 1.49 s after K. 0.2 s
			// past K, CUBIC alone is at 96.5.
			name:  "without counts, the climb back stays at its aim until eight holds after it began",
			opts:  []LimiterOption{WithAdaptive(AdaptivePolicy{C: 2})},
			steps: []sig{throttle(0, 0, 250*ms), ok(255*ms, 251*ms), ok(960*ms, 950*ms), ok(2450*ms, 2440*ms)},
			wants: []want{
				{hold: 250 * ms, notBefore: 250 * ms, rate: 70, why: "throttled"},
				{rate: 70.7},
				{rate: 95},   // 0.2 s past K: at the aim still
				{rate: 96.5}, // 0.2 s past the plateau's end: as CUBIC 0.2 s past K
			},
		},
		{
			// (the plateau is compared with the script's in
			// TestSharedControllerSteps: 60 s less K, 3.75 s)
			name:  "without counts, the climb back stays at its aim a minute at most",
			steps: []sig{throttle(0, 0, 10*s)},
			wants: []want{{hold: 10 * s, notBefore: 10 * s, rate: 70, why: "throttled"}},
		},
		{
			name:  "with a count, the climb back grows beyond its aim at once",
			opts:  []LimiterOption{WithAdaptive(AdaptivePolicy{C: 2})},
			steps: []sig{withQuota(throttle(0, 0, 250*ms), 0, 250*ms), ok(255*ms, 251*ms), ok(960*ms, 950*ms)},
			wants: []want{
				{hold: 250 * ms, notBefore: 250 * ms, rate: 70, why: "throttled"},
				{rate: 70.7},
				{rate: 96.5},
			},
		},
		{
			name: "with a count, a throttle early in the climb back lowers by beta",
			steps: []sig{
				withQuota(throttle(0, 0, s), 0, s),
				ok(1005*ms, 1001*ms),
				withQuota(throttle(1200*ms, 1190*ms, s), 0, s),
			},
			wants: []want{
				{hold: s, notBefore: s, rate: 70, why: "throttled"},
				{rate: 70},
				{hold: 2200 * ms, notBefore: 2200 * ms, rate: 51.5, why: "throttled"},
			},
		},
		{
			name: "near a bucket's limit found before: a throttle lowers by 0.9, and the climb back levels off just under the rate refused",
			steps: []sig{
				withQuota(ok(0, 0), 0, 2*s),
				withQuota(ok(150*ms, 120*ms), 0, 2*s), // a bucket
				throttle(200*ms, 190*ms, 0),           // at 100/s: by beta, aiming at 100 (K = 3.9 s)
				throttle(4200*ms, 4190*ms, 0),         // back at 100/s: near the limit found before
				ok(6630*ms, 6620*ms),                  // K = 2.43 s later: levelled off at 97, not 100
			},
			wants: []want{
				{hold: control.ProbeHold},
				{shape: control.ShapeBucket, drain: true},
				{shape: control.ShapeBucket, rate: 70, why: "throttled"},
				{shape: control.ShapeBucket, rate: 90, why: "throttled"},
				{shape: control.ShapeBucket, rate: 97},
			},
		},
		func() ctlTable {
			// A bucket of one unit (62/s, burst 1: full again in 16 ms, a
			// reset of 1 s in whole seconds) shows 0 after every request it
			// accepts. Its counts neither level the climb back off at the
			// rate of the moment (a key so levelled off stayed there, each
			// refusal lowering it further) nor speed it.
			one := func(x sig) sig {
				x.remaining, x.reset, x.quota, x.kind = 0, time.Second, 1, ResetKindBucket
				return x
			}
			refused := one(throttle(s, s-10*ms, s))
			return ctlTable{
				name: "a bucket of one unit: its counts of 0 leave the climb back at its own pace",
				steps: []sig{
					one(ok(0, 0)),
					refused,                   // by beta, held a unit at 100/s; the climb starts at the hold's end
					one(ok(1500*ms, 1490*ms)), // 0.49 s into the climb: CUBIC's 79.9
					one(ok(3*s, 2990*ms)),     // 1.99 s into it: 96.4
				},
				wants: []want{
					{shape: control.ShapeBucket, drain: true},
					{shape: control.ShapeBucket, hold: s + 10*ms, notBefore: 2 * s, rate: 70, why: "throttled"},
					{shape: control.ShapeBucket, drain: true, rate: 79.9},
					{shape: control.ShapeBucket, drain: true, rate: 96.4},
				},
			}
		}(),
		func() ctlTable {
			// 21 acceptances within a second of a quota of 10 (reset 1 s):
			// no window of 10 admits that many, even across its end.
			tb := ctlTable{name: "more than twice the limit accepted within a second: a bucket, without a zero"}
			for i := range 22 {
				at := time.Duration(i) * 10 * ms
				x := withQuota(ok(at+2*ms, at), 5, s)
				x.quota = 10
				tb.steps = append(tb.steps, x)
				w := want{}
				if i == 21 {
					w.shape, w.drain = control.ShapeBucket, true // a bucket's count: the limiter keeps no more
				}
				tb.wants = append(tb.wants, w)
			}
			return tb
		}(),
		{
			// HubSpot's secondly count: the window's first request (the
			// whole limit back but one) dates its start; the answer at
			// 700 ms leaving nothing holds until the window's end, 300 ms
			// later, not a whole window.
			name: "a count with a window and no reset: nothing left holds until the window's end, dated by its first request",
			steps: []sig{
				{at: 0, sent: 0, status: 200, ra: -1, remaining: 9, reset: -1, limit: 10, window: s, kind: ResetKindWindow},
				{at: 700 * ms, sent: 690 * ms, status: 200, ra: -1, remaining: 0, reset: -1, limit: 10, window: s, kind: ResetKindWindow},
			},
			wants: []want{{rate: 10, why: "advertised", shape: control.ShapeWindow}, {hold: s, rate: 10, shape: control.ShapeWindow}},
		},
		{
			// A generic "X-RateLimit-Limit: 100;w=60" with no reset: the
			// window implies one, but not what it means (a GCRA server
			// states a window too), so nothing left holds a key of unknown
			// shape briefly, a unit of the advertised rate (100/60 s).
			name: "a window and no reset, its meaning not stated: nothing left holds briefly, as a shape not known yet",
			steps: []sig{
				{at: 0, sent: 0, status: 200, ra: -1, remaining: 0, reset: -1, limit: 100, window: time.Minute},
			},
			wants: []want{{hold: control.ProbeHold, rate: 100.0 / 60, why: "advertised"}},
		},
		{
			// Salesforce's api-usage, a rolling day: looked at again a
			// minute later, not held a day, and no pace of 40 a day.
			name: "a day's count with nothing left holds the key a minute, and paces nothing",
			steps: []sig{
				{at: 0, sent: 0, status: 200, ra: -1, remaining: 0, reset: -1, limit: 40, window: 24 * time.Hour, kind: ResetKindWindow},
			},
			wants: []want{{hold: time.Minute, shape: control.ShapeWindow}},
		},
		{
			name: "a dialect that says its reset is a window's end: held until the reset at once",
			steps: []sig{
				func() sig { x := withQuota(ok(0, 0), 0, 40*time.Minute); x.kind = ResetKindWindow; return x }(),
			},
			wants: []want{{hold: 40 * time.Minute, shape: control.ShapeWindow}},
		},
		{
			name: "a dialect that says its reset is a bucket's: the limiter empties its own bucket, no hold",
			steps: []sig{
				func() sig { x := withQuota(ok(0, 0), 0, time.Minute); x.kind = ResetKindBucket; return x }(),
				func() sig {
					x := withQuota(throttle(5*ms, 5*ms, s), 0, time.Minute)
					x.kind = ResetKindBucket
					return x
				}(),
			},
			wants: []want{
				{shape: control.ShapeBucket, drain: true},
				{hold: 15 * ms, notBefore: 5*ms + s, rate: 70, why: "throttled", shape: control.ShapeBucket}, // a refusal: one unit
			},
		},
		{
			name: "a window's remaining less the requests in flight is nothing: held until its reset",
			steps: []sig{
				func() sig {
					x := withQuota(ok(0, 0), 3, 800*ms)
					x.kind, x.inFlight = ResetKindWindow, 3
					return x
				}(),
			},
			wants: []want{{hold: 800 * ms, shape: control.ShapeWindow}},
		},
		{
			name: "a window with quota left once the requests in flight are counted is not held",
			steps: []sig{
				func() sig {
					x := withQuota(ok(0, 0), 3, 800*ms)
					x.kind, x.inFlight = ResetKindWindow, 2
					return x
				}(),
			},
			wants: []want{{shape: control.ShapeWindow}},
		},
		{
			name: "a shape not known yet, remaining 2 with 2 in flight: a short hold, as for remaining 0",
			steps: []sig{
				func() sig { x := withQuota(ok(0, 0), 2, s); x.inFlight = 2; return x }(),
			},
			wants: []want{{hold: control.ProbeHold}},
		},
		{
			name: "a request refused a unit's refill (reset / limit) or more after the zero: a window, held until its reset",
			steps: []sig{
				func() sig { x := withQuota(ok(0, 0), 0, s); x.quota = 20; return x }(), // a unit: 50ms
				func() sig { x := withQuota(throttle(160*ms, 150*ms, s), 0, 840*ms); x.quota = 20; return x }(),
			},
			wants: []want{
				{hold: control.ProbeHold},
				{hold: 160*ms + s, notBefore: 160*ms + s, shape: control.ShapeWindow, rate: 70, why: "throttled"},
			},
		},
		{
			name: "the first answer after a zero with the whole limit back says nothing (a window may have reset early); twice in a row, a bucket",
			steps: []sig{
				func() sig { x := withQuota(ok(0, 0), 0, 2*s); x.quota = 20; return x }(),
				func() sig { x := withQuota(ok(130*ms, 120*ms), 19, 2*s); x.quota = 20; return x }(),
				func() sig { x := withQuota(ok(140*ms, 125*ms), 1, 2*s); x.quota = 20; return x }(), // not the first answer: nothing
				func() sig { x := withQuota(ok(300*ms, 290*ms), 0, 2*s); x.quota = 20; return x }(),
				func() sig { x := withQuota(ok(430*ms, 420*ms), 19, 2*s); x.quota = 20; return x }(),
			},
			wants: []want{
				{hold: control.ProbeHold},
				{},
				{},
				{hold: 300*ms + control.ProbeHold},
				{shape: control.ShapeBucket, drain: true},
			},
		},
		{
			// A whole-second reset may be rounded up by most of a second,
			// and a report read late: a window read as ending in 1 s may
			// have reset already (the next window's requests are accepted
			// with part of it spent).
			name: "an acceptance read within the zero's reset less its resolution tells no shape",
			steps: []sig{
				func() sig { x := withQuota(ok(0, 0), 0, s); x.quota = 20; return x }(),
				func() sig { x := withQuota(ok(300*ms, 150*ms), 17, s); x.quota = 20; return x }(),
				func() sig { x := withQuota(ok(400*ms, 350*ms), 16, s); x.quota = 20; return x }(),
			},
			wants: []want{{hold: control.ProbeHold}, {}, {}},
		},
		{
			// A bucket of two units at 50/s, its reset in whole seconds
			// (IETF's "r=0;t=1" after every other request): held for
			// the probe at every zero, it went at 17 a second.
			name: "two acceptances within the zero's resolution that say none is left, and one with some left: a bucket",
			steps: []sig{
				func() sig { x := withQuota(ok(0, 0), 0, s); x.quota = 50; return x }(),
				func() sig { x := withQuota(ok(110*ms, 105*ms), 1, s); x.quota = 50; return x }(),
				func() sig { x := withQuota(ok(120*ms, 115*ms), 0, s); x.quota = 50; return x }(),
				func() sig { x := withQuota(ok(230*ms, 225*ms), 0, s); x.quota = 50; return x }(),
			},
			wants: []want{{hold: control.ProbeHold}, {}, {hold: 120*ms + control.ProbeHold}, {shape: control.ShapeBucket, drain: true}},
		},
		{
			// A bucket of one unit never says any is left: taken for a
			// bucket at the limit it advertises, it was sent to at that
			// limit and refused a third of the time.
			name: "acceptances within the zero's resolution that all say none is left tell no shape",
			steps: []sig{
				func() sig { x := withQuota(ok(0, 0), 0, s); x.quota = 50; return x }(),
				func() sig { x := withQuota(ok(110*ms, 105*ms), 0, s); x.quota = 50; return x }(),
				func() sig { x := withQuota(ok(220*ms, 215*ms), 0, s); x.quota = 50; return x }(),
			},
			wants: []want{{hold: control.ProbeHold}, {hold: 110*ms + control.ProbeHold}, {hold: 220*ms + control.ProbeHold}},
		},
		{
			// A window that reset before its stated end, spent by others:
			// one acceptance says none is left, the next request is
			// refused a unit's refill after the zero.
			name: "one acceptance within the resolution that says none is left, then a refusal: a window",
			steps: []sig{
				func() sig { x := withQuota(ok(0, 0), 0, s); x.quota = 50; return x }(),
				func() sig { x := withQuota(ok(110*ms, 105*ms), 0, s); x.quota = 50; return x }(),
				func() sig { x := withQuota(throttle(220*ms, 215*ms, s), 0, 780*ms); x.quota = 50; return x }(),
			},
			wants: []want{
				{hold: control.ProbeHold},
				{hold: 110*ms + control.ProbeHold},
				{hold: 220*ms + s, notBefore: 220*ms + s, shape: control.ShapeWindow, rate: 70, why: "throttled"},
			},
		},
		{
			name:  "remaining 0 with a reset sooner than the probe holds until the reset",
			steps: []sig{withQuota(ok(0, 0), 0, 30*ms)},
			wants: []want{{hold: 30 * ms}},
		},
		{
			name:  "remaining 0 without a reset says nothing",
			steps: []sig{withQuota(ok(0, 0), 0, -1)},
			wants: []want{{}},
		},
		{
			name: "throttles to requests sent before the last decrease belong to its episode",
			steps: []sig{
				throttle(10*ms, 0, 0),
				throttle(12*ms, 5*ms, 0),  // sent before the decrease at 10ms: same episode
				throttle(30*ms, 20*ms, 0), // sent after it: a new episode (early, but asking for no wait: by beta)
			},
			wants: []want{
				{rate: 70, why: "throttled"},
				{rate: 70},
				{rate: 49.3, why: "throttled"},
			},
		},
		{
			name: "the first request after a hold that was obeyed, refused, is not about the quota: a storm",
			steps: []sig{
				throttle(0, 0, s),
				throttle(1001*ms, 1000*ms, s), // the first request after the hold: a probe
				throttle(1300*ms, 1290*ms, s), // in the storm: only its request waits
				ok(1400*ms, 1390*ms),
			},
			wants: []want{
				{hold: s, notBefore: s, rate: 70, why: "throttled"},
				{notBefore: 1001*ms + s, rate: 100, why: "storm"}, // the decrease the storm caused is undone
				{notBefore: 1300*ms + s, rate: 100},
				{rate: 100},
			},
		},
		{
			// A refusal among the first requests after a hold is a sign,
			// taken for the quota (a provider whose burst is a unit or two
			// refuses the second request at the rate); the holds after it
			// have three probes, 100ms apart at 100/s configured, whose
			// floor is 10/s (the limiter spaces them: spend).
			name: "a sign arms three probes at the next hold: the last, refused, is a storm's",
			steps: []sig{
				throttle(0, 0, s),
				ok(1005*ms, 1001*ms),          // the one probe of this hold
				throttle(1030*ms, 1015*ms, s), // the second request after the hold: a sign (early: by beta twice)
				ok(2040*ms, 2031*ms),
				ok(2140*ms, 2131*ms),
				throttle(2240*ms, 2232*ms, s),
			},
			wants: []want{
				{hold: s, notBefore: s, rate: 70, why: "throttled"},
				{rate: 70},
				{hold: 2030 * ms, notBefore: 2030 * ms, rate: 34.6, why: "throttled"},
				{rate: 34.7},
				{rate: 35.8},
				{notBefore: 2240*ms + s, rate: 100, why: "storm"},
			},
		},
		{
			name: "a refusal after the first requests after a hold is about the quota; a sign arms the probes of the next hold",
			steps: []sig{
				throttle(0, 0, s),
				ok(1005*ms, 1001*ms),          // the one probe of this hold
				throttle(1120*ms, 1110*ms, s), // eight units after it (early: by beta twice)
				ok(2125*ms, 2121*ms),          // the one probe of this hold
				throttle(2160*ms, 2151*ms, s), // the second request after it (at 35/s): a sign
				ok(3165*ms, 3161*ms),
				throttle(3270*ms, 3261*ms, s), // the second probe: a storm
			},
			wants: []want{
				{hold: s, notBefore: s, rate: 70, why: "throttled"},
				{rate: 70},
				{hold: 2120 * ms, notBefore: 2120 * ms, rate: 35.4, why: "throttled"},
				{rate: 35.5},
				{hold: 3160 * ms, notBefore: 3160 * ms, rate: 17.4, why: "throttled"},
				{rate: 17.4},
				{notBefore: 3270*ms + s, rate: 100, why: "storm"},
			},
		},
		{
			name:  "an advertised limit sets the rate at once",
			steps: []sig{{status: 200, ra: -1, remaining: 40, reset: s, limit: 50, window: s}},
			wants: []want{{rate: 50, why: "advertised"}},
		},
		{
			name: "while an advertised limit is believed, throttles hold the key and lower nothing",
			steps: []sig{
				{at: 10 * ms, sent: 5 * ms, status: 200, ra: -1, remaining: 40, reset: s, limit: 50, window: s},
				withQuota(throttle(12*ms, 8*ms, s), 0, s),
				withQuota(throttle(30*ms, 20*ms, s), 0, s),
			},
			wants: []want{
				{rate: 50, why: "advertised"},
				{hold: 12*ms + s, notBefore: 12*ms + s, rate: 50},
				{hold: 30*ms + s, notBefore: 30*ms + s, rate: 50}, // the advertised limit is believed
			},
		},
		{
			name:  "an advertised limit above the configured rate changes nothing",
			steps: []sig{{status: 200, ra: -1, remaining: 40, reset: s, limit: 500, window: s}},
			wants: []want{{}},
		},
		{
			name:  "WithoutAdvertisedLimits",
			opts:  []LimiterOption{WithoutAdvertisedLimits()},
			steps: []sig{{status: 200, ra: -1, remaining: 40, reset: s, limit: 50, window: s}},
			wants: []want{{}},
		},
		func() ctlTable {
			// Anthropic's small bucket, 50 requests refilled 20 a second in
			// steps, its reset a date (to the second: +7µs), called at 100/s.
			// Its count on the refusal bounds its refill between
			// 49/(2.49+1) = 14.04 and 50/(2.49-1) = 33.6 a second: the key,
			// sent at 100/s, was far above, and a unit at its rate would end
			// long before the next step. It is held until the Retry-After and
			// resumes at 14.04, not 70; a refusal of a request sent before
			// that Retry-After's end (here, before the first refusal was
			// heard) holds it until its own.
			small := func(x sig, reset time.Duration) sig {
				x.remaining, x.reset, x.quota, x.kind = 0, reset+7*time.Microsecond, 50, ResetKindBucket
				return x
			}
			return ctlTable{
				name: "a small bucket refilled in steps, its reset to the second: held until the Retry-After, resuming within its count's bounds",
				steps: []sig{
					small(ok(0, 0), 2500*ms),
					small(throttle(10*ms, 5*ms, s), 2490*ms),
					small(throttle(12*ms, 8*ms, s), 2488*ms),
				},
				wants: []want{
					{shape: control.ShapeBucket, drain: true},
					{shape: control.ShapeBucket, hold: 1010 * ms, notBefore: 1010 * ms, rate: 14.04, why: "throttled"},
					{shape: control.ShapeBucket, hold: 1012 * ms, notBefore: 1012 * ms, rate: 14.04},
				},
			}
		}(),
		func() ctlTable {
			// A bucket of 50 full again in 1.2 s (to the second): at 100/s
			// the key is under what its count allows (50/0.2 a second), and
			// a refusal holds one unit. The next request, sent after that
			// unit and before the refusal's Retry-After ended, is refused
			// too: the bucket refills in steps, and the key is held until
			// the Retry-After, at most until the reset less its resolution
			// (30 ms + 170 ms), the soonest the bucket may be full.
			coarse := func(x sig, reset time.Duration) sig {
				x.remaining, x.reset, x.quota, x.kind = 0, reset+7*time.Microsecond, 50, ResetKindBucket
				return x
			}
			return ctlTable{
				name: "a bucket refusal sent within an earlier refusal's Retry-After holds the key until its own, at most the reset less its resolution",
				steps: []sig{
					coarse(throttle(0, 0, s), 1200*ms),
					coarse(throttle(30*ms, 20*ms, s), 1170*ms),
				},
				wants: []want{
					{shape: control.ShapeBucket, hold: 10 * ms, notBefore: s, rate: 70, why: "throttled"},
					{shape: control.ShapeBucket, hold: 200*ms + 7*time.Microsecond, notBefore: 1030 * ms, rate: 49.6, why: "throttled"},
				},
			}
		}(),
		{
			name:  "WithoutDiscovery: a throttle holds, and lowers nothing",
			opts:  []LimiterOption{WithoutDiscovery()},
			steps: []sig{throttle(0, 0, s)},
			wants: []want{{hold: s, notBefore: s}},
		},
	}
}

func TestControllerSteps(t *testing.T) {
	for _, tc := range ctlTables() {
		t.Run(tc.name, func(t *testing.T) {
			require.Len(t, tc.wants, len(tc.steps))
			set, err := limiterSettingsFor("test", localRate, tc.opts)
			require.NoError(t, err)
			cfg, err := learnSettings("test", PerSecond(100), set.learn)
			require.NoError(t, err)
			if tc.fleet {
				cfg.Fleet, cfg.Burst = true, ctlBurst
			}
			var st control.State
			for i, step := range tc.steps {
				s := step.signal()
				step.grant(&st, &cfg, s.SentAt)
				d := learnSignal(&st, &cfg, s)
				w := tc.wants[i]
				at := func(off time.Duration) time.Time {
					if off == 0 {
						return time.Time{}
					}
					return ctlEpoch.Add(off)
				}
				assert.Equal(t, at(w.hold), d.Hold, "step %d: hold", i)
				assert.Equal(t, at(w.notBefore), d.NotBefore, "step %d: not before", i)
				rate := w.rate
				if rate == 0 {
					rate = 100
				}
				assert.InDelta(t, rate, st.Rate(&cfg, s.Now), 0.5, "step %d: rate", i)
				assert.Equal(t, w.why, d.Why, "step %d: why", i)
				if w.why != "" {
					assert.InDelta(t, rate, d.New.PerSecond(), 0.5, "step %d: Decision.New", i)
				}
				assert.Equal(t, w.shape, st.Shape, "step %d: shape", i)
				assert.Equal(t, w.drain, d.drain, "step %d: drain", i)
			}
		})
	}
}

func repeat(n int, f func(i int) sig) []sig {
	out := make([]sig, n)
	for i := range out {
		out[i] = f(i)
	}
	return out
}

// TestControllerEstimate: with a second of outcomes, a throttle lowers the
// rate to estimateMargin of the limit they show (the accepted share times
// the rate), aims the climb back at that limit, and the climb reaches it.
func TestControllerEstimate(t *testing.T) {
	cfg := control.DefaultConfig(100)
	var st control.State
	// 60 accepted and 40 refused over the last second, at 100/s: the
	// provider takes 60/s.
	for i := range 100 {
		at := time.Duration(i) * 10 * time.Millisecond
		status := 200
		if i%5 < 2 {
			status = 429
		}
		s := &Signal{Now: ctlEpoch.Add(at), SentAt: ctlEpoch.Add(at), Status: status}
		if status == 200 {
			st.Meter.Add(s.SentAt, false, true)
			continue
		}
		st.Meter.Add(s.SentAt, true, false)
	}
	now := ctlEpoch.Add(time.Second)
	d := learnSignal(&st, &cfg, &Signal{Now: now, SentAt: now, Status: 429})
	assert.Equal(t, "throttled", d.Why)
	assert.InDelta(t, 60, st.Wmax, 1, "the aim: the limit the outcomes show")
	assert.InDelta(t, 60*control.EstimateMargin, st.Rate(&cfg, now), 1, "just under it")
	k := math.Cbrt((1 - control.EstimateMargin) / cfg.C)
	assert.InDelta(t, 60, st.Rate(&cfg, now.Add(time.Duration(k*float64(time.Second)))), 1, "back at the aim after K = %.1fs", k)
	assert.Greater(t, k, 2.0, "the climb back to the aim takes seconds")
}

// ---- through the local limiters ----

func TestTokenBucketHoldsAndResumesAtTheRate(t *testing.T) {
	tb, fc := newTokenBucketOnFake(t, PerSecond(10), 5, WithoutDiscovery(), WithTransitMargin(0))
	ctx := context.Background()
	d := tb.Learn(ctx, "k", Signal{Now: fc.Now(), SentAt: fc.Now(), Status: 429, RetryAfter: time.Second, HasRetryAfter: true})
	require.Equal(t, fc.Now().Add(time.Second), d.Hold)
	// During the hold every request waits for its end, then the bucket
	// holds one token (not its burst): the next follow at the rate.
	for i, wantDelay := range []time.Duration{time.Second, 1100 * time.Millisecond, 1200 * time.Millisecond} {
		delay, err := delayOf(tb.reserve("k", 1, budget{}))
		require.NoError(t, err)
		assert.Equal(t, wantDelay, delay, "request %d", i)
	}
	// Another key is not held.
	delay, err := delayOf(tb.reserve("other", 1, budget{}))
	require.NoError(t, err)
	assert.Zero(t, delay)
	// A hold longer than the budget refuses at once.
	_, err = delayOf(tb.reserve("k", 1, budget{maxWait: 500 * time.Millisecond}))
	var le *LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, ReasonMaxWait, le.Reason)
	assert.Equal(t, 1300*time.Millisecond, le.Wait, "the real wait: the hold and the queue")
}

// TestTokenBucketTransitMargin: the bucket keeps rate·5ms of its burst in
// reserve: every unit of the burst goes, the last one after 5 ms, and a
// request that must wait for the refill waits 5 ms more; the sustained
// rate is whole.
func TestTokenBucketTransitMargin(t *testing.T) {
	tb, fc := newTokenBucketOnFake(t, PerSecond(100), 10, WithTransitMargin(5*time.Millisecond))
	require.InDelta(t, 0.5, tb.margin, 1e-9)
	for i := range 9 {
		delay, err := delayOf(tb.reserve("k", 1, budget{}))
		require.NoError(t, err)
		require.Zero(t, delay, "request %d", i)
	}
	delay, err := delayOf(tb.reserve("k", 1, budget{}))
	require.NoError(t, err)
	assert.Equal(t, 5*time.Millisecond, delay, "the last unit of the burst waits for half a unit more")
	delay, err = delayOf(tb.reserve("k", 1, budget{}))
	require.NoError(t, err)
	assert.Equal(t, 15*time.Millisecond, delay, "then a unit, and the margin")
	// A second later the bucket has refilled 100 units, its burst of 10.
	limAdvanceTo(fc, fc.Now().Add(time.Second))
	delay, err = delayOf(tb.reserve("k", 10, budget{}))
	require.NoError(t, err)
	assert.Equal(t, 5*time.Millisecond, delay, "a cost of the whole burst is granted, after the margin")
}

func TestLeakyBucketHolds(t *testing.T) {
	lb, fc := newLeakyBucketOnFake(t, PerSecond(10), 10)
	ctx := context.Background()
	d := lb.Learn(ctx, "k", Signal{Now: fc.Now(), SentAt: fc.Now(), Status: 429, RetryAfter: time.Second, HasRetryAfter: true})
	require.False(t, d.Hold.IsZero())
	_, err := lb.Wait(ctx, "k", 1, 500*time.Millisecond)
	var le *LimitError
	require.ErrorAs(t, err, &le, "the hold is longer than the max wait: refused at once")
	assert.Equal(t, time.Second, le.Wait)
}

// ---- through the Transport ----

// ctlGet sends n GETs to srv through tr, one after the other, and returns
// their statuses.
func ctlGet(t *testing.T, tr *Transport, srv *recServer, n int) []int {
	t.Helper()
	c := &http.Client{Transport: tr}
	t.Cleanup(c.CloseIdleConnections)
	var got []int
	for range n {
		resp, err := c.Get(srv.URL + "/v1/charges")
		require.NoError(t, err)
		resp.Body.Close()
		got = append(got, resp.StatusCode)
	}
	return got
}

func TestTransportBelievesAdvertisedLimits(t *testing.T) {
	for _, tc := range []struct {
		name   string
		header []string
		opts   []LimiterOption
		want   float64 // the rate after; 100 for no change
	}{
		{"RateLimit-Policy", []string{"Ratelimit-Policy", `"default";q=50;w=1`}, nil, 50},
		{"RateLimit-Policy per minute", []string{"Ratelimit-Policy", `"default";q=3000;w=60`}, nil, 50},
		{"RateLimit-Limit with a window", []string{"Ratelimit-Limit", "50;w=1"}, nil, 50},
		{"the lowest policy wins", []string{"Ratelimit-Policy", `"burst";q=100;w=1, "day";q=8640000;w=86400, "min";q=2400;w=60`}, nil, 40},
		{"X-RateLimit-Limit without a window", []string{"X-Ratelimit-Limit", "50"}, nil, 100},
		{"advertised above the configured rate", []string{"Ratelimit-Policy", `"default";q=200;w=1`}, nil, 100},
		{"WithoutAdvertisedLimits", []string{"Ratelimit-Policy", `"default";q=50;w=1`}, []LimiterOption{WithoutAdvertisedLimits()}, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newRecServer(t, rtyScript(rtyA(http.StatusOK, tc.header...)))
			for _, l := range []interface {
				Limiter
				EffectiveRate(string) Rate
			}{mustTB(t, PerSecond(100), 20, tc.opts...), mustLB(t, PerSecond(100), 20, tc.opts...)} {
				var rec obsRecorder
				tr := mustNewTransport(t, srv.base(), WithLimiter(l), WithObserver(rec.observer()))
				for _, code := range ctlGet(t, tr, srv, 5) {
					require.Equal(t, http.StatusOK, code)
				}
				key := srv.host()
				if tc.want == 100 {
					assert.Empty(t, rec.rateLog())
					assert.Equal(t, PerSecond(100), l.EffectiveRate(key))
					continue
				}
				assert.Equal(t, []rateChange{{key, PerSecond(100), PerSecond(tc.want), "advertised"}}, rec.rateLog(),
					"one change, not one a response")
				assert.Equal(t, PerSecond(tc.want), l.EffectiveRate(key))
			}
		})
	}
}

func mustTB(t *testing.T, r Rate, burst int, opts ...LimiterOption) *TokenBucket {
	t.Helper()
	tb, err := NewTokenBucket(r, burst, opts...)
	require.NoError(t, err)
	return tb
}

func mustLB(t *testing.T, r Rate, depth int, opts ...LimiterOption) *LeakyBucket {
	t.Helper()
	lb, err := NewLeakyBucket(r, depth, opts...)
	require.NoError(t, err)
	return lb
}

// TestTransportNotAboutTheQuota: a provider that throttles a share of
// requests whatever the rate, with a count that shows quota left: only the
// throttled request waits its Retry-After; the others go on at once, and
// the rate is not lowered.
func TestTransportNotAboutTheQuota(t *testing.T) {
	srv := newRecServer(t, rtyScript(
		rtyA(http.StatusTooManyRequests, "RateLimit", `"default";r=50;t=1`, "Retry-After", "30"),
		rtyA(http.StatusOK, "RateLimit", `"default";r=50;t=1`),
	))
	tb := mustTB(t, PerSecond(100), 20)
	var rec obsRecorder
	tr := mustNewTransport(t, srv.base(), WithLimiter(tb), WithObserver(rec.observer()))
	start := time.Now()
	assert.Equal(t, []int{429, 200, 200, 200}, ctlGet(t, tr, srv, 4), "without retries, the 429 comes back")
	assert.Less(t, time.Since(start), 5*time.Second, "the key was not held for 30 s")
	assert.Empty(t, rec.rateLog(), "the rate was not lowered")
	assert.Equal(t, PerSecond(100), tb.EffectiveRate(srv.host()))
}

// TestTransportProviderSaysDoNotRetry: a 429 the provider marks as a
// billing error, or says not to retry, comes back at once.
func TestTransportProviderSaysDoNotRetry(t *testing.T) {
	for _, tc := range []struct {
		name  string
		scope Scope
		retry RetryDecision
	}{
		{"billing", ScopeBilling, RetryDefault},
		{"should not retry", ScopeUnknown, RetryNo},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := RetryPolicy{MaxAttempts: 3}
			s := &Signal{Status: 429, Scope: tc.scope, Retry: tc.retry}
			req := httptest.NewRequest(http.MethodGet, "http://x/", nil)
			assert.False(t, p.worthRetry(req, &http.Response{StatusCode: 429}, nil, s))
		})
	}
}

// TestTransportLongQuotaHold: GitHub's hourly quota, answered 403 with
// remaining 0 and a reset 40 minutes away, holds the key until the reset
// (past the one-minute pause cap, within WithMaxQuotaHold): a request that
// cannot wait that long is refused at once, with the real wait, and
// nothing more reaches the provider.
func TestTransportLongQuotaHold(t *testing.T) {
	var n atomic.Int32
	reset := time.Now().Add(40 * time.Minute)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		n.Add(1)
		w.Header().Set("X-Ratelimit-Limit", "5000")
		w.Header().Set("X-Ratelimit-Remaining", "0")
		w.Header().Set("X-Ratelimit-Used", "5000")
		w.Header().Set("X-Ratelimit-Resource", "core")
		w.Header().Set("X-Ratelimit-Reset", strconv.FormatInt(reset.Unix(), 10))
		w.WriteHeader(http.StatusForbidden)
	}))
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		name string
		lim  Limiter
		opts []Option
		want time.Duration // the hold; 0: capped by WithMaxQuotaHold below
	}{
		{"token bucket", mustTB(t, Per(5000, time.Hour), 10), nil, 40 * time.Minute},
		{"leaky bucket", mustLB(t, Per(5000, time.Hour), 10), nil, 40 * time.Minute},
		{"no limiter", nil, nil, 40 * time.Minute},
		{"WithMaxQuotaHold caps it", mustTB(t, Per(5000, time.Hour), 10), []Option{WithMaxQuotaHold(10 * time.Minute)}, 10 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n.Store(0)
			opts := tc.opts
			if tc.lim != nil {
				opts = append(opts, WithLimiter(tc.lim))
			}
			tr := mustNewTransport(t, srv.Client().Transport, opts...)
			c := &http.Client{Transport: tr}
			t.Cleanup(c.CloseIdleConnections)
			resp, err := c.Get(srv.URL)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusForbidden, resp.StatusCode)

			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
			require.NoError(t, err)
			start := time.Now()
			_, err = c.Do(req)
			var le *LimitError
			require.ErrorAs(t, err, &le)
			assert.Less(t, time.Since(start), time.Second, "refused at once, not after a minute")
			assert.Equal(t, ReasonDeadline, le.Reason)
			assert.InDelta(t, tc.want.Seconds(), le.Wait.Seconds(), 5, "the real wait")
			assert.EqualValues(t, 1, n.Load(), "nothing more reached the provider")
		})
	}
}

// ---- the budget: requests in flight count against the remaining quota ----

// budgetStep is a step of the budget tables: a report (a response's
// signal) or, when grant > 0, a request of that cost granted at its time.
type budgetStep struct {
	report sig
	grant  int
	at     time.Duration // a grant's time
}

// TestControllerBudgetSteps: a report of a window's quota (or one of
// unknown shape) leaves its remaining less the requests in flight as the
// key's budget until its reset; each grant spends it; a spent budget holds
// the key until the reset (a window) or briefly, for one probe (a shape
// not known yet); a later report replaces it; a bucket has none.
func TestControllerBudgetSteps(t *testing.T) {
	const ms = time.Millisecond
	window := func(at, sent time.Duration, remaining float64, inFlight int, reset time.Duration) budgetStep {
		x := withQuota(ok(at, sent), remaining, reset)
		x.kind, x.inFlight = ResetKindWindow, inFlight
		return budgetStep{report: x}
	}
	unknown := func(at, sent time.Duration, remaining float64, inFlight int, reset time.Duration) budgetStep {
		x := withQuota(ok(at, sent), remaining, reset)
		x.inFlight = inFlight
		return budgetStep{report: x}
	}
	bucket := func(at, sent time.Duration, remaining float64, inFlight int, reset time.Duration) budgetStep {
		x := withQuota(ok(at, sent), remaining, reset)
		x.kind, x.inFlight = ResetKindBucket, inFlight
		return budgetStep{report: x}
	}
	windowed := func(at, sent time.Duration, remaining float64, inFlight int) budgetStep {
		x := withQuota(ok(at, sent), remaining, -1)
		x.limit, x.window, x.inFlight, x.kind = 10, time.Second, inFlight, ResetKindWindow
		return budgetStep{report: x}
	}
	grant := func(at time.Duration) budgetStep { return budgetStep{grant: 1, at: at} }
	type want struct {
		granted bool
		hold    time.Duration // the key's hold after the step; 0 for none
	}
	for _, tc := range []struct {
		name  string
		steps []budgetStep
		wants []want
	}{
		{
			name: "a window: remaining 5 with 2 in flight leaves 3, then held until the reset",
			steps: []budgetStep{
				window(0, 0, 5, 2, 800*ms),
				grant(ms), grant(2 * ms), grant(3 * ms), grant(4 * ms),
			},
			wants: []want{{}, {granted: true}, {granted: true}, {granted: true}, {hold: 800 * ms}},
		},
		{
			name: "after the reset the budget is gone: everything is granted until the next report",
			steps: []budgetStep{
				window(0, 0, 1, 0, 100*ms),
				grant(ms), grant(2 * ms), grant(100 * ms), grant(101 * ms),
			},
			wants: []want{{}, {granted: true}, {hold: 100 * ms}, {granted: true, hold: 100 * ms}, {granted: true, hold: 100 * ms}},
		},
		{
			name: "a later report replaces the budget, with its own requests in flight",
			steps: []budgetStep{
				window(0, 0, 10, 0, 900*ms),
				grant(ms), grant(2 * ms),
				window(10*ms, 5*ms, 4, 3, 890*ms), // 4 left, 3 of them taken by the requests in flight
				grant(11 * ms), grant(12 * ms),
			},
			wants: []want{{}, {granted: true}, {granted: true}, {}, {granted: true}, {hold: 900 * ms}},
		},
		{
			name: "a shape not known yet: a spent budget holds briefly, then lets one probe go",
			steps: []budgetStep{
				unknown(0, 0, 2, 1, time.Second),
				grant(ms), grant(2 * ms), grant(2*ms + control.ProbeHold), grant(3*ms + control.ProbeHold),
			},
			wants: []want{{}, {granted: true}, {hold: 2*ms + control.ProbeHold}, {granted: true, hold: 2*ms + control.ProbeHold}, {hold: 3*ms + 2*control.ProbeHold}},
		},
		{
			name: "a higher count read after a lower one, of a request sent before it, is that count late: it gives nothing back",
			steps: []budgetStep{
				unknown(0, 0, 1, 0, time.Second),
				unknown(2*ms, ms, 0, 0, time.Second), // none left: held for the probe
				unknown(3*ms, 0, 2, 0, time.Second),  // sent before the one before, counted before it, read after it
				grant(2*ms + control.ProbeHold), grant(3*ms + control.ProbeHold),
			},
			wants: []want{{}, {hold: 2*ms + control.ProbeHold}, {hold: 2*ms + control.ProbeHold}, {granted: true, hold: 2*ms + control.ProbeHold}, {hold: 3*ms + 2*control.ProbeHold}},
		},
		{
			name: "a bucket has no budget: a low remaining that refills holds nothing",
			steps: []budgetStep{
				bucket(0, 0, 1, 3, time.Second),
				grant(ms), grant(2 * ms), grant(3 * ms),
			},
			wants: []want{{}, {granted: true}, {granted: true}, {granted: true}},
		},
		{
			name: "a window and no reset: the window's first request dates it, and a spent budget holds until its end",
			steps: []budgetStep{
				windowed(0, 0, 9, 0), // the window's first: it began by 0
				windowed(600*ms, 590*ms, 2, 1),
				grant(601 * ms), grant(602 * ms),
			},
			wants: []want{{}, {}, {granted: true}, {hold: time.Second}},
		},
		{
			name: "no reset and no window, no budget",
			steps: []budgetStep{
				unknown(0, 0, 1, 3, -1),
				grant(ms), grant(2 * ms),
			},
			wants: []want{{}, {granted: true}, {granted: true}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Len(t, tc.wants, len(tc.steps))
			cfg := control.DefaultConfig(100)
			var st control.State
			for i, step := range tc.steps {
				w := tc.wants[i]
				granted := false
				if step.grant > 0 {
					now := ctlEpoch.Add(step.at)
					granted = st.Spend(now, now, step.grant, st.Rate(&cfg, now))
				} else {
					learnSignal(&st, &cfg, step.report.signal())
				}
				assert.Equal(t, w.granted, granted, "step %d: granted", i)
				var hold time.Duration
				if !st.Hold.IsZero() {
					hold = st.Hold.Sub(ctlEpoch)
				}
				assert.Equal(t, w.hold, hold, "step %d: hold", i)
			}
		})
	}
}

// TestLimitersSpendTheBudget: through the local limiters on a fake clock,
// a window's report of 5 left with 2 requests in flight lets 3 more go at
// once; the next waits for the reset.
func TestLimitersSpendTheBudget(t *testing.T) {
	report := func(now time.Time) Signal {
		return Signal{Now: now, SentAt: now, Status: 200, InFlight: 2, Quotas: []Quota{{
			Remaining: 5, HasRemaining: true, Reset: time.Second, HasReset: true, Kind: ResetKindWindow,
		}}}
	}
	t.Run("token bucket", func(t *testing.T) {
		tb, fc := newTokenBucketOnFake(t, PerSecond(100), 10)
		tb.Learn(context.Background(), "k", report(fc.Now()))
		for i := range 3 {
			d, err := delayOf(tb.reserve("k", 1, budget{}))
			require.NoError(t, err)
			assert.Zero(t, d, "request %d", i)
		}
		d, err := delayOf(tb.reserve("k", 1, budget{}))
		require.NoError(t, err)
		assert.Equal(t, time.Second, d, "the fourth waits for the reset")
		_, err = delayOf(tb.reserve("k", 1, budget{maxWait: 500 * time.Millisecond}))
		var le *LimitError
		require.ErrorAs(t, err, &le, "a request that cannot wait that long is refused at once")
	})
	t.Run("token bucket, turns reserved before the report", func(t *testing.T) {
		// Ten turns reserved at once, five waiting for the refill; the
		// report comes meanwhile: a turn's budget is spent when it comes.
		tb, fc := newTokenBucketOnFake(t, PerSecond(100), 5)
		var waiting []grant
		for range 10 {
			g, err := tb.reserve("k", 1, budget{})
			require.NoError(t, err)
			if g.delay > 0 {
				waiting = append(waiting, g)
			}
		}
		require.Len(t, waiting, 5)
		tb.Learn(context.Background(), "k", report(fc.Now()))
		committed := 0
		for _, g := range waiting {
			limAdvanceTo(fc, g.at.Add(g.delay))
			if tb.commit(g, 1) {
				committed++
			} else {
				tb.cancel(g)
			}
		}
		assert.Equal(t, 3, committed, "three go; the others wait for the reset")
	})
	t.Run("leaky bucket", func(t *testing.T) {
		lb, fc := newLeakyBucketOnFake(t, PerSecond(100), 10)
		lb.Learn(context.Background(), "k", report(fc.Now()))
		for i := range 3 {
			w, _, err := lb.arrive("k", 1, budget{})
			require.NoError(t, err)
			require.Nil(t, w, "request %d goes at once", i)
			fc.Advance(10 * time.Millisecond)
		}
		_, err := lb.Wait(context.Background(), "k", 1, 500*time.Millisecond)
		var le *LimitError
		require.ErrorAs(t, err, &le, "the fourth would wait for the reset")
		assert.InDelta(t, 970*time.Millisecond, le.Wait, float64(time.Millisecond))
	})
}

// TestAdvertisedPacesShortWindowsOnly: a limit over a window of up to an
// hour is a pace (limit/window); a day's is spent as counted, not spread.
func TestAdvertisedPacesShortWindowsOnly(t *testing.T) {
	s := Signal{Quotas: []Quota{
		{Dimension: Requests, Name: "burst", Limit: 100, HasLimit: true, Window: time.Second, HasWindow: true},
		{Dimension: Requests, Name: "daily", Limit: 1000, HasLimit: true, Window: 24 * time.Hour, HasWindow: true},
	}}
	assert.InDelta(t, 100, s.advertised(), 1e-9)
	s.Quotas = s.Quotas[1:]
	assert.Zero(t, s.advertised())
	s.Quotas[0].Window = time.Hour
	assert.InDelta(t, 1000.0/3600, s.advertised(), 1e-9)
}

// bucketCount gives x a bucket's count: remaining of 10, full again in 1 s.
func bucketCount(x sig, remaining float64) sig {
	x.remaining, x.reset, x.quota, x.kind = remaining, time.Second, 10, ResetKindBucket
	return x
}

// countStream feeds st, at the key's own rate, successes whose bucket
// counts (limit 10, reset 1 s, a bucket by its dialect) are remaining(t) at
// t, from from up to to, and returns the decisions that changed the rate.
func countStream(st *control.State, cfg *control.Config, from, to time.Duration, remaining func(time.Duration) float64) []Decision {
	return sentStream(st, cfg, from, to, remaining, 0)
}

// sentStream is countStream with the requests sent at share of the key's
// rate, each granted by the limiter (control.State.Spend) as it goes; share 0
// sends at the rate and grants nothing.
func sentStream(st *control.State, cfg *control.Config, from, to time.Duration, remaining func(time.Duration) float64, share float64) []Decision {
	var changed []Decision
	pace := share
	if pace == 0 {
		pace = 1
	}
	for at := from; at < to; {
		sent := at - 2*time.Millisecond
		if share > 0 {
			st.Spend(ctlEpoch.Add(sent), ctlEpoch.Add(sent), 1, st.Rate(cfg, ctlEpoch.Add(sent)))
		}
		if d := learnSignal(st, cfg, bucketCount(ok(at, sent), remaining(at)).signal()); d.Why != "" {
			changed = append(changed, d)
		}
		at += time.Duration(float64(time.Second) / (st.Rate(cfg, ctlEpoch.Add(at)) * pace))
	}
	return changed
}

// TestControllerRoomSteps: climbing back after a decrease, with the key
// sending at its rate. A bucket whose counts show room (9 of 10 left: full)
// climbs four times as fast (to 100/s a second after the decrease, against
// 87.5 along CUBIC alone); counts below full go at CUBIC's pace; a count
// with no room right after counts with room levels the climb off at the
// rate of the last count with room (counts that fell level it off at the
// refill they show: TestControllerLevelsAtTheRefill).
// (TestSharedBucketRoomClimbsFaster runs the same through Redis.)
func TestControllerRoomSteps(t *testing.T) {
	const ms = time.Millisecond
	steady := func(n float64) func(time.Duration) float64 {
		return func(time.Duration) float64 { return n }
	}
	for _, tc := range []struct {
		name  string
		first func(time.Duration) float64 // the counts after the decrease, up to until
		until time.Duration
		rate  float64                     // the rate then
		then  func(time.Duration) float64 // the counts for 100 ms after
		level float64                     // the rate after those
		why   string
	}{
		{"room: four times as fast", steady(9), time.Second, 100, steady(9), 100, ""},
		{"room, then none: the rate of the last count with room", steady(9), 500 * ms, 96.0, steady(0), 95.9, "counted"},
		{"not full: CUBIC's pace", steady(8), time.Second, 87.5, steady(8), 88.7, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := control.DefaultConfig(100)
			var st control.State
			// A second at the configured rate, full, then a refusal: 70/s.
			countStream(&st, &cfg, 0, time.Second, steady(9))
			d := learnSignal(&st, &cfg, bucketCount(throttle(time.Second, time.Second-2*ms, 0), 0).signal())
			require.Equal(t, "throttled", d.Why)
			require.InDelta(t, 70, d.New.PerSecond(), 0.01)
			changed := countStream(&st, &cfg, time.Second+10*ms, time.Second+tc.until, tc.first)
			assert.Empty(t, changed, "a faster climb back is not told")
			assert.InDelta(t, tc.rate, st.Rate(&cfg, ctlEpoch.Add(time.Second+tc.until)), 0.5)
			changed = countStream(&st, &cfg, time.Second+tc.until, time.Second+tc.until+100*ms, tc.then)
			assert.InDelta(t, tc.level, st.Rate(&cfg, ctlEpoch.Add(time.Second+tc.until+100*ms)), 0.5)
			if tc.why == "" {
				assert.Empty(t, changed)
				return
			}
			require.NotEmpty(t, changed)
			assert.Equal(t, tc.why, changed[0].Why)
		})
	}
}

// TestControllerRoomNeedsTheRate: room speeds the climb back only while
// the key's requests go at its rate. Sent at it, counts with room climb
// four times as fast, as in TestControllerRoomSteps; sent at 60% of it (a
// queue given at a lower rate, or a caller that sends less), the same
// counts say nothing of the key's rate, and the climb goes at CUBIC's
// pace; a count with no room then levels it off at the rate the room was
// shown at, not at the key's.
func TestControllerRoomNeedsTheRate(t *testing.T) {
	const ms = time.Millisecond
	full := func(time.Duration) float64 { return 9 }
	for _, tc := range []struct {
		name     string
		share    float64 // of the key's rate its requests go at
		low, top float64 // the rate a second after the decrease
	}{
		{"sent at its rate: four times as fast", 1, 99.5, 100},
		// (CUBIC's pace is 87.5; the counts of the first quarter second
		// after the decrease still find the requests before it, at the
		// rate before it, and speed the climb.)
		{"sent at 60% of it: CUBIC's pace", 0.6, 87.4, 94},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := control.DefaultConfig(100)
			var st control.State
			sentStream(&st, &cfg, 0, time.Second, full, 1)
			d := learnSignal(&st, &cfg, bucketCount(throttle(time.Second, time.Second-2*ms, 0), 0).signal())
			require.InDelta(t, 70, d.New.PerSecond(), 0.01)
			assert.Empty(t, sentStream(&st, &cfg, time.Second+10*ms, 2*time.Second, full, tc.share), "a faster climb back is not told")
			r := st.Rate(&cfg, ctlEpoch.Add(2*time.Second))
			assert.GreaterOrEqual(t, r, tc.low)
			assert.LessOrEqual(t, r, tc.top)
			if tc.share == 1 {
				return
			}
			went := st.RoomRate
			assert.InDelta(t, tc.share*r, went, 0.05*r, "room was shown at the rate sent")
			changed := sentStream(&st, &cfg, 2*time.Second, 2*time.Second+100*ms, func(time.Duration) float64 { return 0 }, tc.share)
			require.NotEmpty(t, changed)
			assert.Equal(t, "counted", changed[0].Why)
			assert.InDelta(t, went, changed[0].New.PerSecond(), 0.5, "levelled off at the rate room was shown at")
		})
	}
}

// climbingBackAt70 returns a key of a limiter configured at 100/s that a
// bucket's refusal (its count 0) lowered to 70/s at 1 s, after a second of
// counts with room: climbing back from there.
func climbingBackAt70(t *testing.T) (*control.Config, *control.State) {
	t.Helper()
	cfg := control.DefaultConfig(100)
	st := new(control.State)
	countStream(st, &cfg, 0, time.Second, func(time.Duration) float64 { return 9 })
	d := learnSignal(st, &cfg, bucketCount(throttle(time.Second, time.Second-2*time.Millisecond, 0), 0).signal())
	require.InDelta(t, 70, d.New.PerSecond(), 0.01)
	return &cfg, st
}

// TestControllerLevelsAtTheRefill: climbing back after a decrease, sent at
// its rate to a provider whose bucket refills more slowly than the climb
// goes, the counts fall while the bucket still has room, and the climb
// levels off at the rate they show it refills at: before the bucket is
// empty, with no refusal.
func TestControllerLevelsAtTheRefill(t *testing.T) {
	const ms = time.Millisecond
	for _, limit := range []float64{75, 85, 95} {
		t.Run(fmt.Sprintf("%g/s", limit), func(t *testing.T) {
			cfg, st := climbingBackAt70(t)
			provider, refused := &simBucket{capacity: 10, rate: limit, level: 10, at: time.Second}, 0
			changed := countStream(st, cfg, time.Second+10*ms, 4*time.Second, func(at time.Duration) float64 {
				ok, q := provider.take(at, time.Second)
				if !ok {
					refused++
				}
				return q.Remaining
			})
			require.NotEmpty(t, changed, "levelled off")
			assert.Equal(t, "counted", changed[0].Why)
			assert.InDelta(t, limit, changed[0].New.PerSecond(), 0.05*limit, "the refill the counts show")
			assert.Zero(t, refused, "the bucket was never empty")
		})
	}
}

// TestControllerLevelsAnEmptyBucketAtItsRefill: climbing back above a
// bucket's limit, the key keeps the provider's bucket empty: every count it
// hears is 0, among refusals. What the bucket accepted over a stretch of
// such counts is its refill, and the climb levels off there (nearAim of
// the measure, which is up to a unit over its span above it) within
// drainMin or so of the first. (Taken again at every count of 0, the
// stretch never measured: the climb levelled where it was, above the
// limit, and only refusals brought it down.) The refusals are not heard
// here, so that only the counts steer.
func TestControllerLevelsAnEmptyBucketAtItsRefill(t *testing.T) {
	const ms = time.Millisecond
	for _, limit := range []float64{40, 50, 60} {
		t.Run(fmt.Sprintf("%g/s", limit), func(t *testing.T) {
			cfg, st := climbingBackAt70(t)
			provider := &simBucket{capacity: 10, rate: limit, at: time.Second}
			var levelled []Decision
			var first time.Duration
			for at := time.Second + 10*ms; at < 2*time.Second; at += time.Duration(float64(time.Second) / st.Rate(cfg, ctlEpoch.Add(at))) {
				accepted, q := provider.take(at, time.Second)
				if !accepted {
					continue
				}
				if first == 0 && q.Remaining == 0 {
					first = at
				}
				if d := learnSignal(st, cfg, bucketCount(ok(at, at-2*ms), q.Remaining).signal()); d.Why == "counted" {
					levelled = append(levelled, d)
					if len(levelled) == 1 {
						assert.LessOrEqual(t, at-first, control.DrainMin+100*ms, "levelled off a measure after the first count of 0")
					}
				}
			}
			require.NotEmpty(t, levelled, "levelled off below the rate")
			assert.InDelta(t, limit, levelled[0].New.PerSecond(), 1/control.DrainMin.Seconds()+1, "at the refill the accepted requests show")
			assert.InDelta(t, limit, st.Rate(cfg, ctlEpoch.Add(2*time.Second)), 1/control.DrainMin.Seconds()+1, "and stays there")
		})
	}
}

// TestControllerProbesAfterAHold: after a hold that a throttle without
// counts set after a sign of a storm, spend parts the first requests
// granted by a unit at the floor rate (three probes at 100/s configured,
// whose floor is 10/s), and no others: none after the probes, none after a
// hold without a sign (its one probe is the first request), none while a
// storm is believed, none after a hold with counts; a key whose floor's
// unit is longer than the probes may take (a quarter of the hold:
// stormProbeShare) has one probe.
func TestControllerProbesAfterAHold(t *testing.T) {
	const ms, s = time.Millisecond, time.Second
	settings := func(r float64) control.Config {
		cfg, err := learnSettings("test", PerSecond(r), learnOptions{})
		require.NoError(t, err)
		return cfg
	}
	at := func(off time.Duration) time.Time { return ctlEpoch.Add(off) }
	// spends grants a request at each offset and returns the key's hold
	// after each.
	spends := func(st *control.State, cfg *control.Config, offs ...time.Duration) []time.Duration {
		var holds []time.Duration
		for _, off := range offs {
			assert.True(t, st.Spend(at(off), at(off), 1, st.Rate(cfg, at(off))))
			holds = append(holds, st.Hold.Sub(ctlEpoch))
		}
		return holds
	}

	t.Run("one without a sign, three after one", func(t *testing.T) {
		cfg := settings(100)
		var st control.State
		d := learnSignal(&st, &cfg, throttle(0, 0, s).signal())
		require.Equal(t, at(s), d.Hold)
		assert.Equal(t, []time.Duration{s, s}, spends(&st, &cfg, s, 1015*ms))
		d = learnSignal(&st, &cfg, throttle(1030*ms, 1015*ms, s).signal()) // the second request: a sign
		require.Equal(t, at(2030*ms), d.Hold)
		assert.Equal(t, []time.Duration{2130 * ms, 2230 * ms, 2230 * ms, 2230 * ms},
			spends(&st, &cfg, 2030*ms, 2130*ms, 2230*ms, 2250*ms))
	})
	t.Run("all after a long hold, sign or not", func(t *testing.T) {
		// A Retry-After of 2 s is longer than a bucket at the floor asks
		// of a request sent early (see longHold): ten probes, the most
		// half the hold has room for.
		cfg := settings(100)
		var st control.State
		d := learnSignal(&st, &cfg, throttle(0, 0, 2*s).signal())
		require.Equal(t, at(2*s), d.Hold)
		assert.Equal(t, []time.Duration{2100 * ms, 2200 * ms, 2300 * ms, 2400 * ms, 2500 * ms, 2600 * ms, 2700 * ms, 2800 * ms, 2900 * ms, 2900 * ms, 2900 * ms},
			spends(&st, &cfg, 2*s, 2100*ms, 2200*ms, 2300*ms, 2400*ms, 2500*ms, 2600*ms, 2700*ms, 2800*ms, 2900*ms, 2910*ms))
	})
	t.Run("one after a throttle that says nothing", func(t *testing.T) {
		// No count, no Retry-After: held a unit at the floor rate (100
		// ms), not one at the key's (14 ms at 70/s), so that the first
		// request after the hold is a probe; refused the same way, a
		// storm's (see unsaid).
		cfg := settings(100)
		var st control.State
		d := learnSignal(&st, &cfg, throttle(0, 0, -1).signal())
		require.Equal(t, at(100*ms), d.Hold)
		assert.Equal(t, []time.Duration{100 * ms, 100 * ms}, spends(&st, &cfg, 100*ms, 115*ms))
		d = learnSignal(&st, &cfg, throttle(105*ms, 100*ms, -1).signal())
		assert.Equal(t, "storm", d.Why, "the probe, refused: %+v", d)
		assert.True(t, d.Hold.IsZero(), "a storm's throttle holds nothing: %+v", d)
	})
	t.Run("the limiter's turn, late or on time", func(t *testing.T) {
		// One probe after a hold of 1 s without a sign; the rate is 70/s
		// after it, a unit 14.3 ms. A turn the limiter gives a unit late
		// (a TokenBucket's first after a hold waits for its transit
		// margin) is the probe's: its request, refused, is a storm's.
		cfg := settings(100)
		var st control.State
		learnSignal(&st, &cfg, throttle(0, 0, s).signal())
		require.True(t, st.Spend(at(1015*ms), at(1014*ms), 1, 70))
		d := learnSignal(&st, &cfg, throttle(1020*ms, 1015*ms, s).signal())
		assert.Equal(t, "storm", d.Why, "the probe given late, refused: %+v", d)
		// A turn given on time, its waiter woken 5 ms late: the next
		// request, a unit after the turn (a LeakyBucket keeps its pace),
		// is not the probe, and its refusal is a sign only.
		var st2 control.State
		learnSignal(&st2, &cfg, throttle(0, 0, s).signal())
		require.True(t, st2.Spend(at(1005*ms), at(s), 1, 70))
		d = learnSignal(&st2, &cfg, throttle(1020*ms, 1015*ms, s).signal())
		assert.Equal(t, "throttled", d.Why, "the request after the probe, refused: %+v", d)
	})
	t.Run("none while a storm is believed", func(t *testing.T) {
		cfg := settings(100)
		var st control.State
		learnSignal(&st, &cfg, throttle(0, 0, s).signal())
		learnSignal(&st, &cfg, throttle(1030*ms, 1015*ms, s).signal()) // a sign
		assert.Equal(t, []time.Duration{2130 * ms}, spends(&st, &cfg, 2030*ms))
		d := learnSignal(&st, &cfg, throttle(2040*ms, 2030*ms, s).signal())
		require.Equal(t, "storm", d.Why)
		assert.Equal(t, []time.Duration{2130 * ms, 2130 * ms}, spends(&st, &cfg, 2130*ms, 2140*ms))
	})
	t.Run("none sent before the hold was decided", func(t *testing.T) {
		// (Within half a unit of the hold's end, where a fleet's probe may
		// be sent as an instance measures it.)
		cfg := settings(100)
		var st control.State
		d := learnSignal(&st, &cfg, throttle(0, 0, 3*ms).signal())
		require.Equal(t, at(3*ms), d.Hold)
		d = learnSignal(&st, &cfg, throttle(10*ms, -1*ms, s).signal()) // sent before the first throttle was read
		assert.Equal(t, at(10*ms+s), d.Hold, "a hold: about the quota")
		assert.Empty(t, d.Why, "and the same episode: not a storm")
	})
	t.Run("none after a hold with counts", func(t *testing.T) {
		cfg := settings(100)
		var st control.State
		d := learnSignal(&st, &cfg, withQuota(throttle(0, 0, s), 0, s).signal())
		require.False(t, d.Hold.IsZero())
		hold := st.Hold.Sub(ctlEpoch)
		assert.Equal(t, []time.Duration{hold, hold}, spends(&st, &cfg, hold, hold+10*ms))
	})
	t.Run("one probe at a low floor", func(t *testing.T) {
		cfg := settings(5) // floor 0.5/s: a unit is 2s, longer than a quarter of the hold
		var st control.State
		learnSignal(&st, &cfg, throttle(0, 0, s).signal())
		assert.Equal(t, []time.Duration{s, s}, spends(&st, &cfg, s, 1300*ms))
		// The rate is 3.5/s: a request sent a unit after the first is no
		// probe, the first is.
		d := learnSignal(&st, &cfg, throttle(1400*ms, 1300*ms, s).signal())
		assert.Equal(t, "throttled", d.Why)
		var st2 control.State
		learnSignal(&st2, &cfg, throttle(0, 0, s).signal())
		spends(&st2, &cfg, s)
		d = learnSignal(&st2, &cfg, throttle(1100*ms, s, s).signal())
		assert.Equal(t, "storm", d.Why)
	})
}

// TestControllerTriesBackARateAccepted: a throttle without counts after a
// second of acceptances at the rate says the limit fell; two holds after
// the last hold's end the key tries that rate again (aimBack). Refused,
// the try lowers nothing below the climb and the next waits twice as long,
// until the wait would be over maxPlateau; accepted for a second, the rate
// stays, and a throttle after that is a decrease from it. A throttle at a
// rate never accepted for a second, or at a rate hardly above the climb's
// aim, sets no try.
func TestControllerTriesBackARateAccepted(t *testing.T) {
	const ms, s = time.Millisecond, time.Second
	at := func(d time.Duration) time.Time { return ctlEpoch.Add(d) }
	accepted := func(st *control.State, cfg *control.Config, from, to time.Duration, r float64) {
		for d := from; d < to; d += time.Duration(float64(s) / r) {
			learnSignal(st, cfg, ok(d+2*ms, d).signal())
		}
	}
	t.Run("a limit that fell", func(t *testing.T) {
		cfg := control.DefaultConfig(100)
		st := new(control.State)
		accepted(st, &cfg, 0, 1200*ms, 100)
		learnSignal(st, &cfg, throttle(1202*ms, 1200*ms, s).signal())
		require.InDelta(t, 70, st.Rate(&cfg, at(1203*ms)), 0.5, "the first throttle: by beta")
		require.Equal(t, 100.0, st.Good, "the rate accepted for a second")
		// Early in the climb back: by beta twice.
		learnSignal(st, &cfg, throttle(2502*ms, 2500*ms, s).signal())
		low := st.Rate(&cfg, at(2503*ms))
		require.InDelta(t, 37.0, low, 0.5, "beta twice of the climb at 75.5/s")
		require.Equal(t, at(3502*ms+2*s), st.Back, "two holds after the last hold's end")
		assert.Less(t, st.Rate(&cfg, st.Back.Add(-ms)), 50.0, "the climb, before")
		assert.InDelta(t, 95, st.Rate(&cfg, st.Back), 0.01, "from then on, a twentieth under the rate accepted before")
		assert.InDelta(t, 100, st.Rate(&cfg, st.Back.Add(2*s)), 0.5, "climbing back to it")

		// Each try refused waits twice as long as the last, and lowers
		// nothing below the climb; the throttles to requests sent before
		// the refusal lower nothing either.
		next := st.Back
		for i, wait := range []time.Duration{4 * s, 8 * s} {
			now := next.Sub(ctlEpoch) + 12*ms
			d := learnSignal(st, &cfg, throttle(now, now-2*ms, s).signal())
			require.False(t, d.Hold.IsZero(), "try %d: the throttle holds the key", i)
			assert.Equal(t, "throttled", d.Why, "try %d", i)
			assert.InDelta(t, 95, d.Old.PerSecond(), 0.5, "try %d", i)
			assert.Less(t, d.New.PerSecond(), 70.0, "try %d: back to the climb", i)
			assert.Greater(t, d.New.PerSecond(), low-1, "try %d: not below it", i)
			require.Equal(t, at(now+s).Add(wait), st.Back, "try %d: twice as long", i)
			learnSignal(st, &cfg, throttle(now+5*ms, now-ms, s).signal())
			require.Equal(t, at(now+s).Add(wait), st.Back, "try %d: a throttle to a request sent before moves nothing", i)
			next = st.Back
		}
	})
	t.Run("a limit that did not move", func(t *testing.T) {
		// The provider refuses whatever goes over 44/s: the climb's own
		// throttles, and every try. Five tries, each wait twice the last
		// at least (a throttle of the climb counts the next from its
		// hold), then none.
		cfg := control.DefaultConfig(100)
		st := new(control.State)
		accepted(st, &cfg, 0, 1200*ms, 100)
		learnSignal(st, &cfg, throttle(1202*ms, 1200*ms, s).signal())
		var tries []time.Duration
		for d := 1210 * ms; d < 300*s; d += 10 * ms {
			if now := at(d); !st.Hold.After(now) && st.Rate(&cfg, now) > 44 {
				if learnSignal(st, &cfg, throttle(d+2*ms, d, s).signal()).Old.PerSecond() >= 90 {
					tries = append(tries, d)
				}
			}
		}
		require.Len(t, tries, 5, "tries at %v", tries)
		for i := 1; i < len(tries); i++ {
			assert.GreaterOrEqual(t, tries[i]-tries[i-1], s+time.Duration(control.BackHolds<<i)*s, "try %d", i)
		}
		assert.Zero(t, st.Good)
	})
	t.Run("the try accepted", func(t *testing.T) {
		cfg := control.DefaultConfig(100)
		st := new(control.State)
		accepted(st, &cfg, 0, 1200*ms, 100)
		learnSignal(st, &cfg, throttle(1202*ms, 1200*ms, s).signal())
		learnSignal(st, &cfg, throttle(2502*ms, 2500*ms, s).signal())
		back := st.Back.Sub(ctlEpoch)
		accepted(st, &cfg, back, back+1500*ms, 100)
		assert.InDelta(t, 100, st.Rate(&cfg, at(back+1500*ms)), 0.5, "the rate stays")
		d := learnSignal(st, &cfg, throttle(back+1502*ms, back+1500*ms, s).signal())
		assert.InDelta(t, 70, d.New.PerSecond(), 0.5, "a throttle a second into the try: a decrease from it")
		assert.Equal(t, 100.0, st.Good)
		assert.Equal(t, at(back+1502*ms+s+2*s), st.Back, "tried again, two holds after")
	})
	t.Run("a rate never accepted for a second", func(t *testing.T) {
		cfg := control.DefaultConfig(100)
		st := new(control.State)
		accepted(st, &cfg, 0, 100*ms, 100)
		learnSignal(st, &cfg, throttle(102*ms, 100*ms, s).signal())
		assert.Zero(t, st.Good)
		assert.Less(t, st.Rate(&cfg, at(10*s)), 100.0, "no try")
	})
	t.Run("a limit found again", func(t *testing.T) {
		// At a limit that did not move: accepted at 50/s for a second, the
		// climb refused at 55/s aims just under it. Nothing to try.
		cfg := control.DefaultConfig(100)
		st := new(control.State)
		st.Wmax, st.W0, st.Climb = 50, 50, ctlEpoch
		accepted(st, &cfg, 0, 1200*ms, 50)
		learnSignal(st, &cfg, throttle(1202*ms, 1200*ms, s).signal())
		require.InDelta(t, 50.0, st.Good, 0.5)
		require.False(t, st.TriesBack(at(10*s)), "the rate accepted is within backOver of the aim")
		assert.Less(t, st.Rate(&cfg, st.Back), st.Good)
	})
}

// TestResponseReadsTheSignal: the controller's Scope and Shape take the
// values of the root's Scope and ResetKind, and a Quota it reads carries
// every field of the root's that it names, as the root's holds it.
func TestResponseReadsTheSignal(t *testing.T) {
	assert.Equal(t,
		[]control.Scope{control.ScopeUnknown, control.ScopeQuota, control.ScopeOther, control.ScopeBilling},
		[]control.Scope{control.Scope(ScopeUnknown), control.Scope(ScopeQuota), control.Scope(ScopeOther), control.Scope(ScopeBilling)})
	assert.Equal(t,
		[]control.Shape{control.ShapeUnknown, control.ShapeWindow, control.ShapeBucket},
		[]control.Shape{control.Shape(ResetKindUnknown), control.Shape(ResetKindWindow), control.Shape(ResetKindBucket)})

	q := Quota{Dimension: Requests, Limit: 10, HasLimit: true, Remaining: 3, HasRemaining: true,
		Reset: 2 * time.Second, HasReset: true, Window: 5 * time.Second, HasWindow: true, Kind: ResetKindBucket}
	got, want := reflect.ValueOf(q.control()), reflect.ValueOf(q)
	for i := range got.NumField() {
		name := got.Type().Field(i).Name
		f := want.FieldByName(name)
		require.True(t, f.IsValid(), "control.Quota.%s is a field of Quota", name)
		require.False(t, got.Field(i).IsZero(), "control.Quota.%s is copied (the test sets every field)", name)
		assert.EqualValues(t, f.Interface(), got.Field(i).Interface(), "control.Quota.%s", name)
	}
	s := Signal{Now: ctlEpoch, SentAt: ctlEpoch.Add(-time.Second), Status: 429, InFlight: 2,
		RetryAfter: time.Second, HasRetryAfter: true, Scope: ScopeQuota, Quotas: []Quota{q}}
	r := s.response()
	assert.Equal(t, control.Response{Now: s.Now, SentAt: s.SentAt, Status: 429, InFlight: 2,
		RetryAfter: time.Second, HasRetryAfter: true, Scope: control.ScopeQuota, Throttled: true,
		Counts: true, Advertised: 2, Quota: q.control(), HasQuota: true}, r)
}
