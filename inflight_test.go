package egress

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egress-go/egress/internal/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newInFlightOnFake(t *testing.T, n int, opts ...LimiterOption) (*InFlightLimit, *clock.Fake) {
	t.Helper()
	l, err := NewInFlightLimit(n, opts...)
	require.NoError(t, err)
	fc := clock.NewFake(time.Unix(1_700_000_000, 0))
	l.clock = fc
	return l, fc
}

type acquired struct {
	release func()
	waited  time.Duration
	err     error
}

func acquireAsync(l InFlightLimiter, ctx context.Context, key string, maxWait time.Duration) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		r, w, err := l.Acquire(ctx, key, maxWait)
		ch <- acquired{r, w, err}
	}()
	return ch
}

func TestNewInFlightLimitValidates(t *testing.T) {
	for _, tc := range []struct {
		n    int
		opts []LimiterOption
		want string
	}{
		{0, nil, "NewInFlightLimit: n 0"},
		{-3, nil, "NewInFlightLimit: n -3"},
		{1, []LimiterOption{WithLeaseTime(0)}, "WithLeaseTime 0s"},
		{1, []LimiterOption{nil}, "option nil"},
	} {
		_, err := NewInFlightLimit(tc.n, tc.opts...)
		require.ErrorIs(t, err, ErrInvalidConfig)
		assert.Contains(t, err.Error(), tc.want)
	}
	_, err := New(nil, WithInFlightLimit((*InFlightLimit)(nil)))
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "WithInFlightLimit")
}

// TestInFlightLimitSteps: on a fake clock, n slots per key are granted at
// once, the next waiters queue in order and are served as slots are freed,
// a release is idempotent, keys are independent, and an idle key leaves no
// state.
func TestInFlightLimitSteps(t *testing.T) {
	l, _ := newInFlightOnFake(t, 2)
	ctx := context.Background()
	r1, w, err := l.Acquire(ctx, "a", 0)
	require.NoError(t, err)
	assert.Zero(t, w)
	r2, _, err := l.Acquire(ctx, "a", 0)
	require.NoError(t, err)
	rb, _, err := l.Acquire(ctx, "b", 0) // another key is not affected
	require.NoError(t, err)
	assert.Equal(t, 2, l.InFlight("a"))

	third := acquireAsync(l, ctx, "a", 0)
	spinUntil(t, "the third waits", func() bool { l.mu.Lock(); defer l.mu.Unlock(); return len(l.keys["a"].waiters) == 1 })
	fourth := acquireAsync(l, ctx, "a", 0)
	spinUntil(t, "the fourth waits", func() bool { l.mu.Lock(); defer l.mu.Unlock(); return len(l.keys["a"].waiters) == 2 })

	r1()
	got := recvWithin(t, third)
	require.NoError(t, got.err)
	r1() // a second release frees nothing more
	select {
	case <-fourth:
		t.Fatal("a repeated release freed a second slot")
	case <-time.After(20 * time.Millisecond):
	}
	assert.Equal(t, 2, l.InFlight("a"))
	r2()
	got4 := recvWithin(t, fourth)
	require.NoError(t, got4.err)

	got.release()
	got4.release()
	rb()
	l.mu.Lock()
	assert.Empty(t, l.keys, "idle keys are dropped")
	l.mu.Unlock()
}

// TestInFlightLimitLeaves: a waiter whose maximum wait ends gets a
// *LimitError matching ErrTooManyInFlight; one whose context ends gets the
// context's error; neither takes a slot.
func TestInFlightLimitLeaves(t *testing.T) {
	l, fc := newInFlightOnFake(t, 1, WithLeaseTime(time.Hour))
	ctx := context.Background()
	r1, _, err := l.Acquire(ctx, "k", 0)
	require.NoError(t, err)

	timed := acquireAsync(l, ctx, "k", 200*time.Millisecond)
	waitTimers(t, fc, 2) // its max wait and the lease's end
	fc.Advance(200 * time.Millisecond)
	got := recvWithin(t, timed)
	require.ErrorIs(t, got.err, ErrTooManyInFlight)
	require.ErrorIs(t, got.err, ErrRateLimited)
	var le *LimitError
	require.ErrorAs(t, got.err, &le)
	assert.Equal(t, ReasonInFlight, le.Reason)
	assert.Equal(t, 200*time.Millisecond, le.Wait)
	assert.Nil(t, got.release)

	cctx, cancel := context.WithCancel(ctx)
	gone := acquireAsync(l, cctx, "k", 0)
	spinUntil(t, "it waits", func() bool { l.mu.Lock(); defer l.mu.Unlock(); return len(l.keys["k"].waiters) == 1 })
	cancel()
	got = recvWithin(t, gone)
	require.ErrorIs(t, got.err, context.Canceled)

	r1()
	assert.Zero(t, l.InFlight("k"), "the waiters that left took no slot")
}

// TestInFlightLimitLeaseEnds: a slot never released comes back when its
// lease ends, to the waiter at the head of the queue.
func TestInFlightLimitLeaseEnds(t *testing.T) {
	l, fc := newInFlightOnFake(t, 1, WithLeaseTime(time.Minute))
	ctx := context.Background()
	_, _, err := l.Acquire(ctx, "k", 0) // never released
	require.NoError(t, err)
	w := acquireAsync(l, ctx, "k", 0)
	waitTimers(t, fc, 1)
	fc.Advance(59 * time.Second)
	select {
	case <-w:
		t.Fatal("the slot came back before its lease ended")
	case <-time.After(20 * time.Millisecond):
	}
	fc.Advance(time.Second)
	got := recvWithin(t, w)
	require.NoError(t, got.err)
	assert.Equal(t, time.Minute, got.waited)
	got.release()
	assert.Zero(t, l.InFlight("k"))
}

// inFlightServer answers after the handler's gate opens, and records the
// most requests it had in flight at once.
type inFlightServer struct {
	*recServer
	now, most atomic.Int64
}

func newInFlightServer(t *testing.T, hold time.Duration) *inFlightServer {
	s := &inFlightServer{}
	s.recServer = newRecServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		n := s.now.Add(1)
		for {
			m := s.most.Load()
			if n <= m || s.most.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(hold)
		s.now.Add(-1)
		w.Write([]byte("0123456789"))
	})
	return s
}

// TestTransportInFlightCap: through a Transport, 16 goroutines never have
// more than 3 requests of a key in flight, counting from the send until
// the body is closed; every request is sent.
func TestTransportInFlightCap(t *testing.T) {
	srv := newInFlightServer(t, 5*time.Millisecond)
	l, err := NewInFlightLimit(3)
	require.NoError(t, err)
	tr := mustNewTransport(t, srv.pooled(t), WithInFlightLimit(l))
	var open, most atomic.Int64 // bodies not yet closed, seen from the client
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
				resp, err := tr.RoundTrip(req)
				if !assert.NoError(t, err) {
					return
				}
				n := open.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(time.Millisecond) // the body is still held
				open.Add(-1)
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 160, srv.count())
	assert.LessOrEqual(t, srv.most.Load(), int64(3))
	assert.LessOrEqual(t, most.Load(), int64(3))
	assert.Equal(t, int64(3), srv.most.Load(), "the cap is used")
	assert.Zero(t, l.InFlight(srv.host()))
}

// TestTransportInFlightRelease: the slot is freed when the body is read to
// its end, when it is closed unread, when the request's context ends with
// the body open, and at once when the attempt fails; and it is held while
// the body is open.
func TestTransportInFlightRelease(t *testing.T) {
	srv := newInFlightServer(t, 0)
	l, err := NewInFlightLimit(1)
	require.NoError(t, err)
	tr := mustNewTransport(t, srv.pooled(t), WithInFlightLimit(l), WithMaxWait(50*time.Millisecond))
	key := srv.host()
	get := func(ctx context.Context) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		return tr.RoundTrip(req)
	}
	ctx := context.Background()

	resp, err := get(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, l.InFlight(key), "held while the body is open")
	_, err = get(ctx)
	require.ErrorIs(t, err, ErrTooManyInFlight, "the second waits its max wait and is refused")
	_, err = io.ReadAll(resp.Body) // read to EOF, not closed
	require.NoError(t, err)
	assert.Zero(t, l.InFlight(key), "freed at EOF")
	resp.Body.Close()

	resp, err = get(ctx)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Zero(t, l.InFlight(key), "freed at Close")

	cctx, cancel := context.WithCancel(ctx)
	resp, err = get(cctx)
	require.NoError(t, err)
	assert.Equal(t, 1, l.InFlight(key))
	cancel()
	spinUntil(t, "the context's end frees the slot", func() bool { return l.InFlight(key) == 0 })
	resp.Body.Close()

	failing := mustNewTransport(t, roundTripFunc(func(*http.Request) (*http.Response, error) {
		return nil, errors.New("connection refused")
	}), WithInFlightLimit(l))
	req, _ := http.NewRequest(http.MethodGet, "http://failing.example/", nil)
	_, err = failing.RoundTrip(req)
	require.Error(t, err)
	assert.Zero(t, l.InFlight("failing.example"), "a failed attempt frees its slot")
}

// TestTransportInFlightUnclosedBody: a body the caller never reads nor
// closes, in a context that never ends, gives its slot back when the lease
// ends (WithLeaseTime), so that the next request goes.
func TestTransportInFlightUnclosedBody(t *testing.T) {
	srv := newInFlightServer(t, 0)
	l, err := NewInFlightLimit(1, WithLeaseTime(100*time.Millisecond))
	require.NoError(t, err)
	tr := mustNewTransport(t, srv.pooled(t), WithInFlightLimit(l))
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	leaked, err := tr.RoundTrip(req)
	require.NoError(t, err)
	start := time.Now()
	req, _ = http.NewRequest(http.MethodGet, srv.URL, nil)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	took := time.Since(start)
	resp.Body.Close()
	assert.GreaterOrEqual(t, took, 90*time.Millisecond)
	assert.Less(t, took, 2*time.Second)
	leaked.Body.Close() // late: frees nothing more
	assert.Zero(t, l.InFlight(srv.host()))
}

// countingRelease returns a release function that counts its calls.
func countingRelease() (func(), *atomic.Int32) {
	var n atomic.Int32
	return func() { n.Add(1) }, &n
}

// slotResp is a 200 response whose body is the given text.
func slotResp(body string) *http.Response {
	return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader(body))}
}

// TestHoldSlotFreesOnce: whatever frees a slot first — the body read to
// its end, the body closed, the attempt failing, no body at all, or the
// request's context ending before or after the response — the slot's
// release runs exactly once, however many of them follow.
func TestHoldSlotFreesOnce(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context // nil: a context cancelled mid-way by run
		resp *http.Response
		err  error
		run  func(resp *http.Response, cancel context.CancelFunc)
	}{
		{"read to EOF, then closed, then the context ends", nil, slotResp("abc"), nil, func(r *http.Response, cancel context.CancelFunc) {
			io.ReadAll(r.Body)
			r.Body.Close()
			cancel()
		}},
		{"closed unread, twice, then the context ends", nil, slotResp("abc"), nil, func(r *http.Response, cancel context.CancelFunc) {
			r.Body.Close()
			r.Body.Close()
			cancel()
		}},
		{"the context ends, then the body is read and closed", nil, slotResp("abc"), nil, func(r *http.Response, cancel context.CancelFunc) {
			cancel()
			io.ReadAll(r.Body)
			r.Body.Close()
		}},
		{"the context ended before the response", ended, slotResp("abc"), nil, func(r *http.Response, _ context.CancelFunc) {
			io.ReadAll(r.Body)
			r.Body.Close()
		}},
		{"the attempt failed", nil, nil, errors.New("connection refused"), func(*http.Response, context.CancelFunc) {}},
		{"no body", nil, &http.Response{StatusCode: http.StatusNoContent, Body: http.NoBody}, nil, func(*http.Response, context.CancelFunc) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := tc.ctx, context.CancelFunc(func() {})
			if ctx == nil {
				ctx, cancel = context.WithCancel(context.Background())
			}
			defer cancel()
			release, n := countingRelease()
			resp := holdSlot(ctx, release, tc.resp, tc.err)
			tc.run(resp, cancel)
			spinUntil(t, "the slot is freed", func() bool { return n.Load() >= 1 })
			time.Sleep(5 * time.Millisecond) // room for a second, wrong, release
			assert.Equal(t, int32(1), n.Load())
		})
	}
}

// TestHoldSlotContextEndsConcurrently: a context that has ended by the
// time holdSlot ties the slot to the body (it ended during the attempt)
// runs the slot's free on a goroutine of its own, at once, while holdSlot
// is still setting the slot up; one that ends on another goroutine does the
// same while the caller reads and closes the body. Under -race that must be
// free of data races, and the slot freed once.
func TestHoldSlotContextEndsConcurrently(t *testing.T) {
	for range 200 {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		release, n := countingRelease()
		resp := holdSlot(ctx, release, slotResp("abc"), nil)
		spinUntil(t, "the context's end frees the slot", func() bool { return n.Load() >= 1 })
		resp.Body.Close()

		ctx, cancel = context.WithCancel(context.Background())
		release, m := countingRelease()
		go cancel()
		resp = holdSlot(ctx, release, slotResp("abc"), nil)
		io.ReadAll(resp.Body)
		spinUntil(t, "the slot is freed", func() bool { return m.Load() >= 1 })
		<-ctx.Done()
		resp.Body.Close()
		if n.Load() != 1 || m.Load() != 1 {
			t.Fatalf("released %d and %d times, want once each", n.Load(), m.Load())
		}
	}
}

// TestTransportInFlightContextEnds: 10 callers through a cap of 3, against
// a server whose body follows its headers by 50 ms, with contexts that end
// during the attempt — cancelled as the response arrives, or at a deadline
// while the body is on its way. Under -race there is no data race, and
// every slot comes back. (The server's own count is no check of the cap: a
// request whose context ended frees its slot while the server still works
// on it.)
func TestTransportInFlightContextEnds(t *testing.T) {
	var answered atomic.Int64 // responses whose headers were sent
	srv := newRecServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		answered.Add(1)
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		time.Sleep(50 * time.Millisecond)
		w.Write([]byte("0123456789"))
	})
	l, err := NewInFlightLimit(3)
	require.NoError(t, err)
	// The base cancels the request's context as its response arrives: the
	// context ends during the attempt, before the Transport holds the slot.
	var cancels sync.Map // *http.Request's context -> context.CancelFunc
	pooled := srv.pooled(t)
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := pooled.RoundTrip(req)
		if c, ok := cancels.Load(req.Context()); ok {
			c.(context.CancelFunc)()
		}
		return resp, err
	})
	tr := mustNewTransport(t, base, WithInFlightLimit(l))
	var wg sync.WaitGroup
	for w := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 6 {
				var ctx context.Context
				var cancel context.CancelFunc
				if (w+i)%2 == 0 {
					ctx, cancel = context.WithCancel(context.Background())
					cancels.Store(ctx, cancel)
				} else {
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(10+5*i)*time.Millisecond)
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
				if resp, err := tr.RoundTrip(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				cancels.Delete(ctx)
				cancel()
			}
		}()
	}
	wg.Wait()
	spinUntil(t, "every slot comes back", func() bool { return l.InFlight(srv.host()) == 0 })
	assert.Positive(t, srv.count())
	assert.Positive(t, answered.Load())
}
