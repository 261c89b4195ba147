package egress

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/egress-go/egress/internal/control"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// simBucket is a provider's bucket: capacity units, refilled at rate per
// second; it reports what OpenAI and Anthropic report.
type simBucket struct {
	capacity, rate, level float64
	at                    time.Duration
}

// take answers a request at t: whether it was admitted, and the quota the
// response reports (remaining in whole units, the time until full rounded
// up to res).
func (b *simBucket) take(t time.Duration, res time.Duration) (bool, Quota) {
	b.level = min(b.capacity, b.level+(t-b.at).Seconds()*b.rate)
	b.at = t
	ok := b.level >= 1
	if ok {
		b.level--
	}
	full := time.Duration((b.capacity - b.level) / b.rate * float64(time.Second))
	full = (full + res - 1) / res * res
	return ok, Quota{Dimension: Requests, Limit: b.capacity, HasLimit: true, Remaining: math.Floor(b.level), HasRemaining: true,
		Reset: full, HasReset: full > 0, Kind: ResetKindBucket}
}

func TestRefillSteps(t *testing.T) {
	q := func(limit, remaining float64, reset time.Duration) Quota {
		return Quota{Limit: limit, HasLimit: true, Remaining: remaining, HasRemaining: true, Reset: reset, HasReset: true, Kind: ResetKindBucket}
	}
	type step struct {
		q      Quota
		bucket bool
		want   float64 // the limit after the step, within 0.1%
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{{
		// A 5-unit bucket at 20/s: one unit used (50 ms to full: the rate
		// is at most 20.4), then empty (250 ms: 15.9 to 20.1, within 30%),
		// then 0.9 refilled (205 ms: 19.4 to 24.5): the limit is 20.1.
		name: "milliseconds",
		steps: []step{
			{q(5, 4, 50*time.Millisecond), true, 0},
			{q(5, 0, 250*time.Millisecond), true, 5 / 0.249},
			{q(5, 0, 205*time.Millisecond), true, 5 / 0.249},
		},
	}, {
		// Not a bucket (yet), a window stated, a full bucket, no reset, a
		// reset under 20 times its resolution: nothing measured.
		name: "nothing to measure",
		steps: []step{
			{q(5, 0, 250*time.Millisecond), false, 0},
			{Quota{Limit: 5, HasLimit: true, Remaining: 0, HasRemaining: true, Reset: time.Second, HasReset: true, Window: time.Second, HasWindow: true}, true, 0},
			{q(5, 5, 0), true, 0},
			{Quota{Limit: 5, HasLimit: true, Remaining: 0, HasRemaining: true}, true, 0},
			{q(5, 0, 19*time.Millisecond), true, 0},
			{q(5, 0, time.Second), true, 0},
			{q(60, 0, 19*time.Second), true, 0},
			{q(math.MaxFloat64, 0, 20*time.Millisecond), true, 0},
		},
	}, {
		// Anthropic's per-minute bucket, 50 requests a minute (0.833/s),
		// its reset a date (1 s): a reset of 1.2 s is passed over; after a
		// draining burst the bounds are 0.796 to 0.851.
		name: "per minute, dates",
		steps: []step{
			{q(50, 49, 1200*time.Millisecond+7), true, 0},
			{q(50, 10, 48*time.Second+7), true, 40 / 47.0},
			{q(50, 0, 59*time.Second+7), true, 40 / 47.0},
		},
	}, {
		// The provider halves its rate, then raises it to 40/s: a report
		// outside the bounds starts them again, and the limit follows.
		name: "rate halved, then raised",
		steps: []step{
			{q(5, 0, 250*time.Millisecond), true, 5 / 0.249},
			{q(5, 0, 205*time.Millisecond), true, 5 / 0.249},
			{q(5, 0, 500*time.Millisecond), true, 5 / 0.499},
			{q(5, 0, 410*time.Millisecond), true, 5 / 0.499},
			{q(5, 0, 125*time.Millisecond), true, 5 / 0.124},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var f control.Refill
			for i, s := range tc.steps {
				got := f.Observe(s.q.control(), s.bucket)
				assert.InDelta(t, s.want, got, s.want/1000+1e-9, "step %d: %+v", i, s.q)
			}
		})
	}
}

// TestRefillConverges: a client that sends at the measured limit (at the
// configured rate, ten times the bucket's, until there is one) is never
// given a limit more than 30% above the bucket's rate, and within 5% of it
// once the bucket had time to drain, for buckets of several sizes and
// reset resolutions.
func TestRefillConverges(t *testing.T) {
	for _, tc := range []struct {
		capacity, rate float64
		res            time.Duration
	}{
		{5, 20, time.Millisecond},
		{40, 20, time.Millisecond},
		{60, 1, time.Second},     // 60 a minute, whole seconds
		{500, 8.33, time.Second}, // 500 a minute
	} {
		t.Run(fmt.Sprintf("%vper%v_rate%v_res%v", tc.capacity, tc.capacity/tc.rate, tc.rate, tc.res), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(tc.capacity)))
			b := &simBucket{capacity: tc.capacity, rate: tc.rate, level: tc.capacity}
			var f control.Refill
			limit, at := 0.0, time.Duration(0)
			reached := time.Duration(-1)
			horizon := time.Duration(tc.capacity/tc.rate*float64(time.Second)) + 2*time.Second
			for at < 3*horizon {
				send := 10 * tc.rate
				if limit > 0 {
					send = limit
				}
				gap := time.Duration(float64(time.Second) / send * (0.9 + 0.2*rng.Float64()))
				at += gap
				_, q := b.take(at, tc.res)
				limit = f.Observe(q.control(), true)
				if limit > 0 {
					assert.LessOrEqual(t, limit, tc.rate*control.RefillSlack, "at %v", at)
				}
				if reached < 0 && limit >= 0.95*tc.rate && limit <= tc.rate*1.05 {
					reached = at
				}
			}
			t.Logf("limit %.3f of %.3f; within 5%% from %v", limit, tc.rate, reached)
			assert.True(t, reached >= 0 && reached <= horizon, "within 5%% of the rate by %v: from %v", horizon, reached)
			assert.InDelta(t, tc.rate, limit, tc.rate*0.05, "at the end")
		})
	}
}

// TestRefillHostile: any counts a reader lets through (finite, >= 0) give a
// finite limit >= 0, whatever their order.
func TestRefillHostile(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	values := []float64{0, 1, 2, 5, 1e9, 1e300, math.MaxFloat64, 0.5}
	var f control.Refill
	for range 10000 {
		q := Quota{Limit: values[rng.IntN(len(values))], HasLimit: true, Remaining: values[rng.IntN(len(values))], HasRemaining: true,
			Reset: time.Duration(rng.Int64N(int64(time.Minute))), HasReset: true, Kind: ResetKindBucket}
		r := f.Observe(q.control(), true)
		if math.IsInf(r, 0) || math.IsNaN(r) || r < 0 {
			t.Fatalf("limit %v after %+v", r, q)
		}
	}
}

// TestBucketBounds: one report's bounds on a bucket's refill, as refill
// and the controller read them; the same as the script's (boundsOf in
// control.lua), which TestSharedControllerSteps compares.
func TestBucketBounds(t *testing.T) {
	q := func(limit, remaining float64, reset time.Duration) Quota {
		return Quota{Limit: limit, HasLimit: true, Remaining: remaining, HasRemaining: true, Reset: reset, HasReset: true, Kind: ResetKindBucket}
	}
	const date = 7 * time.Microsecond // a reset read from a date: to the second
	windowed := q(40, 0, 2*time.Second+date)
	windowed.Window, windowed.HasWindow = 20*time.Second, true
	for _, tc := range []struct {
		name   string
		q      Quota
		lo, hi float64
		ok     bool
	}{
		{"milliseconds", q(5, 0, 250*time.Millisecond), 4 / 0.251, 5 / 0.249, true},
		{"a date: a second either way", q(50, 0, 2490*time.Millisecond+date), 49 / 3.490007, 50 / 1.490007, true},
		{"a unit left", q(5, 1, 2*time.Second+date), 3 / 3.000007, 4 / 1.000007, true},
		{"full again within the resolution: no upper bound", q(5, 0, 600*time.Millisecond+date), 4 / 1.600007, math.Inf(1), true},
		{"a window stated bounds a bucket all the same", windowed, 39 / 3.000007, 40 / 1.000007, true},
		{"full", q(5, 5, 0), 0, 0, false},
		{"no reset", Quota{Limit: 5, HasLimit: true, Remaining: 0, HasRemaining: true}, 0, 0, false},
		{"no limit", Quota{Remaining: 0, HasRemaining: true, Reset: time.Second, HasReset: true}, 0, 0, false},
		{"a count too large", q(math.MaxFloat64, 0, 20*time.Millisecond), 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lo, hi, ok := control.BucketBounds(tc.q.control())
			require.Equal(t, tc.ok, ok)
			assert.InDelta(t, tc.lo, lo, tc.lo*1e-6)
			if math.IsInf(tc.hi, 1) {
				assert.True(t, math.IsInf(hi, 1), "hi %v", hi)
			} else {
				assert.InDelta(t, tc.hi, hi, tc.hi*1e-6)
			}
		})
	}
}
