package egress

// Real-time tests. Every request is timed twice: when it left the Transport
// (releaseLog, the base the Transport sends through) and when it arrived at
// an httptest server, where the provider would count it. The limiter's own
// promises (spacing, the window bound, order) are checked on the releases,
// where only timer latency intervenes; what the provider sees (the rate, no
// burst beyond the bound) is checked at the server, with room for a request
// held up on the way: on a loaded machine one can be stalled for tens of ms
// and then arrive bunched with the next. Each test is bounded in count and
// time; the figures are logged, the exact numbers belong to benchmarks.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	// gapSlack is how much closer than 1/rate two releases of a leaky
	// bucket may be stamped: the time between the limiter's decision and
	// the stamp, microseconds unless the machine preempts just there.
	gapSlack = 10 * time.Millisecond
	// releaseSlack widens the windows checked on the releases of a token
	// bucket: it grants at computed times and its waiters' timers fire late,
	// by a few ms idle; after the machine stalls, the waiters that fell due
	// meanwhile leave together (3 within 3 ms at 50/s has been seen with the
	// CPUs oversubscribed).
	releaseSlack = 50 * time.Millisecond
	// arrivalStall widens the windows checked at the server: how long a
	// request may be held up between its release and its arrival on a
	// loaded 2-core machine under -race (60 ms has been seen with both
	// cores busy elsewhere).
	arrivalStall = 100 * time.Millisecond
)

// getDrained sends a GET to target through c and drains the response.
func getDrained(ctx context.Context, c *http.Client, target string, header http.Header) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %d", resp.StatusCode)
	}
	return err
}

// assertWindowBound checks that no window of the times holds more than
// r·(w+slack) + burst requests, w the window's length.
//
// A request stamped late (its goroutine preempted between the limiter's
// decision and the stamp, or held up on its way to the server) shortens the
// windows that start with it; after a stall of the machine, several can
// come late together. Such a window is excused when a window that starts up
// to lateRun requests earlier keeps the bound: then the short one's first
// requests were late, not early. A limiter that lets extra requests through
// breaks those too, as each earlier request adds one to the count and about
// 1/r to the length (the senders here never pause, so there is no idle
// time before a window that could lend it capacity).
func assertWindowBound(t *testing.T, what string, at []time.Time, r float64, burst int, slack time.Duration) {
	t.Helper()
	within := func(i, j int) bool {
		return float64(j-i+1) <= r*(at[j].Sub(at[i])+slack).Seconds()+float64(burst)+1e-9
	}
	const lateRun = 8 // the most senders in any test here: how many can bunch
	backs := []int{1, 2, 3, 4, 5, 6, 7, 8}
	excused := 0
	for i := range at {
		for j := i + 1; j < len(at); j++ {
			if within(i, j) {
				continue
			}
			if slices.ContainsFunc(backs[:min(i, lateRun)], func(b int) bool { return within(i-b, j) }) {
				excused++
				continue
			}
			t.Errorf("%s: %d requests within %v (%d..%d): more than %.2f (%v/s, burst %d, slack %v)",
				what, j-i+1, at[j].Sub(at[i]), i, j, r*(at[j].Sub(at[i])+slack).Seconds()+float64(burst), r, burst, slack)
			return
		}
	}
	if excused > 0 {
		t.Logf("%s: %d windows over the bound excused: each started with a late request", what, excused)
	}
}

// gapStats returns the smallest, mean and largest gap between consecutive
// times.
func gapStats(at []time.Time) (lo, mean, hi time.Duration) {
	if len(at) < 2 {
		return 0, 0, 0
	}
	lo, hi = time.Duration(1<<63-1), 0
	for i := 1; i < len(at); i++ {
		g := at[i].Sub(at[i-1])
		lo, hi = min(lo, g), max(hi, g)
	}
	return lo, at[len(at)-1].Sub(at[0]) / time.Duration(len(at)-1), hi
}

// fitRate returns the rate of the times, per second, from the least-squares
// slope of t_i against i: unlike (n-1)/span, one late first or last request
// hardly moves it.
func fitRate(at []time.Time) float64 {
	n := float64(len(at))
	xm := (n - 1) / 2
	var ym float64
	for _, a := range at {
		ym += a.Sub(at[0]).Seconds()
	}
	ym /= n
	var sxy, sxx float64
	for i, a := range at {
		dx := float64(i) - xm
		sxy += dx * (a.Sub(at[0]).Seconds() - ym)
		sxx += dx * dx
	}
	return sxx / sxy
}

// hammerServer sends total requests through c to target from workers
// goroutines, each as fast as it can, and returns the first error. It gives
// up at the context's end.
func hammerServer(ctx context.Context, c *http.Client, target string, workers, total int) error {
	var next atomic.Int64
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(total) {
				if err := getDrained(ctx, c, target, nil); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func TestRealTimeTokenBucketAchievedRate(t *testing.T) {
	const (
		r       = 50.0
		total   = 101 // 100 intervals: 2 s at 50/s
		workers = 8
	)
	srv := newRecServer(t, nil)
	log := srv.released(t)
	tb, err := NewTokenBucket(PerSecond(r), 1)
	require.NoError(t, err)
	tr := mustNewTransport(t, log, WithLimiter(tb))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()

	require.NoError(t, hammerServer(ctx, &http.Client{Transport: tr}, srv.URL, workers, total))

	rel, arr := log.times(), srv.times()
	require.Len(t, rel, total)
	require.Len(t, arr, total)
	span := arr[total-1].Sub(arr[0])
	lo, mean, hi := gapStats(arr)
	t.Logf("at the server: %.2f/s fitted, %.2f/s first to last (want %v/s); %d arrivals in %v; gaps min %v mean %v max %v",
		fitRate(arr), float64(total-1)/span.Seconds(), r, total, span, lo, mean, hi)
	t.Logf("at release: %.2f/s fitted", fitRate(rel))

	// Never faster than the rate. Slower only by what the machine costs:
	// while it stalls, the senders do not ask and a burst of 1 cannot save
	// the tokens they would have used (a 230 ms stall cost 7% in one run with
	// the CPUs oversubscribed; idle or with 2 CPU hogs it is within 0.5%).
	for _, got := range []float64{fitRate(arr), fitRate(rel)} {
		assert.LessOrEqual(t, got, r*1.05, "achieved rate")
		assert.GreaterOrEqual(t, got, r*0.85, "achieved rate")
	}
	assertWindowBound(t, "releases", rel, r, 1, releaseSlack)
	assertWindowBound(t, "server arrivals", arr, r, 1, arrivalStall)
}

func TestRealTimeTokenBucketBurstThenSpaced(t *testing.T) {
	const (
		r     = 5.0
		burst = 10
		total = 20 // the burst, then 10 more over 2 s
	)
	interval := time.Duration(float64(time.Second) / r)
	srv := newRecServer(t, nil)
	log := srv.released(t)
	tb, err := NewTokenBucket(PerSecond(r), burst)
	require.NoError(t, err)
	var waited atomic.Int32
	tr := mustNewTransport(t, log, WithLimiter(tb), WithObserver(Observer{
		OnWait: func(string, time.Duration) { waited.Add(1) },
	}))
	client := &http.Client{Transport: tr}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	start := make(chan struct{})
	errs := make(chan error, total)
	var wg sync.WaitGroup
	for range total {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if err := getDrained(ctx, client, srv.URL, nil); err != nil {
				errs <- err
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	rel, arr := log.times(), srv.times()
	require.Len(t, rel, total)
	require.Len(t, arr, total)
	lo, mean, hi := gapStats(rel[burst-1:])
	t.Logf("burst of %d released within %v, arrived within %v; then gaps min %v mean %v max %v; total %v",
		burst, rel[burst-1].Sub(rel[0]), arr[burst-1].Sub(arr[0]), lo, mean, hi, arr[total-1].Sub(arr[0]))

	// The last unit of the burst waits the transit margin (5 ms, see
	// WithTransitMargin): it counts as a wait.
	assert.Equal(t, int32(total-burst+1), waited.Load(), "the burst goes at once, the rest wait")
	assert.Less(t, rel[burst-1].Sub(rel[0]), interval, "the burst leaves together")
	// After the burst, one per interval: never sooner (the window bound),
	// not much later in all.
	assertWindowBound(t, "releases", rel, r, burst, releaseSlack)
	span := rel[total-1].Sub(rel[0])
	assert.LessOrEqual(t, span, (total-burst)*interval+arrivalStall, "the spaced part takes (n-burst)/rate")
	assertWindowBound(t, "server arrivals", arr, r, burst, arrivalStall)
}

func TestRealTimeTokenBucketWaitThatFitsTheDeadline(t *testing.T) {
	srv := newRecServer(t, nil)
	log := srv.released(t)
	tb, err := NewTokenBucket(PerSecond(10), 1)
	require.NoError(t, err)
	tr := mustNewTransport(t, log, WithLimiter(tb))
	mustSend200(t, tr, newPlainGet(t, context.Background(), srv.URL))

	// The wait (100 ms) fits the deadline (1 s): the request waits and is sent.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	mustSend200(t, tr, newPlainGet(t, ctx, srv.URL))
	rel := log.times()
	require.Len(t, rel, 2)
	assert.Equal(t, 2, srv.count())
	assert.GreaterOrEqual(t, rel[1].Sub(rel[0]), 100*time.Millisecond-releaseSlack)
	assert.Less(t, rel[1].Sub(rel[0]), 500*time.Millisecond)
}

func TestRealTimeLeakyBucketSpacing(t *testing.T) {
	const (
		r       = 20.0
		workers = 10
		each    = 5
		total   = workers * each
	)
	interval := time.Duration(float64(time.Second) / r)
	srv := newRecServer(t, nil)
	log := srv.released(t)
	lb, err := NewLeakyBucket(PerSecond(r), 100)
	require.NoError(t, err)
	client := &http.Client{Transport: mustNewTransport(t, log, WithLimiter(lb))}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()

	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if err := getDrained(ctx, client, srv.URL, nil); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	rel, arr := log.times(), srv.times()
	require.Len(t, rel, total)
	require.Len(t, arr, total)
	relLo, relMean, relHi := gapStats(rel)
	arrLo, arrMean, arrHi := gapStats(arr)
	bunched := 0
	for i := 1; i < len(arr); i++ {
		if arr[i].Sub(arr[i-1]) < interval-gapSlack {
			bunched++
		}
	}
	t.Logf("%d requests, 1/R = %v, ideal span %v", total, interval, (total-1)*interval)
	t.Logf("released: span %v, gaps min %v mean %v max %v, %.2f/s fitted",
		rel[total-1].Sub(rel[0]), relLo, relMean, relHi, fitRate(rel))
	t.Logf("arrived:  span %v, gaps min %v mean %v max %v, %.2f/s fitted, %d gaps under 1/R-%v",
		arr[total-1].Sub(arr[0]), arrLo, arrMean, arrHi, fitRate(arr), bunched, gapSlack)

	// Consecutive releases are never closer than 1/rate (a window of two),
	// nor any n of them closer than (n-1)/rate.
	assertWindowBound(t, "releases", rel, r, 1, gapSlack)
	assertWindowBound(t, "server arrivals", arr, r, 1, arrivalStall)
	assert.LessOrEqual(t, bunched, total/10, "at the server, gaps under 1/R are rare stalls, not the rule")
	// Never faster than the rate. Slower only by what the machine costs, as
	// for the token bucket (TestRealTimeTokenBucketAchievedRate): each
	// release is spaced from its due time, not from when its goroutine got
	// round to it, so timer latency does not add up.
	for _, got := range []float64{fitRate(rel), fitRate(arr)} {
		assert.LessOrEqual(t, got, r*1.05, "achieved rate")
		assert.GreaterOrEqual(t, got, r*0.85, "achieved rate")
	}
}

// TestRealTimeAchievedRateHighRate: at 500/s, with the queue kept busy, the
// rate at which the Transport lets requests go is within 5% of the
// configured rate. (Measured where the requests leave the Transport, into a
// base that does no I/O: a loaded 2-core machine cannot feed an httptest
// server at 500/s under -race.)
//
// The token bucket passes (498.6-499.9/s). The leaky bucket FAILS: 436-448/s
// here idle (-10% to -13%, with or without -race), 365-417/s with the CPUs
// busy; 441-451/s calling Wait in a loop; 380-410/s at an httptest server at
// 500/s, 180/s at 200/s. In LeakyBucket.poll the next release is set to
// "now + cost/rate", where now is when the head's goroutine got round to
// polling (after its timer fired, or after it was woken as the new head),
// not when its release was due (l.next). Every release thus inherits the
// timer and wake-up latency (0.2-0.6 ms idle), the lateness accumulates, and
// the queue drains at R/(1+R·latency) instead of "exactly R/s" (DESIGN.md;
// the LeakyBucket doc: "spaced 1/rate apart"). The loss grows with R and
// with the machine's load: about -0.5% at 20/s idle, -3% at 100/s, -7% to
// -10% at 200/s, -10% to -27% at 500/s. Spacing a queued waiter from its due
// time instead (l.next = l.next.Add(...), with a bound on how far a stalled
// queue may catch up) gave 499.9/s here in an experiment on a copy of the
// code, with the other leaky tests in this file still passing.
func TestRealTimeAchievedRateHighRate(t *testing.T) {
	const (
		r       = 500.0
		total   = 501 // 1 s
		workers = 8
	)
	for _, lc := range limiterShapes {
		t.Run(lc.name, func(t *testing.T) {
			capacity := 1 // a token bucket's burst
			if lc.name == "leakybucket" {
				capacity = workers // a place in the queue for every worker
			}
			log := &releaseLog{next: newNop()}
			tr := mustNewTransport(t, log, WithLimiter(lc.make(t, PerSecond(r), capacity)))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()

			var next atomic.Int64
			errs := make(chan error, workers)
			var wg sync.WaitGroup
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://api.example.com/v1/charges", nil)
					if err != nil {
						errs <- err
						return
					}
					for next.Add(1) <= total {
						if _, err := tr.RoundTrip(req); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			require.NoError(t, <-errs)

			rel := log.times()
			require.Len(t, rel, total)
			achieved := fitRate(rel)
			t.Logf("%s at %v/s: achieved %.1f/s (%+.1f%%), %d requests in %v",
				lc.name, r, achieved, 100*(achieved-r)/r, total, rel[total-1].Sub(rel[0]))
			assert.InEpsilon(t, r, achieved, 0.05, "achieved rate")
			assertWindowBound(t, "releases", rel, r, capacity, releaseSlack)
		})
	}
}

// leakyTailAt returns when a request arriving on key now would be released,
// without queueing one (see probeWouldWait).
func leakyTailAt(t *testing.T, lb *LeakyBucket, key string) time.Time {
	t.Helper()
	now := time.Now()
	return now.Add(probeWouldWait(t, lb, key))
}

// awaitJoinedQueue waits until one more request has joined key's queue,
// which it sees as the queue's tail moving at least half an interval past
// prev, and returns the new tail. The key must stay busy meanwhile (a probe
// on an idle key fails the test).
func awaitJoinedQueue(t *testing.T, lb *LeakyBucket, key string, prev time.Time, interval time.Duration) time.Time {
	t.Helper()
	giveUp := time.Now().Add(5 * time.Second)
	for {
		tail := leakyTailAt(t, lb, key)
		if tail.Sub(prev) >= interval/2 {
			return tail
		}
		require.True(t, time.Now().Before(giveUp), "no request joined the queue of %q", key)
		time.Sleep(time.Millisecond)
	}
}

// bgRequest is a request sent in the background, in a known place in its
// key's queue.
type bgRequest struct {
	seq      int
	ctx      context.Context
	cancel   context.CancelFunc
	done     chan struct{}
	err      error     // set before done is closed
	returned time.Time // set before done is closed
}

// enqueueBackground sends a request tagged with seq through c in the
// background and returns once it has joined lb's queue for key; tail is the
// queue's tail before, and after.
func enqueueBackground(t *testing.T, c *http.Client, lb *LeakyBucket, target, key string, seq int, tail *time.Time, interval time.Duration) *bgRequest {
	t.Helper()
	q := &bgRequest{seq: seq, done: make(chan struct{})}
	q.ctx, q.cancel = context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(q.cancel)
	go func() {
		defer close(q.done)
		q.err = getDrained(q.ctx, c, target, http.Header{"X-Seq": {strconv.Itoa(seq)}})
		q.returned = time.Now()
	}()
	*tail = awaitJoinedQueue(t, lb, key, *tail, interval)
	return q
}

func (q *bgRequest) wait(t *testing.T) {
	t.Helper()
	select {
	case <-q.done:
	case <-time.After(15 * time.Second):
		t.Fatalf("request %d never returned", q.seq)
	}
}

func TestRealTimeLeakyBucketFIFO(t *testing.T) {
	const (
		r = 5.0
		n = 8
	)
	interval := time.Duration(float64(time.Second) / r)
	srv := newRecServer(t, nil)
	log := srv.released(t)
	lb, err := NewLeakyBucket(PerSecond(r), 100)
	require.NoError(t, err)
	client := &http.Client{Transport: mustNewTransport(t, log, WithLimiter(lb))}
	key := srv.host()

	// Occupy the key so that every request that follows queues, then add
	// them one by one: the order in which they joined is known.
	takeOneUnit(t, lb, key)
	tail := leakyTailAt(t, lb, key)
	var qs []*bgRequest
	for i := range n {
		qs = append(qs, enqueueBackground(t, client, lb, srv.URL, key, i, &tail, interval))
	}
	for _, q := range qs {
		q.wait(t)
		require.NoError(t, q.err, "request %d", q.seq)
	}

	want := []int{0, 1, 2, 3, 4, 5, 6, 7}
	assert.Equal(t, want, log.seqOrder(), "requests leave in the order they queued")
	assert.ElementsMatch(t, want, srv.seqOrder())
	rel := log.times()
	lo, mean, hi := gapStats(rel)
	t.Logf("FIFO: server order %v; release gaps min %v mean %v max %v", srv.seqOrder(), lo, mean, hi)
	assertWindowBound(t, "releases", rel, r, 1, gapSlack)
}

func TestRealTimeLeakyBucketQueueFull(t *testing.T) {
	const (
		depth   = 2
		senders = 8
	)
	srv := newRecServer(t, nil)
	lb, err := NewLeakyBucket(PerSecond(2), depth) // 500 ms apart: the test is over in 1 s
	require.NoError(t, err)
	client := &http.Client{Transport: mustNewTransport(t, srv.pooled(t), WithLimiter(lb))}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	type result struct {
		err     error
		elapsed time.Duration
	}
	start := make(chan struct{})
	results := make(chan result, senders)
	var wg sync.WaitGroup
	for range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			began := time.Now()
			err := getDrained(ctx, client, srv.URL, nil)
			results <- result{err, time.Since(began)}
		}()
	}
	close(start)
	wg.Wait()
	close(results)

	var sent, full int
	for res := range results {
		if res.err == nil {
			sent++
			continue
		}
		require.ErrorIs(t, res.err, ErrQueueFull)
		require.ErrorIs(t, res.err, ErrRateLimited)
		var le *LimitError
		require.ErrorAs(t, res.err, &le)
		assert.Equal(t, ReasonQueueFull, le.Reason)
		assert.Equal(t, srv.host(), le.Key)
		assert.Positive(t, le.Wait)
		// At once: long before the first queued request leaves (500 ms),
		// with room for a loaded machine around the HTTP client.
		assert.Less(t, res.elapsed, 200*time.Millisecond, "a full queue refuses at once")
		full++
	}
	assert.Equal(t, 1+depth, sent, "one goes at once, depth queue")
	assert.Equal(t, senders-1-depth, full)
	assert.Equal(t, 1+depth, srv.count())
}

func TestRealTimeLeakyBucketCancelMidQueue(t *testing.T) {
	const r = 5.0
	interval := time.Duration(float64(time.Second) / r)
	srv := newRecServer(t, nil)
	log := srv.released(t)
	lb, err := NewLeakyBucket(PerSecond(r), 10)
	require.NoError(t, err)
	client := &http.Client{Transport: mustNewTransport(t, log, WithLimiter(lb))}
	key := srv.host()

	takeOneUnit(t, lb, key) // at t0; A, B, C are due at t0 + 200, 400, 600 ms
	tail := leakyTailAt(t, lb, key)
	a := enqueueBackground(t, client, lb, srv.URL, key, 0, &tail, interval)
	b := enqueueBackground(t, client, lb, srv.URL, key, 1, &tail, interval)
	c := enqueueBackground(t, client, lb, srv.URL, key, 2, &tail, interval)

	cancelled := time.Now()
	b.cancel()
	b.wait(t)
	assert.ErrorIs(t, b.err, context.Canceled)
	assert.Less(t, b.returned.Sub(cancelled), promptBound, "a cancelled waiter returns at once")
	a.wait(t)
	c.wait(t)
	require.NoError(t, a.err)
	require.NoError(t, c.err)

	assert.Equal(t, []int{0, 2}, log.seqOrder(), "the cancelled request is never released")
	assert.ElementsMatch(t, []int{0, 2}, srv.seqOrder(), "the cancelled request never reaches the server")
	// C moved up into B's place: one interval after A, not two.
	relA, okA := log.release(0)
	relC, okC := log.release(2)
	require.True(t, okA && okC)
	gap := relC.Sub(relA)
	t.Logf("after the cancel, C left %v after A", gap)
	assert.GreaterOrEqual(t, gap, interval/2)
	assert.Less(t, gap, interval+interval/2, "the requests behind a cancelled waiter move up (not 2 intervals)")
}

func TestRealTimeLeakyBucketDeadlineBehindQueue(t *testing.T) {
	const r = 5.0
	interval := time.Duration(float64(time.Second) / r)
	srv := newRecServer(t, nil)
	log := srv.released(t)
	lb, err := NewLeakyBucket(PerSecond(r), 10)
	require.NoError(t, err)
	tr := mustNewTransport(t, log, WithLimiter(lb))
	client := &http.Client{Transport: tr}
	key := srv.host()

	takeOneUnit(t, lb, key)
	tail := leakyTailAt(t, lb, key)
	a := enqueueBackground(t, client, lb, srv.URL, key, 0, &tail, interval)
	b := enqueueBackground(t, client, lb, srv.URL, key, 1, &tail, interval)

	// Two ahead: this one would leave about 600 ms from now, past its deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, body := newSpyPost(t, ctx, srv.URL, "x")
	start := time.Now()
	_, err = checkedRoundTrip(t, tr, req)
	elapsed := time.Since(start)
	var le *LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, ReasonDeadline, le.Reason)
	assert.Less(t, elapsed, promptBound, "refused at once, not at the deadline")
	assert.Greater(t, le.Wait, 300*time.Millisecond)
	assert.LessOrEqual(t, le.Wait, 3*interval+gapSlack)
	assert.True(t, body.closed())

	// The refused request took no place: A and B leave on time.
	a.wait(t)
	b.wait(t)
	require.NoError(t, a.err)
	require.NoError(t, b.err)
	assert.Equal(t, []int{0, 1}, log.seqOrder())
	assert.Equal(t, 2, srv.count())
	relA, _ := log.release(0)
	relB, _ := log.release(1)
	assert.Less(t, relB.Sub(relA), interval+interval/2)
}
