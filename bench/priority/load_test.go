package priority

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/egress-go/egress/bench/internal/benchkit"
)

// stream is one kind of call a scenario makes: its class, how it arrives,
// how much of it, on which instances, and each call's deadline.
type stream struct {
	name     string
	class    class
	open     bool          // Poisson arrivals at rate, a goroutine a call; else paced workers in closed loop
	rate     float64       // offered, calls per second, over all its instances
	deadline time.Duration // each call's own
	// local and fleet are its workers on each instance (closed loop), or its
	// share of the arrivals (open), in the one-instance rows and in the fleet row.
	local, fleet []int
}

// seed is the base of every draw of a run: the same seed, the same
// schedule of arrivals and worker offsets.
const seed = 20240611

// callRec is one call's record, carried in its context to the probe.
type callRec struct {
	start  time.Time
	sentAt atomic.Int64 // ns from start to the first attempt's send; 0: not sent
}

type recKey struct{}

// probe is an instance's connection pool, seen from inside the limiter: it
// notes when each call's request leaves, and counts the 429s that come back.
type probe struct {
	base    http.RoundTripper
	limited *atomic.Int64
}

func (p probe) RoundTrip(req *http.Request) (*http.Response, error) {
	if rec, ok := req.Context().Value(recKey{}).(*callRec); ok {
		rec.sentAt.CompareAndSwap(0, max(1, int64(time.Since(rec.start))))
	}
	resp, err := p.base.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusTooManyRequests {
		p.limited.Add(1)
	}
	return resp, err
}

// tally is what the callers saw of one stream. Safe for concurrent use.
type tally struct {
	started atomic.Int64 // calls begun
	mu      sync.Mutex
	ended   int             // guarded by mu; calls returned, whatever their end
	ok      int             // guarded by mu; answered 200
	limited int             // guarded by mu; answered 429
	refused int             // guarded by mu; refused by the limiter (not sent)
	expired int             // guarded by mu; the call's deadline (or another error) ended it
	waits   []time.Duration // guarded by mu; of the calls answered 200: from the call's start to the send
}

func (t *tally) add(status int, err error, wait time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ended++
	switch {
	case err == nil && status == http.StatusOK:
		t.ok++
		t.waits = append(t.waits, wait)
	case err == nil && status == http.StatusTooManyRequests:
		t.limited++
	case refused(err):
		t.refused++
	default:
		t.expired++
	}
}

// failed is the calls that did not end in a 200.
func (t *tally) failed() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ended - t.ok
}

// quantiles returns the p50 and p99 of the waits of the calls answered 200.
func (t *tally) quantiles() (p50, p99 time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := slices.Clone(t.waits)
	slices.Sort(w)
	return benchkit.Quantile(w, 0.5), benchkit.Quantile(w, 0.99)
}

// drive runs every stream on the instances until end, and returns once the
// last call has returned, with a tally a stream.
func drive(ctx context.Context, url string, streams []stream, insts []instance, fleet bool, end time.Time) map[string]*tally {
	tallies := map[string]*tally{}
	var wg sync.WaitGroup
	for si, s := range streams {
		tl := &tally{}
		tallies[s.name] = tl
		layout := s.local
		if fleet {
			layout = s.fleet
		}
		total := 0
		for _, n := range layout {
			total += n
		}
		for i, n := range layout {
			if n == 0 || i >= len(insts) {
				continue
			}
			rng := rand.New(rand.NewPCG(seed, uint64(si*64+i)))
			if s.open {
				rate := s.rate * float64(n) / float64(total)
				wg.Add(1)
				go func() {
					defer wg.Done()
					arrivals(ctx, url, s, insts[i], rate, rng, end, tl)
				}()
				continue
			}
			interval := time.Duration(float64(total) / s.rate * float64(time.Second))
			for w := range n {
				offset := time.Duration(rng.Float64() * float64(interval))
				wg.Add(1)
				go func() {
					defer wg.Done()
					worker(ctx, url, s, insts[i], fmt.Sprintf("%s-i%d-w%d", s.name, i, w), interval, offset, end, tl)
				}()
			}
		}
	}
	wg.Wait()
	return tallies
}

// worker calls back to back, starting a call at most every interval (from
// offset after now), until end: a closed loop offered at 1/interval.
func worker(ctx context.Context, url string, s stream, inst instance, tag string, interval, offset time.Duration, end time.Time, tl *tally) {
	next := time.Now().Add(offset)
	limit := int(time.Until(end)/interval) + 2 // the loop is bounded in count as well as in time
	for i := 0; i < limit && ctx.Err() == nil; i++ {
		if now := time.Now(); next.After(now) {
			if !next.Before(end) || benchkit.Sleep(ctx, next.Sub(now)) != nil {
				return
			}
		} else if !now.Before(end) {
			return
		} else {
			next = now
		}
		next = next.Add(interval)
		call(ctx, url, s, inst, fmt.Sprintf("%s-%d", tag, i), tl)
	}
}

// arrivals starts calls at Poisson times of rate per second until end, each
// on its own goroutine, and returns once they have returned.
func arrivals(ctx context.Context, url string, s stream, inst instance, rate float64, rng *rand.Rand, end time.Time, tl *tally) {
	var wg sync.WaitGroup
	defer wg.Wait()
	limit := int(3*rate*time.Until(end).Seconds()) + 10
	at := time.Now()
	for i := 0; i < limit && ctx.Err() == nil; i++ {
		at = at.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		if !at.Before(end) || benchkit.Sleep(ctx, time.Until(at)) != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			call(ctx, url, s, inst, fmt.Sprintf("%s-%d", s.name, i), tl)
		}()
	}
}

// call makes one call of s with its own deadline and records its end.
func call(ctx context.Context, url string, s stream, inst instance, id string, tl *tally) {
	tl.started.Add(1)
	rec := &callRec{start: time.Now()}
	ctx, cancel := context.WithTimeout(context.WithValue(ctx, recKey{}, rec), s.deadline)
	defer cancel()
	status, err := send(ctx, url, s, inst, id)
	wait := time.Duration(rec.sentAt.Load())
	tl.add(status, err, wait)
}

func send(ctx context.Context, url string, s stream, inst instance, id string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/items/"+id, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set(streamHeader, s.name)
	if s.class.tokens > 0 {
		req.Header.Set(tokensHeader, strconv.Itoa(s.class.tokens))
	}
	resp, err := inst.do(req, s.class)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, err
	}
	return resp.StatusCode, nil
}

// maxMinFair returns the max-min fair shares of capacity among demands.
func maxMinFair(capacity float64, demands []float64) []float64 {
	out := make([]float64, len(demands))
	left := map[int]bool{}
	for i := range demands {
		left[i] = true
	}
	for len(left) > 0 && capacity > 1e-9 {
		share := capacity / float64(len(left))
		done := false
		for i := range left {
			if demands[i]-out[i] <= share {
				capacity -= demands[i] - out[i]
				out[i] = demands[i]
				delete(left, i)
				done = true
			}
		}
		if !done {
			for i := range left {
				out[i] += share
			}
			capacity = 0
		}
	}
	return out
}

// relErr is |got − want| / want.
func relErr(got, want float64) float64 {
	if want == 0 {
		return math.Inf(1)
	}
	return math.Abs(got-want) / want
}
