package priority

import (
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/egress-go/egress/internal/fakeapi"
)

// The headers a call carries to the provider: the stream it belongs to
// (for the provider's counts) and, in the token scenario, its cost.
const (
	streamHeader = "X-Bench-Stream"
	tokensHeader = "X-Bench-Tokens"
)

// provider is the fake API of every scenario: one token bucket over all its
// callers, of rate units per second and burst units, in requests or (tokens
// true) in the tokens each request's tokensHeader states. A request the
// bucket has no room for is answered 429 with Retry-After (whole seconds
// until its units are back, at least 1); every answer is delayed by latency.
// It records when each request was decided, its stream, its units and
// whether it was accepted. Safe for concurrent use.
type provider struct {
	srv     *httptest.Server
	latency time.Duration
	tokens  bool

	mu     sync.Mutex
	rate   float64   // guarded by mu; units per second
	burst  float64   // guarded by mu
	level  float64   // guarded by mu; units in the bucket at last
	last   time.Time // guarded by mu
	events []event   // guarded by mu
}

// event is one request the provider decided.
type event struct {
	at     time.Time
	stream string
	units  int
	ok     bool
}

// startProvider starts a provider on 127.0.0.1; t.Cleanup closes it.
func startProvider(t *testing.T, rate float64, burst int, tokens bool, latency time.Duration) *provider {
	t.Helper()
	p := &provider{latency: latency, tokens: tokens, rate: rate, burst: float64(burst), level: float64(burst), last: time.Now()}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *provider) URL() string { return p.srv.URL }

func (p *provider) serve(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	units := 1
	if p.tokens {
		n, err := strconv.Atoi(r.Header.Get(tokensHeader))
		if err != nil || n < 1 {
			http.Error(w, "no tokens", http.StatusBadRequest)
			return
		}
		units = n
	}
	now := time.Now()
	p.mu.Lock()
	p.level = min(p.burst, p.level+now.Sub(p.last).Seconds()*p.rate)
	p.last = now
	ok := p.level >= float64(units)
	var retry time.Duration
	if ok {
		p.level -= float64(units)
	} else {
		retry = time.Duration((float64(units) - p.level) / p.rate * float64(time.Second))
	}
	p.events = append(p.events, event{at: now, stream: r.Header.Get(streamHeader), units: units, ok: ok})
	p.mu.Unlock()

	time.Sleep(p.latency)
	if !ok {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(retry.Seconds())))))
		http.Error(w, "rate limited", http.StatusTooManyRequests)
		return
	}
	_, _ = io.WriteString(w, "ok\n")
}

// providerStats is what the provider saw of a run.
type providerStats struct {
	window          time.Duration
	acceptedIn      int            // accepted within the window
	okByStream      map[string]int // accepted within the window, by stream
	unitsByStream   map[string]int // their units
	accepted        int            // accepted in all
	received        int            // every request in all
	limited         int            // 429s in all
	receivedPerSec  []int          // in each second of the window
	acceptedPerSec  []int
	limitedPerSec   []int
	maxAcceptedPerS int // most accepted in any 1 s
}

// stats returns what the provider saw, counting the window [start, start+d)
// for the per-stream and per-second figures.
func (p *provider) stats(start time.Time, d time.Duration) providerStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := providerStats{window: d, okByStream: map[string]int{}, unitsByStream: map[string]int{}}
	secs := int(d / time.Second)
	st.receivedPerSec, st.acceptedPerSec, st.limitedPerSec = make([]int, secs), make([]int, secs), make([]int, secs)
	var acceptedAt []time.Time
	for _, e := range p.events {
		st.received++
		if e.ok {
			st.accepted++
			acceptedAt = append(acceptedAt, e.at)
		} else {
			st.limited++
		}
		off := e.at.Sub(start)
		if off < 0 || off >= d {
			continue
		}
		if i := int(off / time.Second); i < secs {
			st.receivedPerSec[i]++
			if e.ok {
				st.acceptedPerSec[i]++
			} else {
				st.limitedPerSec[i]++
			}
		}
		if e.ok {
			st.acceptedIn++
			st.okByStream[e.stream]++
			st.unitsByStream[e.stream] += e.units
		}
	}
	st.maxAcceptedPerS = fakeapi.MaxInWindow(acceptedAt, time.Second)
	return st
}
