package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/egress-go/egress"
	"github.com/egress-go/egress/internal/fakellm"
)

const (
	callTimeout       = 10 * time.Second // each call's own deadline, as a service would set
	maxCallsPerWorker = 50_000           // a worker's loop is bounded in count as well as time
	pauseAfterError   = 100 * time.Millisecond

	// The calls: a prompt of 200 to 1000 bytes (56 to 256 input tokens)
	// and a max_tokens of 100 to 300, of which the provider's completion
	// uses a quarter to all.
	minPrompt, maxPrompt       = 200, 1000
	minMaxTokens, maxMaxTokens = 100, 300
)

// filler is the text the prompts are cut from.
var filler = strings.Repeat("Summarise the quarterly report in three short bullet points. ", 20)

// result is what one run of a fleet measured.
type result struct {
	name     string
	provider fakellm.Stats // the provider's own count: the truth
	start    time.Time
	elapsed  time.Duration // until the last call returned

	calls   int   // calls that succeeded (200)
	failed  int   // calls that did not, after any retries
	limited int64 // 429s received
	late    int64 // of them, more than a second after the start
	retries int64 // attempts after the first, by the naive client or egress
	refused int64 // calls egress refused without sending

	p50, p99 time.Duration // of the successful calls
}

// tally collects the outcome of every call.
type tally struct {
	mu        sync.Mutex
	latencies []time.Duration // guarded by mu; of the successful calls
	failed    int             // guarded by mu
}

func (t *tally) add(ok bool, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if ok {
		t.latencies = append(t.latencies, d)
	} else {
		t.failed++
	}
}

// runFleet runs the pods' workers against url from start for s.duration
// (or until ctx ends), printing one line a period, and returns what they
// measured; the provider's count is the caller's to add.
func runFleet(ctx context.Context, s settings, out io.Writer, name string, p *pods, url string, start time.Time) result {
	fmt.Fprintf(out, "\n— %s\n", name)
	end := start.Add(s.duration)
	p.got.start = start
	var (
		t  tally
		wg sync.WaitGroup
	)
	for i, client := range p.clients {
		for w := range s.workers {
			wg.Add(1)
			rng := rand.New(rand.NewPCG(uint64(i), uint64(w)))
			go func() {
				defer wg.Done()
				work(ctx, s, client, url, rng, end, &t, &p.got)
			}()
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	live(out, s, p, start, done)

	slices.Sort(t.latencies)
	return result{
		name: name, start: start, elapsed: time.Since(start),
		calls: len(t.latencies), failed: t.failed,
		limited: p.got.limited.Load(), late: p.got.late.Load(),
		retries: p.got.retries.Load(), refused: p.got.refused.Load(),
		p50: quantile(t.latencies, 0.50), p99: quantile(t.latencies, 0.99),
	}
}

// work is one worker: it calls back to back until end.
func work(ctx context.Context, s settings, client *http.Client, url string, rng *rand.Rand, end time.Time, t *tally, g *gauges) {
	for i := 0; i < maxCallsPerWorker && ctx.Err() == nil && time.Now().Before(end); i++ {
		body, reservation := newCall(rng, rng.Float64() < s.streams)
		t0 := time.Now()
		tokens, err := call(ctx, client, url, body, reservation)
		t.add(err == nil, time.Since(t0))
		g.tokens.Add(int64(tokens))
		if err != nil && !errors.Is(err, egress.ErrRateLimited) && !errors.Is(err, errStatus) && ctx.Err() == nil {
			time.Sleep(pauseAfterError) // the API is unreachable: do not spin
		}
	}
}

// wireCall is the body of a chat completion request.
type wireCall struct {
	Model         string        `json:"model"`
	Messages      []wireMessage `json:"messages"`
	MaxTokens     int           `json:"max_tokens"`
	Stream        bool          `json:"stream,omitempty"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options,omitempty"`
}

type wireMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// newCall returns the body of a call drawn from rng, and its reservation:
// its true input tokens plus its max_tokens, what the provider charges up
// front.
func newCall(rng *rand.Rand, stream bool) ([]byte, int) {
	c := wireCall{
		Model:     "gpt-4o-mini",
		Messages:  []wireMessage{{Role: "user", Content: filler[:minPrompt+rng.IntN(maxPrompt-minPrompt+1)]}},
		MaxTokens: minMaxTokens + rng.IntN(maxMaxTokens-minMaxTokens+1),
		Stream:    stream,
	}
	if stream {
		c.StreamOptions = &struct {
			IncludeUsage bool `json:"include_usage"`
		}{true}
	}
	body, _ := json.Marshal(c) // of strings and ints: it cannot fail
	in, _ := fakellm.InputTokens(body)
	return body, in + c.MaxTokens
}

// errStatus is the error of a call whose final answer is not a 200.
var errStatus = errors.New("final status not 200")

// call makes one chat completion with its own deadline and returns the
// tokens its usage tells.
func call(ctx context.Context, client *http.Client, url string, body []byte, reservation int) (int, error) {
	ctx, cancel := context.WithTimeout(withReservation(ctx, reservation), callTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+fakellm.ChatCompletionsPath, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	switch {
	case err != nil:
		return 0, err
	case resp.StatusCode != http.StatusOK:
		return 0, fmt.Errorf("%w: %s", errStatus, resp.Status)
	}
	return usageTokens(b), nil
}

// usageTokens is the last total_tokens of a JSON or server-sent-events
// body, or 0.
func usageTokens(b []byte) int {
	const key = `"total_tokens":`
	i := bytes.LastIndex(b, []byte(key))
	if i < 0 {
		return 0
	}
	b = b[i+len(key):]
	j := 0
	for j < len(b) && '0' <= b[j] && b[j] <= '9' {
		j++
	}
	n, _ := strconv.Atoi(string(b[:j]))
	return n
}

// live prints, once a period until done, what the clients sent and got
// back in that period, and how many requests the clients hold back.
func live(out io.Writer, s settings, p *pods, start time.Time, done <-chan struct{}) {
	var last snapshot
	for k := 1; ; k++ {
		t := time.NewTimer(time.Until(start.Add(time.Duration(k) * s.minute)))
		select {
		case <-done:
			t.Stop()
			return
		case <-t.C:
		}
		now := p.got.snapshot()
		tokens := now.tokens - last.tokens
		fmt.Fprintf(out, "  period %2d  sent %5d  accepted %4d  429s %5d  tokens %7d (%3.0f%% of TPM)  waiting %3d\n", k,
			now.sent-last.sent, now.ok-last.ok, now.limited-last.limited,
			tokens, 100*float64(tokens)/float64(s.tpm), p.waiting())
		last = now
	}
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(q*float64(len(sorted)-1))]
}
