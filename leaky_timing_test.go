//go:build go1.25

package egress

// The leaky bucket's queue through the Transport, on the fake clock of a
// testing/synctest bubble against an in-memory recServer: order, a full
// queue, a cancel and a deadline in the middle of the queue, measured to
// the nanosecond. (The rates achieved on real timers are in
// realtime_test.go.)

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// queuedRequest is a request sent in the background that has joined its
// key's queue.
type queuedRequest struct {
	seq      int
	cancel   context.CancelFunc
	done     chan struct{}
	err      error     // set before done is closed
	returned time.Time // set before done is closed
}

// enqueue sends a request tagged with seq through c in the background and
// returns once every goroutine of the bubble waits: the request is queued.
func enqueue(t *testing.T, c *http.Client, target string, seq int) *queuedRequest {
	t.Helper()
	q := &queuedRequest{seq: seq, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	q.cancel = cancel
	t.Cleanup(cancel)
	go func() {
		defer close(q.done)
		q.err = getDrained(ctx, c, target, http.Header{"X-Seq": {strconv.Itoa(seq)}})
		q.returned = time.Now()
	}()
	synctest.Wait()
	return q
}

// leakyThroughTransport is a leaky bucket of rate r and depth behind a
// Transport that sends to an in-memory server through a releaseLog.
func leakyThroughTransport(t *testing.T, r Rate, depth int) (*recServer, *releaseLog, *LeakyBucket, *Transport) {
	t.Helper()
	srv := newMemServer(t, nil)
	log := &releaseLog{next: srv.memBase()}
	lb, err := NewLeakyBucket(r, depth)
	require.NoError(t, err)
	return srv, log, lb, mustNewTransport(t, log, WithLimiter(lb))
}

func TestLeakyTimingFIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 8
		interval := 200 * time.Millisecond
		srv, log, lb, tr := leakyThroughTransport(t, Every(interval), 100)
		client := &http.Client{Transport: tr}

		// Occupy the key so that every request that follows queues, then
		// add them one by one: the order in which they joined is known.
		t0 := time.Now()
		takeOneUnit(t, lb, srv.host())
		var qs []*queuedRequest
		for i := range n {
			qs = append(qs, enqueue(t, client, srv.URL, i))
		}
		for _, q := range qs {
			<-q.done
			require.NoError(t, q.err, "request %d", q.seq)
		}

		want := []int{0, 1, 2, 3, 4, 5, 6, 7}
		assert.Equal(t, want, log.seqOrder(), "requests leave in the order they queued")
		assert.Equal(t, want, srv.seqOrder())
		for i, at := range log.times() {
			assert.Equal(t, time.Duration(i+1)*interval, at.Sub(t0), "release %d: spaced exactly 1/R", i)
		}
	})
}

func TestLeakyTimingQueueFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			depth   = 2
			senders = 8
		)
		srv, _, _, tr := leakyThroughTransport(t, PerSecond(2), depth)
		client := &http.Client{Transport: tr}

		type result struct {
			err     error
			elapsed time.Duration
		}
		results := make(chan result, senders)
		var wg sync.WaitGroup
		for range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				began := time.Now()
				err := getDrained(context.Background(), client, srv.URL, nil)
				results <- result{err, time.Since(began)}
			}()
		}
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
			assert.Equal(t, 1500*time.Millisecond, le.Wait, "behind the one sent and the two queued")
			assert.Zero(t, res.elapsed, "a full queue refuses at once")
			full++
		}
		assert.Equal(t, 1+depth, sent, "one goes at once, depth queue")
		assert.Equal(t, senders-1-depth, full)
		assert.Equal(t, 1+depth, srv.count())
	})
}

func TestLeakyTimingCancelMidQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		interval := 200 * time.Millisecond
		srv, log, lb, tr := leakyThroughTransport(t, Every(interval), 10)
		client := &http.Client{Transport: tr}

		t0 := time.Now()
		takeOneUnit(t, lb, srv.host()) // A, B, C are due at t0 + 200, 400, 600 ms
		a := enqueue(t, client, srv.URL, 0)
		b := enqueue(t, client, srv.URL, 1)
		c := enqueue(t, client, srv.URL, 2)

		time.Sleep(interval / 2)
		cancelled := time.Now()
		b.cancel()
		<-b.done
		assert.ErrorIs(t, b.err, context.Canceled)
		assert.Equal(t, cancelled, b.returned, "a cancelled waiter returns at once")
		<-a.done
		<-c.done
		require.NoError(t, a.err)
		require.NoError(t, c.err)

		assert.Equal(t, []int{0, 2}, log.seqOrder(), "the cancelled request is never released")
		assert.Equal(t, []int{0, 2}, srv.seqOrder(), "the cancelled request never reaches the server")
		relA, okA := log.release(0)
		relC, okC := log.release(2)
		require.True(t, okA && okC)
		assert.Equal(t, interval, relA.Sub(t0))
		assert.Equal(t, interval, relC.Sub(relA), "the requests behind a cancelled waiter move up")
	})
}

func TestLeakyTimingDeadlineBehindQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		interval := 200 * time.Millisecond
		srv, log, lb, tr := leakyThroughTransport(t, Every(interval), 10)
		client := &http.Client{Transport: tr}

		t0 := time.Now()
		takeOneUnit(t, lb, srv.host())
		a := enqueue(t, client, srv.URL, 0)
		b := enqueue(t, client, srv.URL, 1)

		// Two ahead: this one would leave at t0+600ms, past its deadline.
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		req, body := newSpyPost(t, ctx, srv.URL, "x")
		_, err := checkedRoundTrip(t, tr, req)
		var le *LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, ReasonDeadline, le.Reason)
		assert.Equal(t, t0, time.Now(), "refused at once, not at the deadline")
		assert.Equal(t, 3*interval, le.Wait)
		assert.True(t, body.closed())

		// The refused request took no place: A and B leave on time.
		<-a.done
		<-b.done
		require.NoError(t, a.err)
		require.NoError(t, b.err)
		assert.Equal(t, []int{0, 1}, log.seqOrder())
		assert.Equal(t, 2, srv.count())
		relB, _ := log.release(1)
		assert.Equal(t, 2*interval, relB.Sub(t0))
	})
}
