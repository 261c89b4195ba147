package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/egress-go/egress"
	"github.com/egress-go/egress/internal/fakeapi"
)

const (
	chargeTimeout       = 5 * time.Second // each charge's own deadline, as a service would set
	maxChargesPerWorker = 50_000          // a worker's loop is bounded in count as well as time
	pauseAfterError     = 100 * time.Millisecond
)

// result is what one run of a fleet measured.
type result struct {
	name string
	// upstream is what reached the API: as the API counted it when it runs
	// in this process, else as this process's clients saw it.
	upstream fakeapi.Stats
	start    time.Time

	charges int   // charges that succeeded (200)
	failed  int   // charges that did not, after any retries
	refused int64 // charges egress refused without sending
	retries int64 // attempts after the first, by the naive client or egress
	pauses  int64 // pauses egress learnt from Retry-After or rate-limit headers

	p50, p99 time.Duration // of the successful charges
}

// tally collects the outcome of every charge.
type tally struct {
	mu        sync.Mutex
	latencies []time.Duration // guarded by mu; of the successful charges
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

// runFleet runs the pods' workers against url for s.duration (or until ctx
// ends), printing one line a second, and returns what they measured.
func runFleet(ctx context.Context, s settings, out io.Writer, name string, p *pods, url string) result {
	fmt.Fprintf(out, "\n— %s\n", name)
	start := time.Now()
	end := start.Add(s.duration)
	tag := runTag()
	var (
		t  tally
		wg sync.WaitGroup
	)
	for i, client := range p.clients {
		for w := range s.workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				work(ctx, client, url, fmt.Sprintf("%s-%d-%d", tag, i, w), end, &t)
			}()
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	live(out, p, start, done)

	slices.Sort(t.latencies)
	return result{
		name: name, upstream: p.got.Stats(start), start: start,
		charges: len(t.latencies), failed: t.failed,
		refused: p.refused.Load(), retries: p.retries.Load(), pauses: p.pauses.Load(),
		p50: quantile(t.latencies, 0.50), p99: quantile(t.latencies, 0.99),
	}
}

// work is one worker: it charges back to back until end, each charge with
// its own idempotency key.
func work(ctx context.Context, client *http.Client, url, tag string, end time.Time, t *tally) {
	for i := 0; i < maxChargesPerWorker && ctx.Err() == nil && time.Now().Before(end); i++ {
		t0 := time.Now()
		status, err := charge(ctx, client, url, fmt.Sprintf("%s-%d", tag, i))
		t.add(status == http.StatusOK, time.Since(t0))
		if err != nil && !errors.Is(err, egress.ErrRateLimited) && ctx.Err() == nil {
			time.Sleep(pauseAfterError) // the API is unreachable: do not spin
		}
	}
}

// charge POSTs one payment, as a service would: a form body that can be
// sent again, an Idempotency-Key, and a deadline of its own.
func charge(ctx context.Context, client *http.Client, url, key string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, chargeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/charges",
		strings.NewReader("amount=2000&currency=usd&source=tok_visa"))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", key)
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, err
}

// live prints, once a second until done, what the clients sent and got
// back in that second, and how many requests egress holds.
func live(out io.Writer, p *pods, start time.Time, done <-chan struct{}) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var last fakeapi.Stats
	for sec := 1; ; sec++ {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		now := p.got.Stats(start)
		fmt.Fprintf(out, "  t=%3ds  sent %5d/s  accepted %4d/s  429s %5d/s  503s %3d/s  waiting %3d\n", sec,
			now.Requests-last.Requests, now.Accepted-last.Accepted,
			now.Limited-last.Limited, now.Unavailable-last.Unavailable, p.waiting())
		last = now
	}
}

// runTag tells this process's idempotency keys from another's.
func runTag() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(q*float64(len(sorted)-1))]
}
