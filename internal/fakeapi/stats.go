package fakeapi

import (
	"net/http"
	"slices"
	"sync"
	"time"
)

// Counter counts outcomes by status and keeps the time of each accepted
// one (200 OK). The API counts what it answered with one; a client can
// count what it got back with another. The zero Counter is ready to use. It
// is safe for concurrent use.
type Counter struct {
	mu       sync.Mutex
	counts   Stats       // guarded by mu; only the counts are kept up to date
	arrivals []time.Time // guarded by mu; of each accepted request
}

// Add records one request answered with status at the time at; a status of
// 0 stands for a request that got no response.
func (c *Counter) Add(at time.Time, status int) { c.add(at, status, causeNone) }

// add records one request answered with status for the reason why.
func (c *Counter) add(at time.Time, status int, why cause) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts.Requests++
	switch status {
	case http.StatusOK:
		c.counts.Accepted++
		c.arrivals = append(c.arrivals, at)
	case http.StatusTooManyRequests:
		c.counts.Limited++
	case http.StatusForbidden:
		c.counts.Forbidden++
	case http.StatusServiceUnavailable:
		c.counts.Unavailable++
	default:
		c.counts.Other++
	}
	switch why {
	case causeRefused:
		c.counts.Refused++
	case causeStorm:
		c.counts.Storms++
	case causeBilling:
		c.counts.Billing++
	}
}

// Stats is a summary of a Counter.
type Stats struct {
	Requests    int // every request
	Accepted    int // answered 200
	Limited     int // answered 429 Too Many Requests
	Unavailable int // answered 503 Service Unavailable
	Forbidden   int // answered 403 Forbidden
	Other       int // any other status, or no response

	// Why the API refused, counted by the API only (a Counter fed by Add
	// cannot tell, and leaves them 0). Each request is in at most one.
	Refused int // over a limit: 429, or 403 in the GitHub and Salesforce dialects
	Storms  int // throttled by Config.Storm while within the limits: 429 or 503
	Billing int // answered 429 insufficient_quota (Config.InsufficientQuota)

	// Arrivals is the time of each accepted request, in order.
	Arrivals []time.Time
	// MaxPerSecond is the most requests accepted in any one-second window
	// [t, t+1s): what to compare with the provider's rate + burst.
	MaxPerSecond int
	// PerSecond[i] is the number accepted in the i-th whole second after the
	// start given to Stats (or after the first arrival, for a zero start);
	// arrivals before the start are left out.
	PerSecond []int
}

// Stats returns the counts so far, with PerSecond measured from start.
func (c *Counter) Stats(start time.Time) Stats {
	c.mu.Lock()
	s := c.counts
	s.Arrivals = slices.Clone(c.arrivals)
	c.mu.Unlock()
	slices.SortFunc(s.Arrivals, time.Time.Compare)
	s.MaxPerSecond = MaxInWindow(s.Arrivals, time.Second)
	s.PerSecond = PerWindow(s.Arrivals, start, time.Second)
	return s
}

// MaxInWindow returns the most times that fall in any window [t, t+w). It
// does not modify times, which need not be sorted.
func MaxInWindow(times []time.Time, w time.Duration) int {
	if !slices.IsSortedFunc(times, time.Time.Compare) {
		times = slices.Clone(times)
		slices.SortFunc(times, time.Time.Compare)
	}
	best, lo := 0, 0
	for hi := range times {
		for times[hi].Sub(times[lo]) >= w {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

// PerWindow counts times in consecutive windows of length w from start:
// the i-th count is of [start+i·w, start+(i+1)·w). A zero start means the
// earliest of times. Times before start are left out; the slice ends with
// the last non-empty window.
func PerWindow(times []time.Time, start time.Time, w time.Duration) []int {
	if start.IsZero() && len(times) > 0 {
		start = slices.MinFunc(times, time.Time.Compare)
	}
	var counts []int
	for _, t := range times {
		if t.Before(start) {
			continue
		}
		i := int(t.Sub(start) / w)
		for len(counts) <= i {
			counts = append(counts, 0)
		}
		counts[i]++
	}
	return counts
}
