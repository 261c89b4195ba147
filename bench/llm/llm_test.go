package llm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/egress-go/egress"
	"github.com/egress-go/egress/bench/internal/benchkit"
	"github.com/egress-go/egress/internal/fakellm"
	"github.com/egress-go/egress/internal/redistest"
)

// The provider of the scenario: 600 requests and 60,000 tokens per scaled
// minute of 2 s, a token bucket that reserves input + max_tokens up front
// (OpenAI's rule), answers after 100 ms plus 0.5 ms per output token, a
// quarter of them streamed. The fleet's calls average about 280 tokens, so
// the tokens limit binds (about 107 calls a second of the 300 allowed).
const (
	rpm, tpm      = 600, 60_000
	minute        = 2 * time.Second
	latency       = 100 * time.Millisecond
	perToken      = 500 * time.Microsecond
	streamChunks  = 8
	streamShare   = 0.25
	pods, workers = 4, 8
	duration      = 10 * time.Second // workers start calls for this long
	callTimeout   = 10 * time.Second // each call's own deadline, waits included
	estimateError = 0.5              // the estimate is the reservation × [1−e, 1+e]
	utilTarget    = 0.9              // the target for egress

	minPrompt, maxPrompt       = 200, 1000 // bytes: 56 to 256 input tokens
	minMaxTokens, maxMaxTokens = 100, 300
	maxCallsPerWorker          = 50_000
	sharedName                 = "llm" // the fleet's keys in Redis
	outEnv                     = "EGRESS_LLM_OUT"
)

var filler = strings.Repeat("Summarise the quarterly report in three short bullet points. ", 20)

// estimator makes a row's estimate of a call's cost.
type estimator struct {
	name string
	new  func() func(*http.Request) egress.Cost
}

// noisy is the reservation (true input + max_tokens, which the provider
// charges up front) times a factor uniform in [1−e, 1+e], from a generator
// of the row's own with the same seed in every row.
var noisy = estimator{name: fmt.Sprintf("±%.0f%%", 100*estimateError), new: func() func(*http.Request) egress.Cost {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(7, 7))
	return func(req *http.Request) egress.Cost {
		n, _ := req.Context().Value(reservationKey{}).(int)
		mu.Lock()
		f := 1 + estimateError*(2*rng.Float64()-1)
		mu.Unlock()
		return egress.Cost{Requests: 1, Tokens: int(math.Round(float64(n) * f))}
	}
}}

// llmCost is egress.LLMCost: the body's size over 4, plus max_tokens.
var llmCost = estimator{name: "LLMCost", new: func() func(*http.Request) egress.Cost { return egress.LLMCost }}

// reservationKey is the context key of a call's reservation.
type reservationKey struct{}

// strategy is a way for a fleet to call the provider.
type strategy struct {
	name     string
	estimate estimator
	redis    bool
	// newPods builds the fleet's pods, one per base; estimate is the row's.
	newPods func(env fleetEnv) ([]func(*http.Request) (*http.Response, error), error)
}

// fleetEnv is what a fleet is built from: per pod, a connection pool seen
// through the probe and, when the strategy needs one, a Redis client.
type fleetEnv struct {
	bases      []http.RoundTripper
	rdbs       []*redis.Client
	estimate   func(*http.Request) egress.Cost
	closeAtEnd func(func() error) // runs f when the row ends, before the clients close
}

// row is a strategy against a provider enforcing its limits as enf.
type row struct {
	st  strategy
	enf fakellm.Enforcement
}

// rows are the table's rows: every strategy against OpenAI's token bucket,
// then egress against a provider whose sliding window is exactly the shape
// of egress's, so that the provider has no slack beyond the limit.
func rows() []row {
	return []row{
		{egressStrategy(noisy), fakellm.TokenBucket},
		{egressStrategy(llmCost), fakellm.TokenBucket},
		{splitStrategy(), fakellm.TokenBucket},
		{sharedStrategy(noisy), fakellm.TokenBucket},
		{redisRateStrategy(), fakellm.TokenBucket},
		{egressStrategy(noisy), fakellm.SlidingWindow},
		{egressStrategy(llmCost), fakellm.SlidingWindow},
		{sharedStrategy(noisy), fakellm.SlidingWindow},
		{sharedStrategy(llmCost), fakellm.SlidingWindow},
	}
}

// limits are egress's limits of the provider: a window of RPM requests and
// one of TPM tokens per minute.
var limits = []egress.Limit{egress.WindowOf(egress.Requests, rpm, minute), egress.WindowOf(egress.Tokens, tpm, minute)}

// sharedStrategy is a SharedLimits per pod, each with its own Redis
// client, as separate processes would have: the limits in Redis, settled
// there from the usage; WithCosts and WithRetry as egressStrategy's.
func sharedStrategy(est estimator) strategy {
	return strategy{name: "egress SharedLimits (windows, Redis) + WithCosts + WithRetry", estimate: est, redis: true,
		newPods: func(env fleetEnv) ([]func(*http.Request) (*http.Response, error), error) {
			var dos []func(*http.Request) (*http.Response, error)
			for i, base := range env.bases {
				lim, err := egress.NewSharedLimits(env.rdbs[i], sharedName, limits)
				if err != nil {
					return nil, err
				}
				env.closeAtEnd(lim.Close)
				tr, err := egress.New(base, egress.WithLimiter(lim), egress.WithCosts(env.estimate), egress.WithRetry(egress.RetryPolicy{}))
				if err != nil {
					return nil, err
				}
				dos = append(dos, (&http.Client{Transport: tr}).Do)
			}
			return dos, nil
		}}
}

// egressStrategy is one Limits for the fleet's pods in this process (see
// sharedStrategy for one per pod through Redis), WithCosts settled from
// the usage, and WithRetry with its defaults.
func egressStrategy(est estimator) strategy {
	return strategy{name: "egress Limits (windows, one in process) + WithCosts + WithRetry", estimate: est,
		newPods: func(env fleetEnv) ([]func(*http.Request) (*http.Response, error), error) {
			limits, err := egress.NewLimits(limits...)
			if err != nil {
				return nil, err
			}
			var dos []func(*http.Request) (*http.Response, error)
			for _, base := range env.bases {
				tr, err := egress.New(base, egress.WithLimiter(limits), egress.WithCosts(env.estimate), egress.WithRetry(egress.RetryPolicy{}))
				if err != nil {
					return nil, err
				}
				dos = append(dos, (&http.Client{Transport: tr}).Do)
			}
			return dos, nil
		}}
}

// splitStrategy is x/time/rate per pod at a quarter of each limit: a
// limiter of RPM/4 requests per minute (burst RPM/4) and one of TPM/4
// tokens (burst TPM/4) waiting for n = the estimate; then a plain client.
func splitStrategy() strategy {
	return strategy{name: "x/time/rate per pod (RPM/4, TPM/4; WaitN estimate)", estimate: noisy,
		newPods: func(env fleetEnv) ([]func(*http.Request) (*http.Response, error), error) {
			var dos []func(*http.Request) (*http.Response, error)
			for _, base := range env.bases {
				n := len(env.bases)
				reqs := rate.NewLimiter(rate.Limit(float64(rpm)/float64(n)/minute.Seconds()), rpm/n)
				toks := rate.NewLimiter(rate.Limit(float64(tpm)/float64(n)/minute.Seconds()), tpm/n)
				c := &http.Client{Transport: base}
				dos = append(dos, func(req *http.Request) (*http.Response, error) {
					if err := reqs.Wait(req.Context()); err != nil {
						return nil, err
					}
					if err := toks.WaitN(req.Context(), env.estimate(req).Tokens); err != nil {
						return nil, err
					}
					return c.Do(req)
				})
			}
			return dos, nil
		}}
}

// redisRateStrategy is redis_rate's GCRA in Redis, fleet-wide: a requests
// limit of RPM per minute (burst RPM) and a tokens limit of TPM (burst
// TPM), each in the loop its README suggests (Allow; if refused, sleep
// RetryAfter and ask again), the tokens by AllowN of the estimate; then a
// plain client. A request allowed by the first limit keeps its grant while
// it waits for the second.
func redisRateStrategy() strategy {
	return strategy{name: "redis_rate (Allow + AllowN estimate, sleep RetryAfter)", estimate: noisy, redis: true,
		newPods: func(env fleetEnv) ([]func(*http.Request) (*http.Response, error), error) {
			reqLimit := redis_rate.Limit{Rate: rpm, Burst: rpm, Period: minute}
			tokLimit := redis_rate.Limit{Rate: tpm, Burst: tpm, Period: minute}
			var dos []func(*http.Request) (*http.Response, error)
			for i, base := range env.bases {
				lim := redis_rate.NewLimiter(env.rdbs[i])
				c := &http.Client{Transport: base}
				dos = append(dos, func(req *http.Request) (*http.Response, error) {
					ctx := req.Context()
					if err := allowN(ctx, lim, sharedName+":requests", reqLimit, 1); err != nil {
						return nil, err
					}
					if err := allowN(ctx, lim, sharedName+":tokens", tokLimit, env.estimate(req).Tokens); err != nil {
						return nil, err
					}
					return c.Do(req)
				})
			}
			return dos, nil
		}}
}

func allowN(ctx context.Context, lim *redis_rate.Limiter, key string, limit redis_rate.Limit, n int) error {
	for {
		res, err := lim.AllowN(ctx, key, limit, n)
		if err != nil {
			return err
		}
		if res.Allowed > 0 {
			return nil
		}
		if err := benchkit.Sleep(ctx, res.RetryAfter); err != nil {
			return err
		}
	}
}

// outcome is what one row measured.
type outcome struct {
	provider fakellm.Stats // the provider's own count
	elapsed  time.Duration // until the last call returned
	limited  int64         // 429s received by the pods
	late     int64         // of them, more than a second after the start
	calls    int
	failed   int // calls that did not end in a 200
	p99      time.Duration
}

func (o outcome) tokensPerSecond() float64 {
	return float64(o.provider.InputTokens+o.provider.OutputTokens) / o.elapsed.Seconds()
}

// utilisation is the tokens the provider charged in the whole periods of
// the run after the first (which has the bucket's initial burst), over TPM
// per period.
func (o outcome) utilisation() float64 {
	sum, n := 0, 0
	for i := 1; i < int(duration/minute) && i < len(o.provider.Windows); i++ {
		sum += o.provider.Windows[i].Tokens()
		n++
	}
	if n == 0 {
		return 0
	}
	return float64(sum) / float64(n*tpm)
}

// TestLLMScenario runs each row once against a fresh fake LLM provider
// whose tokens limit binds, as a fleet of 4 pods × 8 workers for 10 s, and
// reports what the provider saw, side by side: every strategy against a
// token bucket (OpenAI's), then egress against a sliding window. It checks
// nothing of the figures: it measures.
func TestLLMScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for a minute; skipped under -short")
	}
	goroutines := runtime.NumGoroutine()
	header := []string{"provider", "strategy", "estimate", "calls", "failed", "429s", "429s after 1 s",
		"tokens/s accepted", "utilisation of TPM (periods 2–5)", "peak TPM in use", "p99"}
	var cells [][]string
	for _, r := range rows() {
		st := r.st
		var o outcome
		ok := t.Run(r.enf.String()+"/"+st.name+"/"+st.estimate.name, func(t *testing.T) {
			load := benchkit.LoadAvg()
			o = run(t, st, r.enf)
			t.Logf("calls %d, failed %d, 429s %d (after 1 s: %d), tokens/s %.0f, utilisation %s, peak %d, p99 %s; load before %s",
				o.calls, o.failed, o.limited, o.late, o.tokensPerSecond(), benchkit.Percent(o.utilisation()), o.provider.TPM.Peak, benchkit.Ms(o.p99), load)
			var per []int
			for _, w := range o.provider.Windows {
				per = append(per, w.Tokens())
			}
			t.Logf("tokens per period: %v; refused by TPM %d, by RPM %d", per, o.provider.TPM.Refused, o.provider.RPM.Refused)
			if strings.HasPrefix(st.name, "egress") {
				t.Logf("target (0 429s after 1 s, ≥ %s of TPM): 429s after 1 s %d, utilisation %s", benchkit.Percent(utilTarget), o.late, benchkit.Percent(o.utilisation()))
			}
		})
		if !ok {
			t.FailNow()
		}
		cells = append(cells, []string{r.enf.String(), st.name, st.estimate.name, benchkit.Count(o.calls), benchkit.Count(o.failed), benchkit.Count(int(o.limited)), benchkit.Count(int(o.late)),
			benchkit.Count(int(math.Round(o.tokensPerSecond()))), benchkit.Percent(o.utilisation()), benchkit.Count(o.provider.TPM.Peak), benchkit.Ms(o.p99)})
	}
	var out strings.Builder
	fmt.Fprintf(&out, "## LLM scenario\n\n%s\n\n%s\n\n%s\nLoad after the run: %s\n", benchkit.Machine(), intro(), benchkit.Markdown(header, cells), benchkit.LoadAvg())
	t.Logf("\n%s", out.String())
	if path := os.Getenv(outEnv); path != "" {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Errorf("%s: %v", outEnv, err)
		}
	}
	benchkit.CheckGoroutines(t, goroutines, 5*time.Second)
}

func intro() string {
	return fmt.Sprintf("Provider (internal/fakellm): %d requests and %d tokens (input + output) per scaled minute of %v, "+
		"a token bucket (OpenAI's) or a sliding window, that reserves input + max_tokens up front and refunds the unused output at the end; "+
		"latency %v + %v per output token; %.0f%% of the calls streamed. Calls: prompts of %d–%d bytes, max_tokens %d–%d, "+
		"output uniform in [max_tokens/4, max_tokens]: the tokens limit binds. %d pods × %d workers for %v, each call with a %v deadline. "+
		"Estimate ±%.0f%%: the reservation (true input + max_tokens) × a factor uniform in [%.1f, %.1f]. "+
		"The peers send with a plain client (no retry of a 429). 429s as the pods received them; tokens/s = tokens charged / run; "+
		"utilisation = tokens charged in periods 2–%d / (%d × TPM).",
		rpm, tpm, minute, latency, perToken, 100*streamShare, minPrompt, maxPrompt, minMaxTokens, maxMaxTokens,
		pods, workers, duration, callTimeout, 100*estimateError, 1-estimateError, 1+estimateError,
		int(duration/minute), int(duration/minute)-1)
}

// run runs st against its own provider, enforcing as enf (and Redis), all closed before it
// returns.
func run(t *testing.T, st strategy, enf fakellm.Enforcement) outcome {
	t.Helper()
	var srv *redistest.Server
	if st.redis {
		srv = redistest.Start(t) // stopped last
	}
	// The provider's clock is shifted so that its first period starts now.
	now := time.Now()
	llm, err := fakellm.New(fakellm.Config{
		RPM: rpm, TPM: tpm, Minute: minute, Latency: latency, PerToken: perToken, Chunks: streamChunks,
		Enforcement: enf, Seed: 1, Clock: fakellm.StartingAt(now, minute),
	})
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(llm)
	t.Cleanup(api.Close) // after the pods' connections are closed
	rec := &probeRecord{start: now}
	t.Cleanup(func() { // first: the pods' connection pools and Redis clients
		if err := rec.Close(); err != nil {
			t.Errorf("closing the pods: %v", err)
		}
	})
	env := fleetEnv{estimate: st.estimate.new(), closeAtEnd: rec.Add}
	for range pods {
		env.bases = append(env.bases, rec.pool(workers))
		if srv != nil {
			env.rdbs = append(env.rdbs, rec.Redis(srv.Addr))
		}
	}
	dos, err := st.newPods(env)
	if err != nil {
		t.Fatal(err)
	}

	tl := drive(t.Context(), api.URL, dos, now.Add(duration))
	o := outcome{
		elapsed: time.Since(now), limited: rec.limited.Load(), late: rec.late.Load(),
		calls: tl.calls, failed: tl.calls - len(tl.latencies), p99: benchkit.Quantile(tl.latencies, 0.99),
		provider: llm.Stats(),
	}
	if int64(o.provider.Refused) != o.limited {
		t.Logf("note: the provider answered %d 429s, the pods received %d", o.provider.Refused, o.limited)
	}
	return o
}

// tally collects the outcome of every call. Safe for concurrent use.
type tally struct {
	mu        sync.Mutex
	calls     int             // guarded by mu
	latencies []time.Duration // guarded by mu; of the successful calls
}

func (t *tally) add(ok bool, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.calls++
	if ok {
		t.latencies = append(t.latencies, d)
	}
}

// drive runs every pod's workers until end and returns once the last call
// has returned, with the latencies sorted.
func drive(ctx context.Context, url string, dos []func(*http.Request) (*http.Response, error), end time.Time) *tally {
	tl := &tally{}
	var wg sync.WaitGroup
	for i, do := range dos {
		for w := range workers {
			wg.Add(1)
			rng := rand.New(rand.NewPCG(uint64(i), uint64(w)))
			go func() {
				defer wg.Done()
				for n := 0; n < maxCallsPerWorker && ctx.Err() == nil && time.Now().Before(end); n++ {
					body, reservation := newCall(rng, rng.Float64() < streamShare)
					t0 := time.Now()
					status, err := call(ctx, do, url, body, reservation)
					tl.add(err == nil && status == http.StatusOK, time.Since(t0))
				}
			}()
		}
	}
	wg.Wait()
	slices.Sort(tl.latencies)
	return tl
}

// newCall returns the body of a call drawn from rng and its reservation:
// its true input tokens plus its max_tokens.
func newCall(rng *rand.Rand, stream bool) ([]byte, int) {
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	type options struct {
		IncludeUsage bool `json:"include_usage"`
	}
	c := struct {
		Model         string    `json:"model"`
		Messages      []message `json:"messages"`
		MaxTokens     int       `json:"max_tokens"`
		Stream        bool      `json:"stream,omitempty"`
		StreamOptions *options  `json:"stream_options,omitempty"`
	}{
		Model:     "gpt-4o-mini",
		Messages:  []message{{Role: "user", Content: filler[:minPrompt+rng.IntN(maxPrompt-minPrompt+1)]}},
		MaxTokens: minMaxTokens + rng.IntN(maxMaxTokens-minMaxTokens+1),
		Stream:    stream,
	}
	if stream {
		c.StreamOptions = &options{IncludeUsage: true}
	}
	body, _ := json.Marshal(c) // of strings and ints: it cannot fail
	in, _ := fakellm.InputTokens(body)
	return body, in + c.MaxTokens
}

// call makes one chat completion with its own deadline, reads its body
// to the end and returns its final status.
func call(ctx context.Context, do func(*http.Request) (*http.Response, error), url string, body []byte, reservation int) (int, error) {
	ctx, cancel := context.WithTimeout(context.WithValue(ctx, reservationKey{}, reservation), callTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+fakellm.ChatCompletionsPath, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := do(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, err
}

// probeRecord owns the pods' connection pools and Redis clients and counts
// the 429s that come back through the pools. Safe for concurrent use.
type probeRecord struct {
	start   time.Time // set before the workers start
	limited atomic.Int64
	late    atomic.Int64 // 429s more than a second after start

	benchkit.Pods
}

// pool returns a new pod's own connection pool, seen through the probe.
func (r *probeRecord) pool(workers int) http.RoundTripper {
	return probe{base: r.Pool(workers), rec: r}
}

type probe struct {
	base http.RoundTripper
	rec  *probeRecord
}

func (p probe) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := p.base.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusTooManyRequests {
		p.rec.limited.Add(1)
		if time.Since(p.rec.start) > time.Second {
			p.rec.late.Add(1)
		}
	}
	return resp, err
}
