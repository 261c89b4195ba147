package control

import (
	"math"
	"time"
)

// Refill measures how fast a provider's bucket refills, for the dialects
// that state a bucket's capacity and the time until it is full again but
// no rate: OpenAI, Azure OpenAI and Groq (x-ratelimit-*-requests), and
// Anthropic (anthropic-ratelimit-requests-*). OpenAI documents the reset as
// "the time until the rate limit resets to its initial state", Anthropic as
// "the time when the rate limit will be fully replenished". A bucket of
// capacity L that holds r whole units (the requests it would admit now:
// the bucket holds r to r+1) and is full again in t refills at
//
//	(L−r−1)/t < rate ≤ (L−r)/t
//
// and t is known to its resolution e: 1 ms when it was read in
// milliseconds, 1 s when in seconds or as a date. A report whose t is less
// than 20 e bounds nothing closely and is passed over. The others bound the
// rate so, and their bounds are intersected: the lower bound only rises,
// the upper only falls. Once they are within 30% of each other the upper
// bound is the key's limit, as if the provider had advertised it. The
// upper bound, not the lower: a bucket used below its rate stays full, and
// a full bucket that gives one unit reports L−1 units and 1/rate to full,
// which bounds the rate closely from above and not at all from below; a
// limit at the lower bound would stay there. The limit is above the rate by
// at most the error of the report that bounds it best: e/t, plus up to a
// unit's refill while the reports have all been of a bucket part way
// through refilling a unit. It rises by 2% or more and falls by 0.5% or
// more (a limit that moved with every response would be a new rate every
// time). A report outside the bounds (the provider changed its rate, or
// counts otherwise) starts them again from that report; the limit moves
// once they are within 30% again, or at once to a lower upper bound.
//
// A bucket that refills in less than 20 times its reset's resolution
// (Azure's or Anthropic's whole seconds on a bucket full again within a
// second or a few) is passed over: its rate is left to discovery. Its
// refusals' reports still bound it, loosely (Anthropic's bucket of 50 full
// again in 2.5 s, its reset a date: 14 to 34 a second, for 20), and that is
// enough for a key sent ten times too fast: the decrease starts again from
// the lower bound, and a key sent above the upper one is held until the
// Retry-After (see BucketBounds, decrease and bucketHold).
type Refill struct {
	lo, hi float64 // bounds on the rate, units per second; hi 0: none yet
	rate   float64 // the rate last given as the key's limit; 0: none
}

// refillFine is how many times its resolution a reset must be to bound the
// rate; RefillSlack is how far apart the bounds may be for the upper one to
// be the limit; refillStep and refillFall are how much the limit must rise
// or fall to be changed (the upper bound falls in ever smaller steps).
const (
	refillFine  = 20
	RefillSlack = 1.30
	refillStep  = 0.02
	refillFall  = 0.005
)

// Observe takes the key's requests quota q of a response (bucket: its reset
// is known to be a bucket's, by its dialect or as learnt) and returns the
// measured limit in units per second, 0 when there is none.
func (f *Refill) Observe(q Quota, bucket bool) float64 {
	if !bucket {
		return f.rate
	}
	lo, hi, ok := BucketBounds(q)
	if !ok || q.HasWindow || q.Reset < refillFine*ResetResolution(q.Reset) || math.IsInf(hi, 0) {
		// Nothing to bound (or a window stated, which states the rate), or
		// a resolution too coarse for this reset to bound the rate closely,
		// or a hostile count (a limit too large to bound anything).
		return f.rate
	}
	if f.hi == 0 || lo > f.hi || hi < f.lo {
		f.lo, f.hi = lo, hi
	} else {
		f.lo, f.hi = max(f.lo, lo), min(f.hi, hi)
	}
	switch {
	case f.hi <= f.lo*RefillSlack:
		if f.rate == 0 || f.hi < f.rate*(1-refillFall) || f.hi > f.rate*(1+refillStep) {
			f.rate = f.hi
		}
	case f.hi < f.rate:
		f.rate = f.hi // started again, lower: at most the new upper bound
	}
	return f.rate
}

// BucketBounds returns the bounds one report of a bucket (quota q: its
// capacity, the whole units it holds, the time until it is full again)
// puts on its refill rate, in units per second, as refill's comment says:
// (L−r−1)/(t+e) and (L−r)/(t−e), hi +Inf when t is not above e; ok false
// when q is not such a report (no limit, no remaining, no reset, a bucket
// full, a count too large to bound anything). A bucket that refills in
// steps of up to e, rather than continuously, stays within them too: its
// time to full is off a continuous bucket's by a step at most. (boundsOf in
// control.lua is the same.)
func BucketBounds(q Quota) (lo, hi float64, ok bool) {
	if !q.HasLimit || !q.HasRemaining || !q.HasReset || q.Limit < 1 || q.Remaining >= q.Limit || q.Reset <= 0 {
		return 0, 0, false
	}
	t, e := q.Reset.Seconds(), ResetResolution(q.Reset).Seconds()
	lo = max(q.Limit-q.Remaining-1, 0) / (t + e)
	hi = math.Inf(1)
	if t > e {
		hi = (q.Limit - q.Remaining) / (t - e)
	}
	if math.IsInf(lo, 0) || math.IsNaN(lo) || math.IsNaN(hi) {
		return 0, 0, false
	}
	return lo, hi, true
}

// ResetResolution is the resolution a reset was read to: 1 ms for a
// reset in milliseconds (OpenAI's "12ms", "1.5s"), 1 s for whole seconds
// and for a date (the skew between the provider's clock and ours is not
// known better).
func ResetResolution(d time.Duration) time.Duration {
	if d%time.Millisecond == 0 && d%time.Second != 0 {
		return time.Millisecond
	}
	return time.Second
}
