package fakellm

import (
	"math"
	"slices"
	"time"
)

// Stats is what the provider answered and charged so far.
type Stats struct {
	// Requests is every request to the two endpoints.
	Requests int
	// Accepted is the requests admitted by the limits (answered 200, or
	// cut short by the caller leaving).
	Accepted int
	// Refused is the requests answered 429 by a limit, TooLarge included.
	Refused int
	// TooLarge is the refused requests whose up-front charge exceeds a
	// limit's whole quota: they would never fit.
	TooLarge int
	// Invalid is the requests answered 400, 405 or 413; they spend nothing.
	Invalid int
	// InFlight is the admitted requests not yet settled: their actual
	// tokens are not charged yet.
	InFlight int
	// InputTokens and OutputTokens are the actual tokens charged for the
	// settled requests.
	InputTokens, OutputTokens int

	// RPM, TPM, InputTPM and OutputTPM are the limits of the same names;
	// a limit not configured has Limit 0.
	RPM, TPM, InputTPM, OutputTPM LimitStats

	// Windows are the consecutive periods of one Config.Minute since the
	// provider was made, aligned as a FixedWindow's are; the last one is
	// the last in which a request arrived. Each counts the requests
	// decided in it and the actual tokens of those it admitted (charged
	// when they settle, but counted in the window of their admission).
	Windows []Window
}

// LimitStats is what one limit measured.
type LimitStats struct {
	// Limit is the quota per Minute; 0 when the limit is not configured.
	Limit int
	// Peak is the most of the quota ever in use at once, as the limit
	// itself measures it: the units spent in the current window
	// (FixedWindow), in the last Minute (SlidingWindow), or missing from
	// the bucket (TokenBucket). A limit was never exceeded when Peak <=
	// Limit, which ReserveInputAndMax guarantees.
	Peak int
	// Refused is the refusals that named this limit: the one with the
	// longest wait, or the one a too-large request exceeds.
	Refused int
}

// Window is what happened in one period [Start, Start+Minute).
type Window struct {
	Start    time.Time
	Accepted int
	Refused  int
	// InputTokens and OutputTokens are the actual tokens of the requests
	// admitted in the window and settled so far.
	InputTokens, OutputTokens int
}

// Tokens is the window's input + output tokens: what counts against TPM.
func (w Window) Tokens() int { return w.InputTokens + w.OutputTokens }

// recorder keeps the counts of Stats. It is not safe for concurrent use:
// the Server guards it.
type recorder struct {
	origin  time.Time // of the first window
	period  time.Duration
	counts  Stats // without the limits and the windows
	windows []Window
}

func newRecorder(now time.Time, period time.Duration) recorder {
	return recorder{origin: now.Truncate(period), period: period}
}

// window returns the window of at, adding the windows up to it.
func (r *recorder) window(at time.Time) *Window {
	i := max(0, int(at.Sub(r.origin)/r.period))
	for len(r.windows) <= i {
		r.windows = append(r.windows, Window{Start: r.origin.Add(time.Duration(len(r.windows)) * r.period)})
	}
	return &r.windows[i]
}

func (r *recorder) invalid() {
	r.counts.Requests++
	r.counts.Invalid++
}

func (r *recorder) decided(at time.Time, v verdict) {
	r.counts.Requests++
	w := r.window(at)
	switch {
	case v.ok:
		r.counts.Accepted++
		r.counts.InFlight++
		w.Accepted++
	default:
		r.counts.Refused++
		w.Refused++
		if v.tooLarge {
			r.counts.TooLarge++
		}
	}
}

// settled records the actual tokens of a request admitted at admitted.
func (r *recorder) settled(admitted time.Time, input, output int) {
	r.counts.InFlight--
	r.counts.InputTokens += input
	r.counts.OutputTokens += output
	w := r.window(admitted)
	w.InputTokens += input
	w.OutputTokens += output
}

// stats returns the counts with the limits' measures.
func (r *recorder) stats(ls *limitSet) Stats {
	s := r.counts
	s.Windows = slices.Clone(r.windows)
	for _, l := range ls.limits {
		ll := LimitStats{Limit: l.quota, Peak: int(math.Ceil(l.peak)), Refused: l.refused}
		switch l.dim {
		case dimRequests:
			s.RPM = ll
		case dimTokens:
			s.TPM = ll
		case dimInput:
			s.InputTPM = ll
		case dimOutput:
			s.OutputTPM = ll
		}
	}
	return s
}
