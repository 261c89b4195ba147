package fakeapi

import (
	"math"
	"time"
)

// bucket is a TokenBucket limit (and the API's only limit when
// Config.Limits is empty): a token bucket of capacity burst, refilled at
// rate tokens per second. Its methods take the time as an
// argument, so the tests need no clock; a time before the last one seen
// refills nothing. It is not safe for concurrent use: the API guards it.
type bucket struct {
	rate   float64 // tokens per second, > 0
	burst  int     // capacity, >= 1
	tokens float64 // in [0, burst]
	last   time.Time
}

// newBucket returns a full bucket.
func newBucket(rate float64, burst int, now time.Time) bucket {
	return bucket{rate: rate, burst: burst, tokens: float64(burst), last: now}
}

// refill adds the tokens earned since the last call.
func (b *bucket) refill(now time.Time) {
	if !now.After(b.last) {
		return
	}
	b.tokens = math.Min(float64(b.burst), b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
}

// take spends one token at now and reports whether there was one.
func (b *bucket) take(now time.Time) bool {
	b.refill(now)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// setRate changes the refill rate from now on; the tokens earned until now
// are earned at the old rate.
func (b *bucket) setRate(rate float64, now time.Time) {
	b.refill(now)
	b.rate = rate
}

// remaining is the number of whole tokens left: the requests that would be
// accepted if they all arrived now.
func (b *bucket) remaining() int { return int(b.tokens) }

// untilNext is how long until the bucket holds one whole token again; 0
// when it holds one now.
func (b *bucket) untilNext() time.Duration { return b.until(1) }

// untilFull is how long until the bucket is full again: the reset of the
// quota. 0 when it is full.
func (b *bucket) untilFull() time.Duration { return b.until(float64(b.burst)) }

func (b *bucket) until(level float64) time.Duration {
	if b.tokens >= level {
		return 0
	}
	return time.Duration((level - b.tokens) / b.rate * float64(time.Second))
}

// ceilSeconds is d in whole seconds, rounded up: how a header says "not
// before".
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}
