package egress

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// justUnderOne is the largest float64 below 1, the top of Rand's range.
const justUnderOne = 1 - 0x1p-53

func TestFullJitterSteps(t *testing.T) {
	const (
		base = 100 * time.Millisecond
		max  = 2 * time.Second
	)
	tests := []struct {
		name    string
		base    time.Duration
		max     time.Duration
		attempt int
		u       float64
		want    time.Duration
	}{
		{"u=0 gives 0", base, max, 0, 0, 0},
		{"u=0 gives 0 at any attempt", base, max, 7, 0, 0},
		{"half of the first ceiling", base, max, 0, 0.5, 50 * time.Millisecond},
		{"ceiling doubles: attempt 1", base, max, 1, 0.5, 100 * time.Millisecond},
		{"ceiling doubles: attempt 2", base, max, 2, 0.5, 200 * time.Millisecond},
		{"ceiling doubles: attempt 3", base, max, 3, 0.5, 400 * time.Millisecond},
		{"ceiling doubles: attempt 4", base, max, 4, 0.5, 800 * time.Millisecond},
		{"ceiling caps at max: attempt 5", base, max, 5, 0.5, time.Second},
		{"ceiling stays capped: attempt 6", base, max, 6, 0.5, time.Second},
		{"u just under 1: just under the ceiling", base, max, 0, justUnderOne, base - 1},
		{"u just under 1 when capped", base, max, 10, justUnderOne, max - 1},
		{"u = 1 is clamped below the ceiling", base, max, 0, 1, base - 1},
		{"u > 1 is clamped below the ceiling", base, max, 2, 7.5, 4*base - 1},
		{"u = +Inf is clamped", base, max, 0, math.Inf(1), base - 1},
		{"negative u is clamped to 0", base, max, 3, -0.5, 0},
		{"NaN u is clamped to 0", base, max, 3, math.NaN(), 0},
		{"huge attempt does not overflow", base, max, 1000, 0.5, time.Second},
		{"attempt 62 does not overflow", base, max, 62, 0.5, time.Second},
		{"attempt 63 does not overflow", base, max, 63, 0.5, time.Second},
		{"max int attempt", base, max, math.MaxInt, justUnderOne, max - 1},
		{"negative attempt counts as 0", base, max, -3, 0.5, 50 * time.Millisecond},
		{"max of MaxInt64, huge attempt", time.Second, math.MaxInt64, 1000, justUnderOne, math.MaxInt64 - 1024},
		{"zero base gives 0", 0, max, 3, 0.5, 0},
		{"negative base gives 0", -time.Second, max, 3, 0.5, 0},
		{"zero max gives 0", base, 0, 3, 0.5, 0},
		{"max below base caps at max", time.Second, 100 * time.Millisecond, 0, 0.5, 50 * time.Millisecond},
		{"1ns ceiling gives 0", time.Nanosecond, time.Nanosecond, 0, justUnderOne, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := fullJitter(tt.base, tt.max, tt.attempt, tt.u)
			if got != tt.want {
				t.Fatalf("fullJitter(%v, %v, %d, %v) = %v, want %v", tt.base, tt.max, tt.attempt, tt.u, got, tt.want)
			}
		})
	}
}

func TestFullJitterDistribution(t *testing.T) {
	const (
		base  = 10 * time.Millisecond
		max   = 3 * time.Second
		draws = 100_000
	)
	rng := rand.New(rand.NewPCG(1, 2))
	for attempt := 0; attempt <= 12; attempt++ {
		ceiling := jitterCeiling(base, max, attempt)
		t.Run(ceiling.String(), func(t *testing.T) {
			var sum float64
			for range draws {
				d := fullJitter(base, max, attempt, rng.Float64())
				if d < 0 || d >= ceiling {
					t.Fatalf("attempt %d: draw %v outside [0, %v)", attempt, d, ceiling)
				}
				sum += float64(d)
			}
			mean := sum / draws
			want := float64(ceiling) / 2
			if math.Abs(mean-want) > 0.02*want {
				t.Fatalf("attempt %d: mean %v, want within 2%% of %v", attempt, time.Duration(mean), time.Duration(want))
			}
		})
	}
}

func TestFullJitterNextBackOffAndReset(t *testing.T) {
	j := &FullJitter{
		Base: 100 * time.Millisecond,
		Max:  time.Second,
		Rand: func() float64 { return 0.5 },
	}
	want := []time.Duration{
		50 * time.Millisecond,  // ceiling 100ms
		100 * time.Millisecond, // 200ms
		200 * time.Millisecond, // 400ms
		400 * time.Millisecond, // 800ms
		500 * time.Millisecond, // capped at 1s
		500 * time.Millisecond,
	}
	for i, w := range want {
		if got := j.NextBackOff(); got != w {
			t.Fatalf("call %d: NextBackOff() = %v, want %v", i, got, w)
		}
	}
	j.Reset()
	if got := j.NextBackOff(); got != 50*time.Millisecond {
		t.Fatalf("after Reset: NextBackOff() = %v, want 50ms", got)
	}
}

func TestFullJitterNeverStops(t *testing.T) {
	tests := []struct {
		name string
		j    *FullJitter
	}{
		{"zero value", &FullJitter{}},
		{"default Rand", &FullJitter{Base: time.Millisecond, Max: time.Second}},
		{"hostile Rand", &FullJitter{Base: time.Millisecond, Max: time.Second, Rand: func() float64 { return -1 }}},
		{"Rand above 1", &FullJitter{Base: time.Millisecond, Max: time.Second, Rand: func() float64 { return 2 }}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b backoff.BackOff = tt.j
			for i := range 10_000 {
				d := b.NextBackOff()
				if d == backoff.Stop || d < 0 || (tt.j.Max > 0 && d >= tt.j.Max) {
					t.Fatalf("call %d: NextBackOff() = %v, want in [0, %v)", i, d, tt.j.Max)
				}
			}
			if tt.j.attempt != maxJitterAttempt {
				t.Fatalf("attempt counter = %d, want it to saturate at %d", tt.j.attempt, maxJitterAttempt)
			}
		})
	}
}
