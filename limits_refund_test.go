package egress

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/fakellm"
	"github.com/egress-go/egress/internal/redistest"
	"github.com/egress-go/egress/internal/window"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The step tables below run one key's window of 4,300 tokens per 5 s, a
// small OpenAI tier: an LLM call estimated at 1,030 tokens (its max_tokens
// and prompt) uses about 30, and settles about 0.6 s after its turn.
const (
	refundN   = 4300
	refundW   = 5 * time.Second
	refundEst = 1030
)

type refundOp int

const (
	opNone   refundOp = iota // the clock moves on, nothing more
	opGrant                  // a request of tokens goes at once: a grant in flight
	opSettle                 // the oldest grant in flight settles at tokens
	opAsk                    // a request of tokens with a deadline budget from now, on its own goroutine
	opPlan                   // the plan on the estimates alone (reserve), taking nothing
	opCancel                 // the context of ask is cancelled
)

// refundStep is one step of a schedule on a fake clock: the clock moves on
// by advance, then op happens; ends are the asks that return at this step.
type refundStep struct {
	advance time.Duration
	op      refundOp
	tokens  int
	budget  time.Duration // an ask's deadline, or a plan's, from now
	ask     int           // opCancel: the step of the ask

	refused Reason        // opAsk, opPlan: refused at once for this reason (0: an ask waits)
	wait    time.Duration // the wait the refusal states
	ends    []refundEnd
}

// refundEnd is how an ask, waiting since step ask, returns.
type refundEnd struct {
	ask     int
	waited  time.Duration // granted after waiting this long (and in flight from then)
	refused Reason        // or refused for this reason
	wait    time.Duration // stating this wait
}

// refundSched runs refundSteps on one Limits.
type refundSched struct {
	t       *testing.T
	l       *Limits
	fc      *clock.Fake
	start   time.Time
	flight  []Grant
	asks    map[int]<-chan waited
	cancels map[int]context.CancelFunc
	stated  map[int]time.Duration // the waits the asks refused stated
	waited  map[int]time.Duration // the waits of the asks granted
}

func newRefundSched(t *testing.T) *refundSched {
	l, _ := newLimitsOnFake(t, WindowOf(Tokens, refundN, refundW))
	// The contexts' deadlines are on the real clock: the fake one starts at
	// the real time, and runs ahead of it, so that no deadline passes
	// before the fake clock says so.
	start := time.Now()
	fc := clock.NewFake(start)
	l.clock = fc
	return &refundSched{t: t, l: l, fc: fc, start: start, asks: map[int]<-chan waited{}, cancels: map[int]context.CancelFunc{},
		stated: map[int]time.Duration{}, waited: map[int]time.Duration{}}
}

// run runs steps, numbered from 0 (ask and refundEnd.ask name them).
func (s *refundSched) run(steps []refundStep) {
	t := s.t
	for i, st := range steps {
		where := fmt.Sprintf("step %d at %v", i, s.fc.Now().Add(st.advance).Sub(s.start))
		if st.advance > 0 {
			s.fc.Advance(st.advance)
		}
		cost := Cost{Tokens: st.tokens}
		switch st.op {
		case opGrant:
			g, err := s.l.WaitCost(context.Background(), "k", cost, 0)
			require.NoError(t, err, where)
			require.Zero(t, g.Waited, "%s: goes at once", where)
			s.flight = append(s.flight, g)
		case opSettle:
			require.NotEmpty(t, s.flight, where)
			s.l.Settle(s.flight[0], cost)
			s.flight = s.flight[1:]
		case opPlan:
			_, _, err := s.l.reserve("k", cost, budget{deadline: s.fc.Now().Add(st.budget)})
			checkRefusal(t, err, st.refused, st.wait, where)
		case opAsk:
			ctx, cancel := context.WithCancel(context.Background())
			if st.budget > 0 {
				ctx, cancel = context.WithDeadline(context.Background(), s.fc.Now().Add(st.budget))
			}
			t.Cleanup(cancel)
			ch := waitCostAsync(ctx, s.l, "k", cost)
			if st.refused != 0 {
				r := recvWithin(t, ch)
				checkRefusal(t, r.err, st.refused, st.wait, where)
				var le *LimitError
				if errors.As(r.err, &le) {
					s.stated[i] = le.Wait
				}
				break
			}
			s.asks[i], s.cancels[i] = ch, cancel
		case opCancel:
			s.cancels[st.ask]()
			require.ErrorIs(t, recvWithin(t, s.asks[st.ask]).err, context.Canceled, where)
			delete(s.asks, st.ask)
		}
		for _, e := range st.ends {
			r := recvWithin(t, s.asks[e.ask])
			delete(s.asks, e.ask)
			if e.refused != 0 {
				checkRefusal(t, r.err, e.refused, e.wait, fmt.Sprintf("%s: the ask of step %d", where, e.ask))
				continue
			}
			require.NoError(t, r.err, "%s: the ask of step %d", where, e.ask)
			assert.Equal(t, e.waited, r.g.Waited, "%s: the ask of step %d waited", where, e.ask)
			s.waited[e.ask] = r.g.Waited
			s.flight = append(s.flight, r.g)
		}
		waitTimers(t, s.fc, len(s.asks)) // the asks still waiting are parked
		require.Equal(t, len(s.asks), s.fc.Timers(), "%s: the asks waiting", where)
	}
}

// checkRefusal checks that err is a *LimitError for reason stating wait
// (any wait when wait is negative).
func checkRefusal(t *testing.T, err error, reason Reason, wait time.Duration, where string) {
	t.Helper()
	var le *LimitError
	require.ErrorAs(t, err, &le, where)
	assert.ErrorIs(t, err, ErrRateLimited, where)
	assert.Equal(t, reason, le.Reason, "%s: %v", where, err)
	if wait >= 0 {
		assert.InDelta(t, wait.Seconds(), le.Wait.Seconds(), 0.001, "%s: the wait stated (%v)", where, err)
	}
}

// refundHistory: four calls go at 0 and settle at 30 tokens 0.6 s later;
// then the window is empty again (at 5.6 s), with that history learnt.
func refundHistory(actual int) []refundStep {
	steps := []refundStep{
		{op: opGrant, tokens: refundEst}, {op: opGrant, tokens: refundEst},
		{op: opGrant, tokens: refundEst}, {op: opGrant, tokens: refundEst},
		{advance: 600 * time.Millisecond, op: opSettle, tokens: actual},
	}
	for range 3 {
		steps = append(steps, refundStep{op: opSettle, tokens: actual})
	}
	return append(steps, refundStep{advance: 5 * time.Second}) // the history has left the window
}

// TestLimitsRefundQueuesOnExpectedSettle: with four calls of 1,030 in
// flight, the window is full for 5 s on their estimates. A call with a
// 2 s deadline was refused at once (ReasonDeadline, a wait of 5 s: the
// plan on the estimates). Now the key's calls have been settling at about
// 30 tokens 0.6 s after their turn: the call waits, and goes as soon as
// the first refund makes room.
func TestLimitsRefundQueuesOnExpectedSettle(t *testing.T) {
	s := newRefundSched(t)
	steps := append(refundHistory(30), refundFull...) // at 5.6 s, four calls in flight
	ask := len(steps) + 1
	s.run(append(steps,
		// What the plan on the estimates says, and WaitCost said before.
		refundStep{op: opPlan, tokens: refundEst, budget: 2 * time.Second, refused: ReasonDeadline, wait: refundW},
		refundStep{op: opAsk, tokens: refundEst, budget: 2 * time.Second}, // ask: it waits
		refundStep{advance: 300 * time.Millisecond},                       // no refund yet: still waiting
		// The first call in flight settles at 31: 31 + 3·1,030 + 1,030 fit.
		refundStep{advance: 300 * time.Millisecond, op: opSettle, tokens: 31, ends: []refundEnd{{ask: ask, waited: 600 * time.Millisecond}}},
	))
}

// refundFull: four calls go at once and fill the window on their
// estimates (4,120 of 4,300).
var refundFull = []refundStep{
	{op: opGrant, tokens: refundEst}, {op: opGrant, tokens: refundEst},
	{op: opGrant, tokens: refundEst}, {op: opGrant, tokens: refundEst},
}

// TestLimitsRefundRefusedWhenSettlesRunFull: the same schedule, but the
// key's calls have been settling at their full estimate: no refund is to
// be expected, and the call is refused at once, stating the plan's wait.
func TestLimitsRefundRefusedWhenSettlesRunFull(t *testing.T) {
	s := newRefundSched(t)
	steps := append(refundHistory(refundEst), refundFull...)
	s.run(append(steps, refundStep{op: opAsk, tokens: refundEst, budget: 2 * time.Second, refused: ReasonDeadline, wait: refundW}))

	// Nor when most settle in full: the ratio learnt (0.81) leaves the four
	// calls in flight 3,332 tokens once settled, and no room for 1,030
	// before they leave the window.
	s = newRefundSched(t)
	steps = nil
	for _, actual := range []int{1030, 1030, 1030, 30, 1030, 1030, 1030, 30} {
		steps = append(steps, refundStep{op: opGrant, tokens: refundEst},
			refundStep{advance: 600 * time.Millisecond, op: opSettle, tokens: actual},
			refundStep{advance: refundW})
	}
	steps = append(steps, refundFull...)
	s.run(append(steps, refundStep{op: opAsk, tokens: refundEst, budget: 2 * time.Second, refused: ReasonDeadline, wait: refundW}))
}

// TestLimitsRefundStatedWaitIsReal: a refusal states the wait under the
// expectation, and it is within 25% of the real time until capacity: a
// request that asks instead without a deadline, from the same place in
// the queue, waits that long as the calls in flight settle (a little
// later and higher than the history). The plan on the estimates would
// have stated 5 s.
func TestLimitsRefundStatedWaitIsReal(t *testing.T) {
	s := newRefundSched(t)
	var steps []refundStep
	// A history of settlements from 0.5 to 0.7 s after the turn, at 20 to
	// 40 tokens: 0.556 s and 2.8% on average.
	for _, h := range []struct {
		after  time.Duration
		actual int
	}{{500, 20}, {700, 40}, {600, 30}, {550, 25}, {650, 35}, {600, 30}} {
		steps = append(steps, refundStep{op: opGrant, tokens: refundEst},
			refundStep{advance: h.after * time.Millisecond, op: opSettle, tokens: h.actual},
			refundStep{advance: refundW})
	}
	steps = append(steps, refundFull...)
	waiter, refused, probe := len(steps), len(steps)+2, len(steps)+3
	s.run(append(steps,
		refundStep{op: opAsk, tokens: refundEst, budget: 6 * time.Second}, // waiter: behind the four, within 6 s
		// The plan on the estimates: 5 s, when the four leave the window.
		refundStep{op: opPlan, tokens: refundEst, budget: 100 * time.Millisecond, refused: ReasonDeadline, wait: refundW},
		// The request with 100 ms is refused, stating the wait expected:
		// the four settle, the waiter goes, and there is room.
		refundStep{op: opAsk, tokens: refundEst, budget: 100 * time.Millisecond, refused: ReasonDeadline, wait: -1},
		// The real time until capacity: the same request without a
		// deadline, from the same place, as the calls settle a little
		// higher than they did, one a little late.
		refundStep{op: opAsk, tokens: refundEst}, // probe
		refundStep{advance: 500 * time.Millisecond, op: opSettle, tokens: 45, ends: []refundEnd{{ask: waiter, waited: 500 * time.Millisecond}}},
		refundStep{advance: 100 * time.Millisecond, op: opSettle, tokens: 38, ends: []refundEnd{{ask: probe, waited: 600 * time.Millisecond}}},
	))
	stated, real := s.stated[refused], s.waited[probe]
	t.Logf("stated %v, real %v; the plan on the estimates %v", stated, real, refundW)
	assert.InDelta(t, 1, stated.Seconds()/real.Seconds(), 0.25, "the stated wait %v within 25%% of the real %v", stated, real)
}

// TestLimitsRefundProviderCountWait: a 429 whose Retry-After is 0.52 s
// and whose count of tokens is 0 until its reset in 3 s (a window server)
// holds the key 0.52 s and caps the window until 3 s. A request refused
// for its max wait states the 3 s the count and its reset imply, not the
// hold's 0.52 s, and a request without a budget does wait 3 s. A bucket
// server's count (OpenAI's) comes back as it refills: 1,030 of 4,300 in
// 0.75 s, an eighth every 0.375 s, and the refusal states that.
func TestLimitsRefundProviderCountWait(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind ResetKind
		wait time.Duration
	}{
		{"unknown", ResetKindUnknown, 3 * time.Second},
		{"window", ResetKindWindow, 3 * time.Second},
		{"bucket", ResetKindBucket, 750 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, fc := newLimitsOnFake(t, WindowOf(Requests, 5000, refundW), WindowOf(Tokens, refundN, refundW))
			now := fc.Now()
			d := l.Learn(context.Background(), "k", Signal{Now: now, SentAt: now, Status: 429,
				RetryAfter: 520 * time.Millisecond, HasRetryAfter: true, Quotas: []Quota{
					{Dimension: Tokens, Remaining: 0, HasRemaining: true, Reset: 3 * time.Second, HasReset: true, Kind: tc.kind},
				}})
			require.Equal(t, now.Add(520*time.Millisecond), d.Hold, "the Retry-After holds the key")
			cost := Cost{Requests: 1, Tokens: refundEst}
			_, err := l.WaitCost(context.Background(), "k", cost, 300*time.Millisecond)
			checkRefusal(t, err, ReasonMaxWait, tc.wait, "max wait 0.3 s")
			var le *LimitError
			require.ErrorAs(t, err, &le)
			assert.Equal(t, refundEst, le.Cost, "the tokens bind, not the hold")

			// The real time until capacity.
			w, _, err := reserveIn(t, l, "k", cost, budget{})
			require.NoError(t, err)
			assert.Equal(t, tc.wait, w)
		})
	}
}

// limitsTrace is what a Limits holds of key k that a request leaves
// behind: each window's grants, its settlements learnt and its grants in
// flight, and the waiters.
func limitsTrace(l *Limits) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := fmt.Sprintf("waiters %d", len(l.waiters))
	for i := range l.limits {
		st, ok := l.states[i].M["k"]
		if !ok {
			continue
		}
		var es []string
		for j := st.log.First; j < len(st.log.At); j++ {
			es = append(es, fmt.Sprintf("%v:%d", st.log.At[j].Sub(limiterEpoch), st.log.Cost[j]))
		}
		open := slices.Clone(st.open)
		slices.SortFunc(open, func(a, b window.OpenGrant) int { return a.At.Compare(b.At) })
		s += fmt.Sprintf("; limit %d: sum %d log %v settled %+v open %v", i, st.log.Sum, es, st.settled, open)
	}
	return s
}

// TestLimitsRefundCancelLeavesNoTrace: a request waiting on the
// expectation, past its budget, gives everything back when its context is
// cancelled, and when the refunds do not come by the end of its budget
// (5 ms before its deadline) it is refused with a *LimitError, never left
// waiting past it, and leaves no trace either.
func TestLimitsRefundCancelLeavesNoTrace(t *testing.T) {
	s := newRefundSched(t)
	s.run(append(append(refundHistory(30), refundFull...), refundStep{advance: 100 * time.Millisecond}))
	before := limitsTrace(s.l)
	s.run([]refundStep{
		{op: opAsk, tokens: refundEst, budget: 2 * time.Second}, // waits on the expectation
		{advance: 100 * time.Millisecond, op: opCancel, ask: 0},
	})
	assert.Equal(t, before, limitsTrace(s.l), "cancelled: nothing left of it")

	// The calls in flight do not settle: at 2 s less 5 ms the request is
	// refused, stating the wait it needed from its arrival (the plan on
	// the estimates, now that the refunds it expected are overdue).
	s.run([]refundStep{
		{op: opAsk, tokens: refundEst, budget: 2 * time.Second},
		{advance: 1994 * time.Millisecond},
		{advance: time.Millisecond, ends: []refundEnd{{ask: 0, refused: ReasonDeadline, wait: refundW - 200*time.Millisecond}}},
	})
	assert.Equal(t, before, limitsTrace(s.l), "refused at its budget's end: nothing left of it")
}

// TestRealTimeRefundLLM: refunds planned for, end to end in real time. 8
// workers stream chat completions (max_tokens 1,000, about 30 tokens of
// output, settled about 0.6 s after they go) with a 6 s deadline each,
// through a Transport with WithCosts(LLMCost) and a window of 4,300
// tokens per 5 s, against internal/fakellm enforcing the same (OpenAI's
// rule: a token bucket that reserves input + max_tokens up front), for
// 9 s. Planned on the estimates alone, most calls were refused at once,
// stating about 8 s; planned on the refunds to come, they wait for them:
// at least 90% complete within their deadline, and the provider refuses
// none after the first second. A probe asks now and then with a 50 ms
// deadline; when refused, it asks again at once without one, and the
// wait the refusal stated is compared with the wait that request had
// (the figures are in the log).
func TestRealTimeRefundLLM(t *testing.T) {
	t.Parallel() // a loose wall-clock suite: see wallclock in the Makefile
	lim, err := NewLimits(WindowOf(Tokens, refundN, refundW))
	require.NoError(t, err)
	runRefundLLM(t, []CostLimiter{lim})
}

// TestRealTimeRefundLLMShared: the same with a SharedLimits, two
// instances of four workers each on one Redis (sharedlimits_expect.go):
// before, 71 of 78 calls were refused at once, stating 7–9 s.
func TestRealTimeRefundLLMShared(t *testing.T) {
	t.Parallel() // a loose wall-clock suite: see wallclock in the Makefile
	srv := redistest.Start(t)
	var lims []CostLimiter
	for range 2 {
		lims = append(lims, newSharedLimits(t, srv.Client(t), "refund", []Limit{WindowOf(Tokens, refundN, refundW)}))
	}
	runRefundLLM(t, lims)
}

// runRefundLLM runs the scenario of TestRealTimeRefundLLM with the workers
// spread over lims, one Transport each; the probe asks lims[0].
func runRefundLLM(t *testing.T, lims []CostLimiter) {
	const (
		workers  = 8
		deadline = 6 * time.Second
		run      = 9 * time.Second
	)
	llm, err := fakellm.New(fakellm.Config{TPM: refundN, Minute: refundW, Latency: 100 * time.Millisecond,
		Chunks: 10, ChunkDelay: 50 * time.Millisecond, Seed: 1,
		Output: func(u float64, _ int) int { return 25 + int(u*10) }})
	require.NoError(t, err)
	srv := httptest.NewServer(llm)
	defer srv.Close()
	base := http.DefaultTransport.(*http.Transport).Clone()
	defer base.CloseIdleConnections()

	start := time.Now()
	var mu sync.Mutex
	var calls, done, late429 int
	reasons := map[string]int{}
	probe := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := base.RoundTrip(req)
		if err == nil && resp.StatusCode == http.StatusTooManyRequests && time.Since(start) > time.Second {
			mu.Lock()
			late429++
			mu.Unlock()
		}
		return resp, err
	})
	var clients []*http.Client
	for _, lim := range lims {
		tr, err := New(probe, WithLimiter(lim), WithCosts(LLMCost), WithRetry(RetryPolicy{}))
		require.NoError(t, err)
		clients = append(clients, &http.Client{Transport: tr})
	}
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":1000,"stream":true}`)
	newReq := func(ctx context.Context) *http.Request {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+fakellm.ChatCompletionsPath, bytes.NewReader(body))
		require.NoError(t, err)
		return req
	}

	var wg sync.WaitGroup
	for w := range workers {
		client := clients[w%len(clients)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < run {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				resp, err := client.Do(newReq(ctx))
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					if err == nil && resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				cancel()
				var le *LimitError
				mu.Lock()
				calls++
				switch {
				case err == nil:
					done++
				case errors.As(err, &le):
					reasons[le.Reason.String()]++
				default:
					reasons[err.Error()]++
				}
				mu.Unlock()
				if le != nil {
					time.Sleep(min(le.Wait, time.Second)) // as told, within reason
				}
			}
		}()
	}

	// The probe: the wait a refusal states, against the real one.
	type stated struct{ stated, real time.Duration }
	var probes []stated
	key := srv.Listener.Addr().String()
	cost := LLMCost(newReq(context.Background()))
	lim := lims[0]
	for at := 1500 * time.Millisecond; at < run-time.Second; at += 700 * time.Millisecond {
		time.Sleep(time.Until(start.Add(at)))
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		g, err := lim.WaitCost(ctx, key, cost, 0)
		cancel()
		var le *LimitError
		if !errors.As(err, &le) {
			lim.Settle(g, Cost{}) // it went: not sent, given back
			continue
		}
		ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
		g, err = lim.WaitCost(ctx, key, cost, 0)
		cancel()
		require.NoError(t, err)
		lim.Settle(g, Cost{})
		probes = append(probes, stated{le.Wait, g.Waited})
	}
	wg.Wait()

	share := float64(done) / float64(calls)
	st := llm.Stats()
	t.Logf("calls %d, completed within their deadline %d (%.1f%%), not: %v; 429s after 1 s: %d; provider accepted %d, refused %d, peak %d of %d",
		calls, done, 100*share, reasons, late429, st.Accepted, st.Refused, st.TPM.Peak, st.TPM.Limit)
	var ratios []float64
	for _, p := range probes {
		t.Logf("probe: stated %v, real %v", p.stated.Round(time.Millisecond), p.real.Round(time.Millisecond))
		if p.real > 0 {
			ratios = append(ratios, p.stated.Seconds()/p.real.Seconds())
		}
	}
	assert.GreaterOrEqual(t, share, 0.9, "calls completed within their deadline")
	assert.Zero(t, late429, "429s after the first second")
	if len(ratios) > 0 {
		slices.Sort(ratios)
		t.Logf("stated/real: %.2f", ratios)
		assert.InDelta(t, 1, ratios[len(ratios)/2], 0.25, "the median stated wait within 25%% of the real")
	}
}

// TestLimitsRefundBoundProperties: random schedules of requests with
// deadlines or maximum waits, refunds mostly far below the estimate, and
// cancellations, on windows, on a fake clock, driven synchronously as
// WaitCost drives them (a request refused on the estimates waits on the
// expectation when it fits; a waiter goes when the clock reaches its
// turn, and one waiting on the expectation gives its turn back at its
// budget's end). Every request that went did within its budget; every one
// that gave up was refused with a *LimitError stating a wait beyond it;
// and in the end every window holds at most n of the actual costs at the
// final turns: the expectation never took a turn the windows did not
// allow.
func TestLimitsRefundBoundProperties(t *testing.T) {
	t.Parallel() // on a fake clock, CPU alone
	const schedules, steps = 500, 120
	keys := []string{"h/a", "h/b"}
	var late, lateWent, gaveUp int
	for sch := range schedules {
		rng := rand.New(rand.NewPCG(17, uint64(sch)))
		limits := []Limit{WindowOf(Tokens, 2000+rng.IntN(3000), time.Duration(500+rng.IntN(1500))*time.Millisecond)}
		if rng.IntN(2) == 0 {
			limits = append(limits, WindowOf(Requests, 3+rng.IntN(10), time.Duration(200+rng.IntN(1000))*time.Millisecond).Parent(HostOf))
		}
		l, fc := newLimitsOnFake(t, limits...)
		type req struct {
			key         string
			est, actual Cost
			arrival, at time.Time
			b           budget
			end         time.Time
			w           *limitsWaiter
			late        bool
			went, gone  bool
			settled     bool
		}
		var reqs []*req
		where := func(step int) string { return fmt.Sprintf("schedule %d step %d (limits %v)", sch, step, limits) }
		for step := range steps {
			fc.Advance(time.Duration(rng.IntN(60)) * time.Millisecond)
			now := fc.Now()
			l.mu.Lock()
			for _, r := range reqs {
				if r.w == nil {
					continue
				}
				r.at = r.w.at
				beyond := r.b.refuse(r.arrival, r.key, 0, r.at.Sub(r.arrival)) != nil
				switch {
				case r.late && beyond && !now.Before(r.end):
					e := l.giveUpLocked(r.w, Grant{Key: r.key, Cost: r.est}, r.b, r.arrival, now)
					require.NotNil(t, e, where(step))
					// The wait stated is beyond the budget, or its end (the
					// turn came as the budget ended).
					require.GreaterOrEqual(t, e.Wait, r.end.Sub(r.arrival), "%s: gave up stating %v", where(step), e)
					r.w, r.gone, r.actual = nil, true, Cost{}
					gaveUp++
				case !r.at.After(now):
					l.unwait(r.w)
					l.openLocked(Grant{Key: r.key, Cost: r.est, At: r.at})
					r.w, r.went = nil, true
					if r.late {
						lateWent++
					}
				}
			}
			l.mu.Unlock()
			switch op := rng.IntN(20); {
			case op < 10: // a request
				key := keys[rng.IntN(len(keys))]
				est := Cost{Requests: 1, Tokens: 100 + rng.IntN(1000)}
				b := budget{maxWait: time.Duration(50+rng.IntN(2000)) * time.Millisecond}
				if rng.IntN(2) == 0 {
					b = budget{deadline: now.Add(time.Duration(50+rng.IntN(2000)) * time.Millisecond)}
				}
				l.mu.Lock()
				g, now, err := l.reserveLocked(key, est, b)
				isLate := false
				if err != nil {
					g, isLate, err = l.reserveExpectingLocked(key, est, b, now, err)
				}
				if err != nil {
					l.mu.Unlock()
					var le *LimitError
					require.ErrorAs(t, err, &le, where(step))
					continue
				}
				r := &req{key: key, est: est, actual: est, arrival: now, at: g.At, b: b, late: isLate, end: b.end(now, isLate)}
				if isLate {
					late++
					require.NotNil(t, b.refuse(now, key, 0, g.At.Sub(now)), "%s: waits on the expectation, its turn beyond its budget", where(step))
				}
				if g.At.After(now) {
					l.seq++
					r.w = &limitsWaiter{key: key, cost: est, at: g.At, seq: l.seq, moved: make(chan struct{}, 1)}
					l.waiters = append(l.waiters, r.w)
				} else {
					r.went = true
				}
				l.mu.Unlock()
				reqs = append(reqs, r)
			case op < 17: // a response: mostly far below the estimate, sometimes in full
				var flight []*req
				for _, r := range reqs {
					if r.went && !r.settled {
						flight = append(flight, r)
					}
				}
				if len(flight) == 0 {
					continue
				}
				r := flight[rng.IntN(len(flight))]
				actual := Cost{Requests: 1, Tokens: 1 + rng.IntN(r.est.Tokens/10)}
				if rng.IntN(5) == 0 {
					actual.Tokens = r.est.Tokens
				}
				l.Settle(Grant{Key: r.key, Cost: r.est, At: r.at}, actual)
				r.actual, r.settled = actual, true
			default: // a waiter's context ends
				var waiting []*req
				for _, r := range reqs {
					if r.w != nil {
						waiting = append(waiting, r)
					}
				}
				if len(waiting) == 0 {
					continue
				}
				r := waiting[rng.IntN(len(waiting))]
				l.mu.Lock()
				l.unwait(r.w)
				r.at = r.w.at
				l.cancelLocked(Grant{Key: r.key, Cost: r.est, At: r.at}, fc.Now())
				l.mu.Unlock()
				r.w, r.gone, r.actual = nil, true, Cost{}
			}
		}
		l.mu.Lock()
		for _, r := range reqs {
			if r.w != nil {
				r.at = r.w.at
			}
			if r.went {
				require.Nil(t, r.b.refuse(r.arrival, r.key, 0, r.at.Sub(r.arrival)), "%s: went %v after its arrival, beyond its budget", where(steps), r.at.Sub(r.arrival))
			}
		}
		l.mu.Unlock()
		for _, lim := range limits {
			for _, a := range reqs {
				if a.gone {
					continue
				}
				sum := 0
				for _, b := range reqs {
					if !b.gone && lim.key(b.key) == lim.key(a.key) && !b.at.After(a.at) && b.at.After(a.at.Add(-lim.w)) {
						sum += b.actual.Of(lim.dim)
					}
				}
				require.LessOrEqual(t, sum, lim.n, "%s: %v in the window ending at %v of %s", where(steps), lim, a.at, lim.key(a.key))
			}
		}
	}
	t.Logf("waited on the expectation %d: went %d, gave up %d", late, lateWent, gaveUp)
	require.Greater(t, lateWent, schedules/10, "the schedules exercise the expectation")
	require.Greater(t, gaveUp, 0, "and its failures")
}
