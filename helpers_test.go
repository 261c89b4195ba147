package egress

// The test helpers that more than one file uses: one recording server, one
// observer recorder, one body spy, one way to wait for a fake clock's
// timers, and the constructors of limiters and transports the tests share.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/control"
)

// promptBound is how soon a call that must not wait has to return. The calls
// measured against it take microseconds; the margin is for a loaded 2-core
// machine under -race.
const promptBound = 50 * time.Millisecond

// rtyPromptly bounds a call that must return without waiting but makes a
// round trip to a local server, on a busy machine. Idle, it is a few
// milliseconds; with the machine shared by other -race runs, 300 ms has been
// seen once.
const rtyPromptly = 250 * time.Millisecond

// limiterEpoch is where the fake clocks of the limiter tests start.
var limiterEpoch = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// ---- the recording server ----

// recServer is an httptest server on 127.0.0.1 that counts the requests it
// receives and records, at the server, when each arrived and what it
// carried. It answers the n-th request (n from 1, in order of arrival) as
// its script says; without a script, with status (200 unless set).
type recServer struct {
	*httptest.Server
	script func(n int, w http.ResponseWriter, r *http.Request)
	status atomic.Int32

	mu   sync.Mutex
	hits []srvHit // guarded by mu
}

// srvHit is one request as the server saw it.
type srvHit struct {
	at     time.Time
	method string
	uri    string // the request URI on the wire: path and query
	host   string
	header http.Header
	body   string
}

// newRecServer starts a recServer answering with script (nil: with status).
func newRecServer(t *testing.T, script func(n int, w http.ResponseWriter, r *http.Request)) *recServer {
	t.Helper()
	s := &recServer{script: script}
	s.status.Store(http.StatusOK)
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		s.Client().CloseIdleConnections()
		s.Close()
	})
	return s
}

// newMemServer is a recServer that no socket reaches: its requests go
// through the RoundTripper that memBase returns, which calls the handler
// in the caller's goroutine. It serves tests inside a testing/synctest
// bubble, whose clock moves only while every goroutine in it waits on
// something of the bubble's (which a network socket is not).
func newMemServer(t *testing.T, script func(n int, w http.ResponseWriter, r *http.Request)) *recServer {
	t.Helper()
	s := &recServer{script: script, Server: &httptest.Server{URL: "http://api.test"}}
	s.status.Store(http.StatusOK)
	return s
}

// memBase returns a RoundTripper that hands each request straight to the
// server's handler and returns what it wrote.
func (s *recServer) memBase() http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		in := req.Clone(req.Context())
		in.RequestURI = req.URL.RequestURI()
		if in.Host == "" {
			in.Host = req.URL.Host
		}
		if in.Body == nil {
			in.Body = http.NoBody
		}
		w := httptest.NewRecorder()
		s.serve(w, in)
		if req.Body != nil {
			req.Body.Close()
		}
		resp := w.Result()
		resp.Request = req
		return resp, nil
	})
}

// roundTripFunc is a RoundTripper that is a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

func (s *recServer) serve(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	body, err := io.ReadAll(r.Body)
	if err != nil {
		body = append(body, "<read error: "+err.Error()+">"...)
	}
	s.mu.Lock()
	s.hits = append(s.hits, srvHit{
		at: at, method: r.Method, uri: r.RequestURI, host: r.Host,
		header: r.Header.Clone(), body: string(body),
	})
	n := len(s.hits)
	s.mu.Unlock()
	if s.script != nil {
		s.script(n, w, r)
		return
	}
	w.WriteHeader(int(s.status.Load()))
}

// arrivals returns a copy of what the server has received so far.
func (s *recServer) arrivals() []srvHit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]srvHit(nil), s.hits...)
}

func (s *recServer) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.hits)
}

// host is the server's host:port, the default key of its requests.
func (s *recServer) host() string {
	u, err := url.Parse(s.URL)
	if err != nil {
		panic(err)
	}
	return u.Host
}

// base returns the server's own client transport, closed with the server.
func (s *recServer) base() http.RoundTripper { return s.Client().Transport }

// pooled returns a fresh transport to s that keeps enough idle connections
// for concurrent senders not to dial for each request; its idle
// connections are closed with the test (before the server closes).
func (s *recServer) pooled(t *testing.T) *http.Transport {
	t.Helper()
	base := s.Client().Transport.(*http.Transport).Clone()
	base.MaxIdleConnsPerHost = 64
	t.Cleanup(base.CloseIdleConnections)
	return base
}

// released returns a releaseLog that sends to s through a pooled transport.
func (s *recServer) released(t *testing.T) *releaseLog {
	return &releaseLog{next: s.pooled(t)}
}

// times returns the arrival times at the server, in order.
func (s *recServer) times() []time.Time {
	var at []time.Time
	for _, a := range s.arrivals() {
		at = append(at, a.at)
	}
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	return at
}

// seqOrder returns the X-Seq headers in the order the server received them.
func (s *recServer) seqOrder() []int {
	all := s.arrivals()
	slices.SortStableFunc(all, func(a, b srvHit) int { return a.at.Compare(b.at) })
	var order []int
	for _, a := range all {
		if seq, err := strconv.Atoi(a.header.Get("X-Seq")); err == nil {
			order = append(order, seq)
		}
	}
	return order
}

// rtyAnswer is one scripted reply: a status and headers, as key, value
// pairs.
type rtyAnswer struct {
	status int
	header []string
}

func rtyA(status int, header ...string) rtyAnswer { return rtyAnswer{status: status, header: header} }

// rtyScript answers the n-th request with answers[n-1], and every request
// after the last answer with the last one. The body names the attempt and
// the status, so that a caller can tell which response it got.
func rtyScript(answers ...rtyAnswer) func(int, http.ResponseWriter, *http.Request) {
	return func(n int, w http.ResponseWriter, _ *http.Request) {
		a := answers[min(n, len(answers))-1]
		for i := 0; i+1 < len(a.header); i += 2 {
			w.Header().Add(a.header[i], a.header[i+1])
		}
		w.WriteHeader(a.status)
		fmt.Fprintf(w, "attempt %d: %d", n, a.status)
	}
}

// releaseLog is a base RoundTripper that records when each request left the
// Transport, and its X-Seq header, then hands it to next.
type releaseLog struct {
	next http.RoundTripper

	mu   sync.Mutex
	at   []time.Time // guarded by mu
	seqs []int       // guarded by mu; -1 when the request had no X-Seq
}

func (l *releaseLog) RoundTrip(req *http.Request) (*http.Response, error) {
	now := time.Now()
	seq, err := strconv.Atoi(req.Header.Get("X-Seq"))
	if err != nil {
		seq = -1
	}
	l.mu.Lock()
	l.at = append(l.at, now)
	l.seqs = append(l.seqs, seq)
	l.mu.Unlock()
	return l.next.RoundTrip(req)
}

// times returns the release times, in order.
func (l *releaseLog) times() []time.Time {
	l.mu.Lock()
	at := slices.Clone(l.at)
	l.mu.Unlock()
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	return at
}

// release returns the time seq was released, and whether it was.
func (l *releaseLog) release(seq int) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i := slices.Index(l.seqs, seq); i >= 0 {
		return l.at[i], true
	}
	return time.Time{}, false
}

// seqOrder returns the X-Seq of the released requests, in release order.
func (l *releaseLog) seqOrder() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	idx := make([]int, len(l.at))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return l.at[a].Compare(l.at[b]) })
	var order []int
	for _, i := range idx {
		if l.seqs[i] >= 0 {
			order = append(order, l.seqs[i])
		}
	}
	return order
}

// ---- the observer recorder ----

// obsRecorder is an Observer that records the calls of its hooks.
type obsRecorder struct {
	mu        sync.Mutex
	waits     []obsWait
	rejects   []obsReject
	sents     []obsSent
	retries   []obsRetry
	cooldowns []obsCooldown
	exhausted []string
	rates     []rateChange
}

// rateChange is one call of Observer.OnRateChange.
type rateChange struct {
	key      string
	old, new Rate
	why      string
}

type obsWait struct {
	key    string
	waited time.Duration
}

type obsReject struct {
	key string
	err error
}

type obsSent struct {
	key             string
	attempt, status int
	err             error
}

// obsRetry is one call of Observer.OnRetry.
type obsRetry struct {
	key     string
	attempt int
	delay   time.Duration
	status  int
	err     bool
}

// obsCooldown is one call of Observer.OnCooldown.
type obsCooldown struct {
	key   string
	until time.Time
	err   error
}

// summary says how many requests waited and how long (the mean and the
// longest), the holds and the retries recorded: where a run's time went.
func (r *obsRecorder) summary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var sum, most time.Duration
	for _, w := range r.waits {
		sum += w.waited
		most = max(most, w.waited)
	}
	mean := time.Duration(0)
	if len(r.waits) > 0 {
		mean = sum / time.Duration(len(r.waits))
	}
	return fmt.Sprintf("%d waited (mean %v, longest %v), %d holds, %d retries", len(r.waits),
		mean.Round(time.Millisecond), most.Round(time.Millisecond), len(r.cooldowns), len(r.retries))
}

func (r *obsRecorder) observer() Observer {
	return Observer{
		OnWait: func(key string, d time.Duration) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.waits = append(r.waits, obsWait{key, d})
		},
		OnReject: func(key string, err error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.rejects = append(r.rejects, obsReject{key, err})
		},
		OnSent: func(key string, attempt, status int, err error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.sents = append(r.sents, obsSent{key, attempt, status, err})
		},
		OnRetry: func(key string, attempt int, delay time.Duration, status int, err error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.retries = append(r.retries, obsRetry{key, attempt, delay, status, err != nil})
		},
		OnCooldown: func(key string, until time.Time, err error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.cooldowns = append(r.cooldowns, obsCooldown{key, until, err})
		},
		OnBudgetExhausted: func(key string) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.exhausted = append(r.exhausted, key)
		},
		OnRateChange: func(key string, old, new Rate, why string) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.rates = append(r.rates, rateChange{key, old, new, why})
		},
	}
}

// rateLog returns the rate changes recorded so far.
func (r *obsRecorder) rateLog() []rateChange {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]rateChange(nil), r.rates...)
}

// snapshot returns copies of the waits, rejects and sends recorded so far.
func (r *obsRecorder) snapshot() ([]obsWait, []obsReject, []obsSent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.waits), slices.Clone(r.rejects), slices.Clone(r.sents)
}

// retryLog returns copies of the retries, the (attempt, status) of each
// send, and the keys whose retry budget ran out.
func (r *obsRecorder) retryLog() (retries []obsRetry, sent [][2]int, exhausted []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.sents {
		sent = append(sent, [2]int{s.attempt, s.status})
	}
	return slices.Clone(r.retries), sent, slices.Clone(r.exhausted)
}

// coolLog returns copies of the cooldowns, the errors of the rejects and the
// waits.
func (r *obsRecorder) coolLog() (pauses []obsCooldown, rejects []error, waits []time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.rejects {
		rejects = append(rejects, e.err)
	}
	for _, w := range r.waits {
		waits = append(waits, w.waited)
	}
	return slices.Clone(r.cooldowns), rejects, waits
}

// ---- the body spy ----

// spyBody is a request or response body that records what was done to it:
// the bytes read, whether it reached EOF, and how many times it was closed.
type spyBody struct {
	r      io.Reader
	read   atomic.Int64
	eof    atomic.Bool
	closes atomic.Int32
}

func newSpyBody(s string) *spyBody { return &spyBody{r: strings.NewReader(s)} }

func (b *spyBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.read.Add(int64(n))
	if err == io.EOF {
		b.eof.Store(true)
	}
	return n, err
}

func (b *spyBody) Close() error { b.closes.Add(1); return nil }

// closed reports whether the body was closed.
func (b *spyBody) closed() bool { return b.closes.Load() > 0 }

// newSpyPost returns a POST to target with a spy body.
func newSpyPost(t *testing.T, ctx context.Context, target, body string) (*http.Request, *spyBody) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, nil)
	require.NoError(t, err)
	b := newSpyBody(body)
	req.Body, req.ContentLength = b, int64(len(body))
	return req, b
}

// newPlainGet returns a GET to target.
func newPlainGet(t *testing.T, ctx context.Context, target string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	require.NoError(t, err)
	return req
}

// checkedRoundTrip sends req through rt and checks the RoundTripper contract: a
// response and no error, or an error and no response. It closes the
// response body and returns the status.
func checkedRoundTrip(t *testing.T, rt http.RoundTripper, req *http.Request) (int, error) {
	t.Helper()
	resp, err := rt.RoundTrip(req)
	if err != nil {
		assert.Nil(t, resp, "a response returned together with error %v", err)
		return 0, err
	}
	require.NotNil(t, resp, "no response and no error")
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	return resp.StatusCode, nil
}

// mustSend200 sends req and requires a 200.
func mustSend200(t *testing.T, rt http.RoundTripper, req *http.Request) {
	t.Helper()
	status, err := checkedRoundTrip(t, rt, req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
}

// ---- waiting for goroutines on a fake clock ----

// eventually yields until cond holds, up to a generous real-time bound,
// and reports whether it held. It is how a test knows that a goroutine has
// reached a state that no timer announces.
func eventually(cond func() bool) bool {
	for give := time.Now().Add(10 * time.Second); !cond(); runtime.Gosched() {
		if time.Now().After(give) {
			return cond()
		}
	}
	return true
}

// spinUntil is eventually that fails the test when cond never holds.
func spinUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !eventually(cond) {
		t.Fatalf("timed out waiting until %s", what)
	}
}

// timersPending reports whether at least n timers are pending on fc, or
// come to be within a generous real-time bound: the goroutines that wait on
// them are then parked. Unlike fc.WaitTimers it does not hang when they
// never come.
func timersPending(fc *clock.Fake, n int) bool {
	return eventually(func() bool { return fc.Timers() >= n })
}

// waitTimers is timersPending that fails the test when the timers never
// come.
func waitTimers(t testing.TB, fc *clock.Fake, n int) {
	t.Helper()
	spinUntil(t, fmt.Sprintf("%d timers pending", n), func() bool { return fc.Timers() >= n })
}

// waited is what a WaitCost returned.
type waited struct {
	g   Grant
	err error
}

// waitCostAsync calls l.WaitCost(ctx, key, c, 0) on a goroutine of its own
// and returns a channel that will carry its result.
func waitCostAsync(ctx context.Context, l interface {
	WaitCost(context.Context, string, Cost, time.Duration) (Grant, error)
}, key string, c Cost) <-chan waited {
	ch := make(chan waited, 1)
	go func() {
		g, err := l.WaitCost(ctx, key, c, 0)
		ch <- waited{g, err}
	}()
	return ch
}

// recvWithin receives from ch, or fails the test if nothing comes within a
// generous real-time bound.
func recvWithin[T any](t testing.TB, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for a result")
		panic("unreachable")
	}
}

// limAdvanceTo moves fc forward to at; it never moves it back.
func limAdvanceTo(fc *clock.Fake, at time.Time) {
	if d := at.Sub(fc.Now()); d > 0 {
		fc.Advance(d)
	}
}

// ---- limiters and transports ----

// mustNewTransport is New that requires success.
func mustNewTransport(t *testing.T, base http.RoundTripper, opts ...Option) *Transport {
	t.Helper()
	tr, err := New(base, opts...)
	require.NoError(t, err)
	require.NotNil(t, tr)
	return tr
}

// newTokenBucketOnFake returns a token bucket that reads a fake clock
// started at limiterEpoch.
func newTokenBucketOnFake(t testing.TB, r Rate, burst int, opts ...LimiterOption) (*TokenBucket, *clock.Fake) {
	t.Helper()
	if len(opts) == 0 {
		opts = []LimiterOption{WithTransitMargin(0)} // the bucket's own maths
	}
	tb, err := NewTokenBucket(r, burst, opts...)
	require.NoError(t, err)
	fc := clock.NewFake(limiterEpoch)
	tb.clock = fc
	return tb, fc
}

// newLeakyBucketOnFake returns a leaky bucket that reads a fake clock
// started at limiterEpoch.
func newLeakyBucketOnFake(t testing.TB, r Rate, depth int) (*LeakyBucket, *clock.Fake) {
	t.Helper()
	lb, err := NewLeakyBucket(r, depth)
	require.NoError(t, err)
	fc := clock.NewFake(limiterEpoch)
	lb.clock = fc
	return lb, fc
}

// delayOf returns a grant's delay.
func delayOf(g grant, err error) (time.Duration, error) { return g.delay, err }

// limiterShape builds a fresh limiter of one shape with rate r and capacity
// (the burst, or the queue depth).
type limiterShape struct {
	name string
	make func(t *testing.T, r Rate, capacity int) Limiter
	// onFake is make on a fake clock started at start.
	onFake func(t *testing.T, r Rate, capacity int, start time.Time) (Limiter, *clock.Fake)
	// untouched reports whether key's capacity is all there, as if no
	// request had ever come.
	untouched func(t *testing.T, l Limiter, key string) bool
}

var limiterShapes = []limiterShape{
	{
		name: "tokenbucket",
		make: func(t *testing.T, r Rate, capacity int) Limiter {
			l, err := NewTokenBucket(r, capacity)
			require.NoError(t, err)
			return l
		},
		onFake: func(t *testing.T, r Rate, capacity int, start time.Time) (Limiter, *clock.Fake) {
			tb, fc := newTokenBucketOnFake(t, r, capacity)
			fc.Advance(start.Sub(limiterEpoch))
			return tb, fc
		},
		untouched: func(t *testing.T, l Limiter, key string) bool {
			tb := l.(*TokenBucket)
			delay, err := delayOf(tb.reserve(key, tb.burst, budget{}))
			require.NoError(t, err)
			return delay == 0
		},
	},
	{
		name: "leakybucket",
		make: func(t *testing.T, r Rate, capacity int) Limiter {
			l, err := NewLeakyBucket(r, capacity)
			require.NoError(t, err)
			return l
		},
		onFake: func(t *testing.T, r Rate, capacity int, start time.Time) (Limiter, *clock.Fake) {
			lb, fc := newLeakyBucketOnFake(t, r, capacity)
			fc.Advance(start.Sub(limiterEpoch))
			return lb, fc
		},
		untouched: func(t *testing.T, l Limiter, key string) bool {
			return !slices.Contains(leakyLanesHeld(l.(*LeakyBucket)), key)
		},
	},
}

// holdSignal is a 429 at now asking to wait d, with no quota count: it
// holds its key for d.
func holdSignal(now time.Time, d time.Duration) Signal {
	return Signal{Now: now, SentAt: now, Status: http.StatusTooManyRequests, RetryAfter: d, HasRetryAfter: true}
}

// takeOneUnit takes one unit of key's capacity straight from the limiter, so that
// the next request on key has to wait.
func takeOneUnit(t *testing.T, l Limiter, key string) {
	t.Helper()
	waited, err := l.Wait(context.Background(), key, 1, 0)
	require.NoError(t, err)
	require.Zero(t, waited, "the limiter for %q was expected to be idle", key)
}

// probeWouldWait asks l how long a request of cost 1 on key would wait now,
// without taking anything: a wait of 1ns is never enough, so the limiter
// refuses and reports the wait it would have needed. It fails the test when
// the probe is granted (key idle), which would take capacity.
func probeWouldWait(t *testing.T, l Limiter, key string) time.Duration {
	t.Helper()
	_, err := l.Wait(context.Background(), key, 1, time.Nanosecond)
	var le *LimitError
	require.ErrorAs(t, err, &le, "probe on idle key %q was granted", key)
	require.Equal(t, ReasonMaxWait, le.Reason)
	return le.Wait
}

// onClock is a shared limiter's clock, for a test: its process reads fc,
// and its scripts take fc's time as theirs (caller.Now), so that a script
// and its Go twin run on the same instants.
func onClock(fc *clock.Fake) LimiterOption {
	return limiterOpt("onClock", sharedRate, func(s *limiterSettings) { s.redis.clock = fc })
}

// learnSignal applies s to a key's controller state st, as a limiter does.
func learnSignal(st *control.State, cfg *control.Config, s *Signal) Decision {
	r := s.response()
	return decided(st.Learn(cfg, &r))
}
