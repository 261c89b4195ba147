package egress

import (
	"math"
	"math/bits"
	"math/rand/v2"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// FullJitter is full-jitter exponential backoff (the AWS Architecture Blog's
// "Full Jitter"): the n-th call of NextBackOff (n from 0) returns a uniformly
// random duration in [0, min(Max, Base·2^n)).
//
// It implements backoff.BackOff from github.com/cenkalti/backoff/v4 and never
// returns backoff.Stop: attempt and elapsed-time limits belong to the retry
// policy. Base must be > 0 and Max >= Base; with Base <= 0 or Max <= 0 (as in
// the zero value) every wait is 0, and a Max below Base caps every wait at Max.
//
// Not safe for concurrent use: use one per request.
type FullJitter struct {
	// Base is the first ceiling, the bound of the wait before the first retry.
	// It must be > 0.
	Base time.Duration
	// Max caps the ceiling however many attempts have passed. It must be >= Base.
	Max time.Duration
	// Rand returns a number uniform in [0,1); nil means math/rand/v2's Float64.
	// Numbers outside [0,1) are clamped into it. Tests inject a fixed source.
	Rand func() float64

	attempt int // calls of NextBackOff since the last Reset, saturating
}

var _ backoff.BackOff = (*FullJitter)(nil)

// maxJitterAttempt bounds FullJitter's attempt counter: from 63 doublings on,
// every ceiling is Max anyway, so counting further only risks overflow.
const maxJitterAttempt = 64

// NextBackOff returns the wait before the next retry: a uniformly random
// duration in [0, min(Max, Base·2^n)), where n is the number of earlier calls
// since the last Reset. It is never negative and never backoff.Stop.
func (j *FullJitter) NextBackOff() time.Duration {
	u := rand.Float64
	if j.Rand != nil {
		u = j.Rand
	}
	d := fullJitter(j.Base, j.Max, j.attempt, u())
	if j.attempt < maxJitterAttempt {
		j.attempt++
	}
	return d
}

// Reset starts the sequence again: the next NextBackOff draws below Base.
func (j *FullJitter) Reset() { j.attempt = 0 }

// fullJitter is the pure function: a random duration in
// [0, min(max, base·2^attempt)) chosen by u in [0,1).
//
// It is total: a negative attempt counts as 0; any attempt, however large,
// gives a ceiling of at most max without overflowing; u outside [0,1) (or NaN)
// is clamped into it; a ceiling <= 0 (base or max <= 0) gives 0.
func fullJitter(base, max time.Duration, attempt int, u float64) time.Duration {
	ceiling := jitterCeiling(base, max, attempt)
	if ceiling <= 0 {
		return 0
	}
	switch {
	case !(u >= 0): // negative or NaN
		u = 0
	case u >= 1:
		u = math.Nextafter(1, 0)
	}
	// r is u as a 53-bit fixed-point fraction (exact: u < 1 has 53 bits of
	// mantissa), and the wait is floor(r·ceiling / 2^53) in 128-bit integer
	// arithmetic, which is < ceiling and free of float rounding.
	r := uint64(u * (1 << 53))
	hi, lo := bits.Mul64(r, uint64(ceiling))
	return time.Duration(hi<<11 | lo>>53)
}

// jitterCeiling is min(max, base·2^attempt), computed without overflow.
func jitterCeiling(base, max time.Duration, attempt int) time.Duration {
	if base <= 0 || max <= 0 {
		return 0
	}
	if attempt < 0 {
		attempt = 0
	}
	if attempt >= 63 || base > max>>uint(attempt) {
		return max
	}
	return min(base<<uint(attempt), max)
}
