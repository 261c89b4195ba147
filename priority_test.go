package egress

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/clock"
)

// prioRig is a Transport with WithPriorities over a 10/s token bucket of
// burst 1, on one fake clock, whose base records the order requests are
// sent in (by their X-Name).
type prioRig struct {
	t    *testing.T
	tr   *Transport
	fc   *clock.Fake
	mu   sync.Mutex
	sent []string
	done chan prioResult
}

type prioResult struct {
	name string
	err  error
}

func newPrioRig(t *testing.T, opts ...Option) *prioRig {
	t.Helper()
	tb, err := NewTokenBucket(PerSecond(10), 1, WithTransitMargin(0))
	require.NoError(t, err)
	// The clock starts at the real time, so that a context's deadline (a
	// real one) lies where the fake clock says.
	fc := clock.NewFake(time.Now())
	tb.clock = fc
	return newPrioRigWith(t, tb, fc, opts...)
}

// newPrioRigWith is newPrioRig with limiter l on fc.
func newPrioRigWith(t *testing.T, l Limiter, fc *clock.Fake, opts ...Option) *prioRig {
	t.Helper()
	r := &prioRig{t: t, fc: fc, done: make(chan prioResult, 64)}
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		r.mu.Lock()
		r.sent = append(r.sent, req.Header.Get("X-Name"))
		r.mu.Unlock()
		return &http.Response{StatusCode: 200, Body: http.NoBody, Request: req}, nil
	})
	opts = append([]Option{WithLimiter(l), WithPriorities(Priorities{})}, opts...)
	r.tr = mustNewTransport(t, base, opts...)
	r.tr.clock = fc
	return r
}

// send sends a request named name of class c on a goroutine of its own;
// its result comes on r.done.
func (r *prioRig) send(ctx context.Context, name string, c Class) {
	req, err := http.NewRequestWithContext(WithClass(ctx, c), http.MethodGet, "http://api.test/v1", nil)
	require.NoError(r.t, err)
	req.Header.Set("X-Name", name)
	go func() {
		resp, err := r.tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		r.done <- prioResult{name, err}
	}()
}

// queued returns how many requests wait in the gate's queue of the key.
func (r *prioRig) queued() int {
	g := r.tr.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	if k := g.keys["api.test"]; k != nil && k.q != nil {
		return k.q.Len()
	}
	return 0
}

func (r *prioRig) waitQueued(n int) {
	r.t.Helper()
	spinUntil(r.t, "requests queued", func() bool { return r.queued() == n })
}

func (r *prioRig) order() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.sent, " ")
}

// step advances the clock by one token's interval, once timers are
// pending (the lead's, and the queued requests' with a deadline or a
// maximum wait), and waits for the request then granted to be sent.
func (r *prioRig) step(timers int, want prioResult) {
	r.t.Helper()
	waitTimers(r.t, r.fc, timers)
	r.fc.Advance(100 * time.Millisecond)
	got := recvWithin(r.t, r.done)
	require.Equal(r.t, want, got)
}

var (
	low  = Class{Priority: PriorityLow}
	high = Class{Priority: PriorityHigh}
)

// TestPrioritiesHighGoesFirst: requests queued behind a lead waiting for
// its token go in priority order once it is granted, each priority in
// arrival order; a high one does not queue behind the lead, it takes its
// turn from the bucket beside it, ahead of everyone queued.
func TestPrioritiesHighGoesFirst(t *testing.T) {
	r := newPrioRig(t)
	ctx := context.Background()
	r.send(ctx, "first", low) // the burst: at once
	require.Equal(t, "first", recvWithin(t, r.done).name)
	r.send(ctx, "L1", low) // the lead: waits 100 ms for the token
	waitTimers(t, r.fc, 1)
	r.send(ctx, "L2", low)
	r.waitQueued(1)
	r.send(ctx, "L3", low)
	r.waitQueued(2)
	r.send(ctx, "N1", Class{})
	r.waitQueued(3)
	r.send(ctx, "H1", high) // goes to the bucket at once, beside L1
	waitTimers(t, r.fc, 2)
	require.Equal(t, 3, r.queued())
	for _, name := range []string{"L1", "H1", "N1", "L2", "L3"} {
		r.step(1, prioResult{name: name})
	}
	require.Equal(t, "first L1 H1 N1 L2 L3", r.order())
	require.Zero(t, r.queued())
}

// TestPrioritiesCancelledWaiterLeavesNoTrace: a queued request whose
// context ends returns the context's error at once, is never sent, and
// the requests behind it go as if it had never come.
func TestPrioritiesCancelledWaiterLeavesNoTrace(t *testing.T) {
	r := newPrioRig(t)
	ctx := context.Background()
	r.send(ctx, "first", low)
	recvWithin(t, r.done)
	r.send(ctx, "L1", low)
	waitTimers(t, r.fc, 1)
	cctx, cancel := context.WithCancel(ctx)
	r.send(cctx, "gone", Class{})
	r.waitQueued(1)
	r.send(ctx, "L2", low)
	r.waitQueued(2)
	cancel()
	got := recvWithin(t, r.done)
	require.Equal(t, "gone", got.name)
	require.ErrorIs(t, got.err, context.Canceled)
	r.waitQueued(1)
	r.step(1, prioResult{name: "L1"})
	r.step(1, prioResult{name: "L2"})
	require.Equal(t, "first L1 L2", r.order())
}

// TestPrioritiesDeadlineEndsInTheQueue: a request queued behind others
// is not refused for what it might wait (a limit that does not bind would
// let them all through at once); it is refused when its deadline ends
// while it waits, as ReasonDeadline with Queued, its Wait what it waited,
// and leaves the queue; a high one with the same deadline goes.
func TestPrioritiesDeadlineEndsInTheQueue(t *testing.T) {
	r := newPrioRig(t)
	ctx := context.Background()
	r.send(ctx, "first", low)
	recvWithin(t, r.done)
	r.send(ctx, "L0", low)
	waitTimers(t, r.fc, 1)
	const ahead = 35 // 3.5 s of the bucket's turns
	for i := range ahead {
		r.send(ctx, "L", low)
		r.waitQueued(i + 1)
	}
	// A deadline in real time too: long enough for the test's own steps.
	dctx, cancel := context.WithDeadline(ctx, r.fc.Now().Add(3*time.Second+50*time.Millisecond))
	defer cancel()
	r.send(dctx, "late", low)
	r.waitQueued(ahead + 1)
	r.send(dctx, "H", high) // to the bucket at once, beside L0
	waitTimers(t, r.fc, 3)  // L0's and H's turns, late's deadline
	r.step(3, prioResult{name: "L0"})
	r.step(2, prioResult{name: "H"})
	for range 28 { // to 3 s
		r.step(2, prioResult{name: "L"})
	}
	waitTimers(t, r.fc, 2)
	r.fc.Advance(50 * time.Millisecond) // late's deadline
	got := recvWithin(t, r.done)
	require.Equal(t, "late", got.name)
	var le *LimitError
	require.ErrorAs(t, got.err, &le)
	require.ErrorIs(t, got.err, ErrRateLimited)
	require.Equal(t, ReasonDeadline, le.Reason)
	require.True(t, le.Queued)
	require.Equal(t, low, le.Class)
	require.GreaterOrEqual(t, le.Wait, 3*time.Second)
	require.Contains(t, le.Error(), "priority low")
	r.fc.Advance(50 * time.Millisecond)
	require.Equal(t, prioResult{name: "L"}, recvWithin(t, r.done))
	for range ahead - 29 {
		r.step(1, prioResult{name: "L"})
	}
}

// TestPrioritiesMaxWaitEndsInTheQueue: a low request displaced by high
// ones that came after it is refused when its maximum wait ends in the
// queue, as ReasonMaxWait with Queued, and leaves the queue; the high
// ones, whose maximum waits count from their own arrival, go.
func TestPrioritiesMaxWaitEndsInTheQueue(t *testing.T) {
	r := newPrioRig(t, WithMaxWait(250*time.Millisecond))
	ctx := context.Background()
	r.send(ctx, "first", low)
	recvWithin(t, r.done)
	r.send(ctx, "L1", low)
	waitTimers(t, r.fc, 1)
	r.send(ctx, "L2", low) // at 0: its maximum wait ends at 250 ms
	r.waitQueued(1)
	waitTimers(t, r.fc, 2)
	r.fc.Advance(50 * time.Millisecond)
	r.send(ctx, "H", high) // at 50 ms: to the bucket at once, its turn at 200 ms
	waitTimers(t, r.fc, 3)
	r.send(ctx, "H", high) // at 50 ms: beside the other (highLeads), its turn at 300 ms
	// The three leads' timers and the queued request's maximum wait.
	waitTimers(t, r.fc, 4)
	r.fc.Advance(50 * time.Millisecond) // t = 100 ms
	require.Equal(t, prioResult{name: "L1"}, recvWithin(t, r.done))
	r.step(3, prioResult{name: "H"}) // t = 200 ms
	waitTimers(t, r.fc, 2)
	r.fc.Advance(50 * time.Millisecond)
	got := recvWithin(t, r.done)
	require.Equal(t, "L2", got.name)
	var le *LimitError
	require.ErrorAs(t, got.err, &le)
	require.Equal(t, ReasonMaxWait, le.Reason)
	require.True(t, le.Queued)
	require.GreaterOrEqual(t, le.Wait, 250*time.Millisecond)
	require.Zero(t, r.queued())
	r.fc.Advance(50 * time.Millisecond)
	require.Equal(t, "H", recvWithin(t, r.done).name)
}

// TestPrioritiesValidate: MinShare out of (0, 0.5] fails New, naming the
// option and the value.
func TestPrioritiesValidate(t *testing.T) {
	for _, share := range []float64{-0.1, 0.6, 1} {
		_, err := New(nil, WithPriorities(Priorities{MinShare: share}))
		require.ErrorIs(t, err, ErrInvalidConfig)
		require.ErrorContains(t, err, "WithPriorities: MinShare")
	}
	_, err := New(nil, WithPriorities(Priorities{}))
	require.NoError(t, err)
}

// TestPrioritiesClassify: a request whose context carries no class is
// classified by Priorities.Classify; the context's class wins over it.
func TestPrioritiesClassify(t *testing.T) {
	classify := func(req *http.Request) Class {
		return Class{Priority: PriorityHigh, Tenant: req.Header.Get("X-Tenant")}
	}
	p := Priorities{Classify: classify}
	req, _ := http.NewRequest(http.MethodGet, "http://api.test/", nil)
	req.Header.Set("X-Tenant", "acme")
	require.Equal(t, Class{Priority: PriorityHigh, Tenant: "acme"}, p.classOf(req))
	req = req.WithContext(WithClass(req.Context(), low))
	require.Equal(t, low, p.classOf(req))
	require.Equal(t, Class{}, (&Priorities{}).classOf(req.WithContext(context.Background())))
	require.Equal(t, "low", Priority(-7).String())
	require.Equal(t, "high", Priority(9).String())
}

// TestPrioritiesObserved: OnQueued is told of a queued request's class
// and wait; a refusal's LimitError carries the class.
func TestPrioritiesObserved(t *testing.T) {
	type seen struct {
		c Class
		d time.Duration
	}
	var mu sync.Mutex
	var waits []seen
	obs := Observer{OnQueued: func(_ string, c Class, d time.Duration) {
		mu.Lock()
		waits = append(waits, seen{c, d})
		mu.Unlock()
	}}
	r := newPrioRig(t, WithObserver(obs))
	ctx := context.Background()
	r.send(ctx, "first", low)
	recvWithin(t, r.done)
	r.send(ctx, "L1", low)
	waitTimers(t, r.fc, 1)
	acme := Class{Priority: PriorityHigh, Tenant: "acme"}
	r.send(ctx, "H1", acme)
	waitTimers(t, r.fc, 2)
	r.step(1, prioResult{name: "L1"})
	r.step(1, prioResult{name: "H1"})
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []seen{{low, 100 * time.Millisecond}, {acme, 200 * time.Millisecond}}, waits)
	require.False(t, errors.Is(nil, ErrRateLimited))
}

// TestPrioritiesKeepTheLeakyBucketsDepth: with a LeakyBucket, the key's
// priority queue holds at most its depth: a low request finding it full
// is refused (ErrQueueFull, Queued); a normal one pushes out the last low
// one, which is refused so, and takes its place.
func TestPrioritiesKeepTheLeakyBucketsDepth(t *testing.T) {
	lb, err := NewLeakyBucket(PerSecond(10), 2)
	require.NoError(t, err)
	fc := clock.NewFake(time.Now())
	lb.clock = fc
	r := newPrioRigWith(t, lb, fc)
	ctx := context.Background()
	r.send(ctx, "first", low) // released at once
	require.Equal(t, prioResult{name: "first"}, recvWithin(t, r.done))
	r.send(ctx, "L0", low) // the lead: its turn in 100 ms
	waitTimers(t, fc, 1)
	r.send(ctx, "L1", low)
	r.waitQueued(1)
	r.send(ctx, "L2", low)
	r.waitQueued(2)
	r.send(ctx, "L3", low)
	got := recvWithin(t, r.done)
	require.Equal(t, "L3", got.name)
	require.ErrorIs(t, got.err, ErrQueueFull)
	var le *LimitError
	require.ErrorAs(t, got.err, &le)
	require.True(t, le.Queued)

	r.send(ctx, "N", Class{})
	got = recvWithin(t, r.done)
	require.Equal(t, "L2", got.name) // pushed out
	require.ErrorIs(t, got.err, ErrQueueFull)
	require.Equal(t, 2, r.queued())
	r.step(1, prioResult{name: "L0"})
	r.step(1, prioResult{name: "N"})
	r.step(1, prioResult{name: "L1"})
	require.Equal(t, "first L0 N L1", r.order())
}

// TestPrioritiesPropertyOnRandomSchedules: on a fake clock, random
// requests of three priorities and three tenants, some cancelled while
// they wait, all arriving in the first moments of a 10/s bucket of burst
// 2: every request is sent once or returns its context's error (none
// cancelled is sent); the sends keep the bucket's bound in every window;
// and while low requests wait behind higher ones, they still get their
// minimum share of the sends.
func TestPrioritiesPropertyOnRandomSchedules(t *testing.T) {
	for seed := range uint64(12) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { prioritySchedule(t, seed) })
	}
}

func prioritySchedule(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	tb, err := NewTokenBucket(PerSecond(10), 2, WithTransitMargin(0))
	require.NoError(t, err)
	fc := clock.NewFake(time.Now())
	tb.clock = fc
	r := newPrioRigWith(t, tb, fc)
	var sendAt []time.Time
	r.tr.base = roundTripFunc(func(req *http.Request) (*http.Response, error) {
		r.mu.Lock()
		r.sent = append(r.sent, req.Header.Get("X-Name"))
		sendAt = append(sendAt, fc.Now())
		r.mu.Unlock()
		return &http.Response{StatusCode: 200, Body: http.NoBody, Request: req}, nil
	})
	const n = 40
	cancels := map[string]context.CancelFunc{}
	cancelAt := map[int][]string{} // step → names
	prio := map[string]Priority{}
	for i := range n {
		name := fmt.Sprintf("r%d", i)
		p := Priority(rng.IntN(3) - 1)
		prio[name] = p
		ctx := context.Background()
		if rng.IntN(5) == 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithCancel(ctx)
			defer cancel()
			cancels[name] = cancel
			at := rng.IntN(30)
			cancelAt[at] = append(cancelAt[at], name)
		}
		r.send(ctx, name, Class{Priority: p, Tenant: fmt.Sprint("t", rng.IntN(3))})
	}
	results := map[string]error{}
	collect := func() {
		for {
			select {
			case res := <-r.done:
				results[res.name] = res.err
			default:
				return
			}
		}
	}
	// Settled: every request is done, queued, or the lead on its timer.
	settled := func() bool {
		collect()
		return len(results)+r.queued()+fc.Timers() >= n
	}
	for step := 0; len(results) < n && step < 1000; step++ {
		for _, name := range cancelAt[step] {
			cancels[name]()
		}
		spinUntil(t, "requests settled", settled)
		fc.Advance(25 * time.Millisecond)
	}
	spinUntil(t, "all requests done", func() bool { collect(); return len(results) == n })

	sent := map[string]bool{}
	for _, name := range r.sent {
		require.False(t, sent[name], "%s sent twice", name)
		sent[name] = true
	}
	for name, err := range results {
		if err != nil {
			require.ErrorIs(t, err, context.Canceled, name)
			require.Contains(t, cancels, name)
			require.False(t, sent[name], "%s returned an error and was sent", name)
		} else {
			require.True(t, sent[name], name)
		}
	}
	// The bucket's bound: at most 2 + 10·d in any window of length d.
	for i := range sendAt {
		for j := i; j < len(sendAt); j++ {
			d := sendAt[j].Sub(sendAt[i]).Seconds()
			require.LessOrEqual(t, float64(j-i+1), 2+10*d+1e-9, "sends %d to %d", i, j)
		}
	}
	// The low share: counted over the sends made while a low request and
	// a higher one were both still to be sent.
	left := map[Priority]int{}
	for _, name := range r.sent {
		left[prio[name]]++
	}
	lows, total := 0, 0
	for _, name := range r.sent {
		if left[PriorityLow] == 0 || left[PriorityNormal]+left[PriorityHigh] == 0 {
			break
		}
		total++
		if prio[name] == PriorityLow {
			lows++
		}
		left[prio[name]]--
	}
	require.GreaterOrEqual(t, lows, total/10-1, "low sends %d of %d", lows, total)
}

// TestPrioritiesTenantsShareTokens: two tenants of one priority, both
// backlogged on a Limits of 1,000 tokens a second, one sending requests
// of 1,000 tokens and the other of 100: each gets half the tokens (within
// one large request), not half the requests.
func TestPrioritiesTenantsShareTokens(t *testing.T) {
	lims, err := NewLimits(BucketOf(Tokens, PerSecond(1000), 1000))
	require.NoError(t, err)
	fc := clock.NewFake(time.Now())
	lims.clock = fc
	tokensOf := func(req *http.Request) Cost {
		n, _ := strconv.Atoi(req.Header.Get("X-Tokens"))
		return Cost{Requests: 1, Tokens: n}
	}
	r := newPrioRigWith(t, lims, fc, WithCosts(tokensOf))
	type sent struct {
		tenant string
		at     time.Time
	}
	var log []sent
	r.tr.base = roundTripFunc(func(req *http.Request) (*http.Response, error) {
		r.mu.Lock()
		log = append(log, sent{req.Header.Get("X-Name"), fc.Now()})
		r.mu.Unlock()
		return &http.Response{StatusCode: 200, Body: http.NoBody, Request: req}, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	send := func(tenant string, tokens int) {
		req, err := http.NewRequestWithContext(WithClass(ctx, Class{Tenant: tenant}), http.MethodGet, "http://api.test/v1", nil)
		require.NoError(t, err)
		req.Header.Set("X-Name", tenant)
		req.Header.Set("X-Tokens", strconv.Itoa(tokens))
		go func() {
			resp, err := r.tr.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			r.done <- prioResult{tenant, err}
		}()
	}
	const heavy, light = 12, 120 // 12,000 tokens each: 24 s of the limit
	n, done := 0, 0
	settled := func() bool {
		for {
			select {
			case res := <-r.done:
				if ctx.Err() == nil {
					require.NoError(t, res.err)
				}
				done++
			default:
				return done+r.queued()+fc.Timers() >= n
			}
		}
	}
	for i := range light {
		if i < heavy {
			send("A", 1000)
			n++
			spinUntil(t, "settled", settled)
		}
		send("B", 100)
		n++
		spinUntil(t, "settled", settled)
	}
	end := fc.Now().Add(8 * time.Second)
	for fc.Now().Before(end) {
		spinUntil(t, "settled", settled)
		fc.Advance(10 * time.Millisecond)
	}
	spinUntil(t, "settled", settled)
	tokens := map[string]int{"A": 0, "B": 0}
	r.mu.Lock()
	for _, s := range log {
		if s.at.Before(end) {
			tokens[s.tenant] += map[string]int{"A": 1000, "B": 100}[s.tenant]
		}
	}
	r.mu.Unlock()
	total := tokens["A"] + tokens["B"]
	require.InDelta(t, 9000, total, 1100, "tokens granted in 8 s (a burst of 1,000 and 1,000/s)")
	require.InDelta(t, tokens["A"], tokens["B"], 1000+0.1*float64(total)/2, "tokens by tenant: %v", tokens)
	t.Logf("tokens in 8 s: %v", tokens)
	cancel() // what is left returns its context's error
	spinUntil(t, "every request returned", func() bool { settled(); return done == n })
}

// TestPrioritiesInTheSharedFallback: a shared limiter whose Redis is down
// grants from its local fallback, and the order holds there too: a normal
// request arriving behind queued low ones goes before them (real time, at
// the fallback's 2/s: the requests queue well within the lead's 500 ms).
func TestPrioritiesInTheSharedFallback(t *testing.T) {
	t.Parallel() // 3.7 s of turns 500 ms apart, on the real clock, mostly waiting
	l, err := NewSharedTokenBucket(deadRedis(t), "prio", PerSecond(2), 1)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	r := newPrioRigWith(t, l, nil)
	r.tr.clock = clock.Real{}
	ctx := context.Background()
	r.send(ctx, "first", low)
	require.NoError(t, recvWithin(t, r.done).err)
	require.True(t, l.Stats().Fallback, "Redis is down: the fallback grants")
	leads := func(n int) func() bool {
		return func() bool {
			g := r.tr.gate
			g.mu.Lock()
			defer g.mu.Unlock()
			k := g.keys["api.test"]
			return k != nil && k.total() == n
		}
	}
	r.send(ctx, "L1", low) // a lead: its turn 500 ms away
	spinUntil(t, "L1 with the limiter", leads(1))
	r.send(ctx, "L2", low) // beside it (fleetLeads): its turn 1 s away
	spinUntil(t, "L2 with the limiter", leads(2))
	r.send(ctx, "L3", low)
	r.waitQueued(1)
	r.send(ctx, "N", Class{})
	r.waitQueued(2)
	for range 4 {
		require.NoError(t, recvWithin(t, r.done).err)
	}
	require.Equal(t, "first L1 L2 N L3", r.order())
}

// TestPrioritiesNoStarvationBesideHighLoops: two callers sending high
// requests in a loop do not keep a normal request from its turn (real
// time, 20/s: it is sent within its 2 s deadline).
func TestPrioritiesNoStarvationBesideHighLoops(t *testing.T) {
	tb, err := NewTokenBucket(PerSecond(20), 1)
	require.NoError(t, err)
	tr := mustNewTransport(t, roundTripFunc(func(req *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: http.NoBody, Request: req}, nil
	}), WithLimiter(tb), WithPriorities(Priorities{}))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	send := func(ctx context.Context, c Class) error {
		req, _ := http.NewRequestWithContext(WithClass(ctx, c), http.MethodGet, "http://api.test/", nil)
		resp, err := tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for send(ctx, high) == nil {
			}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
	defer dcancel()
	require.NoError(t, send(dctx, Class{}), "the normal request got its turn")
	cancel()
	wg.Wait()
}

// TestPrioritiesQueueIsNoRefusal: a hundred requests at once on a window
// with room for them all, with a maximum wait shorter than their work in
// seconds of the window (0.72 s each), are all sent: waiting behind one
// another in the queue is no reason to refuse one.
func TestPrioritiesQueueIsNoRefusal(t *testing.T) {
	lims, err := NewLimits(WindowOf(Requests, 5000, time.Hour))
	require.NoError(t, err)
	tr := mustNewTransport(t, roundTripFunc(func(req *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: http.NoBody, Request: req}, nil
	}), WithLimiter(lims), WithPriorities(Priorities{}), WithMaxWait(2*time.Second))
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodGet, "http://api.test/", nil)
			resp, err := tr.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// TestPrioritiesOnQueuedOnlyAfterAWait: a request granted at once is no
// wait, also through a limiter other than the Transport's own TokenBucket
// (the general path, where the clock is read after the grant).
func TestPrioritiesOnQueuedOnlyAfterAWait(t *testing.T) {
	var called atomic.Int64
	lim, err := NewLimits(BucketOf(Requests, PerSecond(1000), 100))
	require.NoError(t, err)
	tr := mustNewTransport(t, roundTripFunc(func(req *http.Request) (*http.Response, error) {
		time.Sleep(time.Millisecond)
		return &http.Response{StatusCode: 200, Body: http.NoBody, Request: req}, nil
	}), WithLimiter(lim), WithPriorities(Priorities{}),
		WithObserver(Observer{OnQueued: func(string, Class, time.Duration) { called.Add(1) }}))
	for range 20 {
		require.NoError(t, sendClass(context.Background(), tr, high))
	}
	require.Zero(t, called.Load(), "20 requests within the burst: no wait")
}

// TestPrioritiesCostBeyondTheDepth: a request costing more than a leaky
// bucket's queue holds is refused as the bucket refuses it, for its cost
// (ErrCostTooHigh), not as a full queue.
func TestPrioritiesCostBeyondTheDepth(t *testing.T) {
	lb, err := NewLeakyBucket(PerSecond(10), 2)
	require.NoError(t, err)
	tr := mustNewTransport(t, roundTripFunc(func(req *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: http.NoBody, Request: req}, nil
	}), WithLimiter(lb), WithPriorities(Priorities{}), WithCostFunc(func(*http.Request) int { return 3 }))
	err = sendClass(context.Background(), tr, low)
	require.ErrorIs(t, err, ErrCostTooHigh)
	var le *LimitError
	require.ErrorAs(t, err, &le)
	require.Equal(t, low, le.Class)
	require.False(t, le.Queued)
}

// TestPrioritiesPanicInWeight: a Weight that panics panics the request
// that called it, and leaves the gate as it was: the other requests of
// the key go on.
func TestPrioritiesPanicInWeight(t *testing.T) {
	weight := func(tenant string) float64 {
		if tenant == "bad" {
			panic("bad weight")
		}
		return 1
	}
	r := newPrioRig(t, WithPriorities(Priorities{Weight: weight}))
	ctx := context.Background()
	r.send(ctx, "first", low)
	recvWithin(t, r.done)
	r.send(ctx, "L1", low) // the lead
	waitTimers(t, r.fc, 1)
	r.send(ctx, "L2", low)
	r.waitQueued(1)
	req, err := http.NewRequestWithContext(WithClass(ctx, Class{Tenant: "bad"}), http.MethodGet, "http://api.test/v1", nil)
	require.NoError(t, err)
	require.PanicsWithValue(t, "bad weight", func() { _, _ = r.tr.RoundTrip(req) })
	require.Equal(t, 1, r.queued())
	r.send(ctx, "N", Class{})
	r.waitQueued(2)
	r.step(1, prioResult{name: "L1"})
	r.step(1, prioResult{name: "N"})
	r.step(1, prioResult{name: "L2"})
}
