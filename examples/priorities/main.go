// Command priorities shows in about fifteen seconds what WithPriorities
// does when work that cannot wait and work that can share one provider's
// limit.
//
// It starts a fake API on 127.0.0.1 (internal/fakeapi) that accepts 50
// requests per second over all its callers (burst 10), advertises its
// limit in RateLimit headers, and answers 429 beyond it. One egress
// Transport, with a TokenBucket of 50/s (burst 5), carries two streams to
// it:
//
//   - interactive: a user clicking, about 5 requests a second (a tenth of
//     the limit, seeded random arrivals), each with a 2 s deadline, as
//     PriorityHigh;
//   - backfill: 4 workers each starting 50 requests a second without
//     waiting for the last (200/s offered: four times the limit), each
//     with a 3 s deadline, as PriorityLow.
//
// It runs them for -duration twice: without WithPriorities, where the
// requests wait in arrival order, then with it. For each stream it prints
// the requests sent, refused (by egress, without sending) and late (sent,
// but answered after their deadline), the p50 and p99 wait before
// sending, and the 429s the provider answered.
//
// A third part runs three tenants of one priority against the same
// limit, offering 5, 20 and 100 requests a second at random (each with a
// 1 s deadline), once without WithPriorities and once with it, and compares
// the rates they got with the max-min fair split (5, 20, 25).
//
//	go run ./examples/priorities
//	go run ./examples/priorities -duration 8s -seed 7
//
// The arrivals are drawn from -seed: a run reads the same each time, to
// the scheduling of goroutines. Invalid flags print a message and exit
// with status 2.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/egress-go/egress"
	"github.com/egress-go/egress/internal/fakeapi"
)

// The provider, and egress configured with its documented limit.
const (
	limit         = 50 // requests per second, over all callers
	providerBurst = 10
	egressBurst   = 5 // half the provider's: headroom for the time requests take to arrive
	latency       = 20 * time.Millisecond
)

// The streams of the first two runs, and the tenants of the third.
var (
	interactive = stream{
		name: "interactive", class: egress.Class{Priority: egress.PriorityHigh, Tenant: "web"},
		rate: 0.1 * limit, senders: 1, poisson: true, deadline: 2 * time.Second,
	}
	backfill = stream{
		name: "backfill", class: egress.Class{Priority: egress.PriorityLow, Tenant: "backfill"},
		rate: 4 * limit, senders: 4, deadline: 3 * time.Second,
	}
	tenants = []stream{
		{name: "light", class: egress.Class{Tenant: "light"}, rate: 5, senders: 1, poisson: true, deadline: time.Second},
		{name: "medium", class: egress.Class{Tenant: "medium"}, rate: 20, senders: 1, poisson: true, deadline: time.Second},
		{name: "heavy", class: egress.Class{Tenant: "heavy"}, rate: 100, senders: 2, poisson: true, deadline: time.Second},
	}
)

// Names of the runs.
const (
	nameArrival    = "arrival order"
	namePriorities = "WithPriorities"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := realMain(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// realMain is the program: it returns the exit status, 2 for invalid flags.
func realMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	s, err := parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		flags(&settings{}, stdout).Usage()
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "priorities: %v\n(run with -h for the flags)\n", err)
		return 2
	}
	if _, err := run(ctx, s, stdout); err != nil {
		fmt.Fprintln(stderr, "priorities:", err)
		return 1
	}
	return 0
}

// settings are the validated flags.
type settings struct {
	duration time.Duration // of each of the first two runs; the tenants' runs take 3/4 of it
	seed     uint64
}

// tenantDuration is the length of each of the tenants' runs.
func (s settings) tenantDuration() time.Duration { return s.duration * 3 / 4 }

// warmup is the start of a run left out of the tenants' rates: the time
// the queue takes to fill.
func (s settings) warmup() time.Duration { return s.tenantDuration() / 3 }

func flags(s *settings, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("priorities", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.DurationVar(&s.duration, "duration", 4*time.Second, "length of each of the first two runs (the tenants' runs take 3/4 of it)")
	fs.Uint64Var(&s.seed, "seed", 1, "seed of the random arrivals")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: go run ./examples/priorities [flags]\n\n"+
			"Shares one rate-limited API between interactive and backfill requests, and between\n"+
			"three tenants, without egress.WithPriorities then with it.\n\n")
		fs.PrintDefaults()
	}
	return fs
}

// parse reads and validates the flags; it prints nothing.
func parse(args []string) (settings, error) {
	var s settings
	fs := flags(&s, io.Discard)
	if err := fs.Parse(args); err != nil {
		return s, err
	}
	if fs.NArg() > 0 {
		return s, fmt.Errorf("unexpected argument %q: every setting is a flag", fs.Arg(0))
	}
	if s.duration < time.Second || s.duration > time.Minute {
		return s, fmt.Errorf("-duration %v: must be in [1s, 1m]", s.duration)
	}
	return s, nil
}

// stream is a source of requests of one Class, arriving whether or not
// the earlier ones are done, as clicks or a job's fan-out do.
type stream struct {
	name     string
	class    egress.Class
	rate     float64 // offered, requests per second over its senders
	senders  int     // goroutines starting its requests
	poisson  bool    // random arrivals (seeded); else evenly spaced
	deadline time.Duration
}

// label is the stream's name with its priority.
func (st stream) label() string { return fmt.Sprintf("%s (%s)", st.name, st.class.Priority) }

// tally is what one stream's requests came to in a run.
type tally struct {
	stream
	offered  int
	sent     int
	refused  int             // by egress, without sending
	late     int             // sent, but their deadline ended before the answer
	cut      int             // still waiting when the run ended
	failed   int             // any other error
	limited  int             // answered 429 by the provider
	waits    []time.Duration // before sending, sorted
	measured int             // sent after the warm-up
	arrived  int             // started after the warm-up
	wrongErr int             // refusals whose LimitError does not carry the request's Class
	queued   int             // OnQueued calls of its Class
}

func (t *tally) p(q float64) time.Duration {
	if len(t.waits) == 0 {
		return -1
	}
	return t.waits[int(math.Round(q*float64(len(t.waits)-1)))]
}

// result is one run.
type result struct {
	name     string
	tallies  []*tally
	upstream fakeapi.Stats // as the provider counted
	measured time.Duration // of the run, after the warm-up
}

// run is the demo: the two runs of the streams, then of the tenants. It
// prints to out and returns the four runs.
func run(ctx context.Context, s settings, out io.Writer) ([]result, error) {
	fmt.Fprintf(out, "A fake API on 127.0.0.1 accepts %d requests/s (burst %d); one egress Transport with a\n", limit, providerBurst)
	fmt.Fprintf(out, "TokenBucket of %d/s (burst %d) carries every request to it. Each run lasts %v.\n", limit, egressBurst, s.duration)
	fmt.Fprintf(out, "  %-22s %5.0f/s at random (a user clicking), each with a %v deadline\n",
		interactive.label(), interactive.rate, interactive.deadline)
	fmt.Fprintf(out, "  %-22s %5.0f/s from %d workers that do not wait for the last, each with a %v deadline\n",
		backfill.label(), backfill.rate, backfill.senders, backfill.deadline)

	var runs []result
	for _, prio := range []bool{false, true} {
		if err := ctx.Err(); err != nil {
			return runs, err
		}
		r, err := runOnce(ctx, prio, []stream{interactive, backfill}, s.duration, 0, s.seed)
		if err != nil {
			return runs, err
		}
		runs = append(runs, r)
	}
	reportStreams(out, runs[0], runs[1])

	fmt.Fprintf(out, "\nThree tenants of one priority (%s), each request with a %v deadline, for %v a run\n",
		tenants[0].class.Priority, tenants[0].deadline, s.tenantDuration())
	fmt.Fprintf(out, "(rates counted after the first %v, once the queue has filled):\n", s.warmup())
	for _, prio := range []bool{false, true} {
		if err := ctx.Err(); err != nil {
			return runs, err
		}
		r, err := runOnce(ctx, prio, tenants, s.tenantDuration(), s.warmup(), s.seed)
		if err != nil {
			return runs, err
		}
		runs = append(runs, r)
	}
	reportTenants(out, runs[2], runs[3])
	return runs, nil
}

// runOnce runs streams for d against a new fake API, through one egress
// Transport, with WithPriorities when prio is set. When d is over, the
// requests still waiting are cancelled; it returns once every one has.
func runOnce(ctx context.Context, prio bool, streams []stream, d, warmup time.Duration, seed uint64) (result, error) {
	api, err := fakeapi.Start(fakeapi.Config{Rate: limit, Burst: providerBurst, Advertise: true, Latency: latency, Seed: seed})
	if err != nil {
		return result{}, err
	}
	defer api.Close()
	conns := &http.Transport{MaxIdleConnsPerHost: 256}
	defer conns.CloseIdleConnections()
	res := result{name: nameArrival, measured: d - warmup, tallies: make([]*tally, len(streams))}
	byClass := map[egress.Class]*tally{}
	for i, st := range streams {
		res.tallies[i] = &tally{stream: st}
		byClass[st.class] = res.tallies[i]
	}
	var mu sync.Mutex // guards the tallies
	tr, err := newTransport(conns, prio, &mu, byClass)
	if err != nil {
		return result{}, err
	}
	if prio {
		res.name = namePriorities
	}
	client := &http.Client{Transport: tr}
	url := api.URL() + "/v1/charges"

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	end, from := start.Add(d), start.Add(warmup)
	var requests, senders sync.WaitGroup
	for i, st := range streams {
		t := res.tallies[i]
		for w := range st.senders {
			rng := rand.New(rand.NewPCG(seed, uint64(i*64+w)))
			senders.Add(1)
			go func() {
				defer senders.Done()
				arrivals(runCtx, st, w, rng, start, end, func() {
					requests.Add(1)
					go func() {
						defer requests.Done()
						o := call(runCtx, client, url, st)
						mu.Lock()
						defer mu.Unlock()
						t.add(o, prio, from)
					}()
				})
			}()
		}
	}
	senders.Wait()
	cancel() // the requests still waiting are cut
	requests.Wait()

	res.upstream = api.Stats(start)
	for _, t := range res.tallies {
		slices.Sort(t.waits)
	}
	return res, nil
}

// newTransport returns the Transport of a run over conns: a token bucket
// at the limit, with the priority classes when prio, whose queued requests
// are counted in byClass's tallies (under mu).
func newTransport(conns http.RoundTripper, prio bool, mu *sync.Mutex, byClass map[egress.Class]*tally) (*egress.Transport, error) {
	lim, err := egress.NewTokenBucket(egress.PerSecond(limit), egressBurst)
	if err != nil {
		return nil, err
	}
	opts := []egress.Option{egress.WithLimiter(lim)}
	if prio {
		opts = append(opts,
			egress.WithPriorities(egress.Priorities{}),
			egress.WithObserver(egress.Observer{OnQueued: func(_ string, c egress.Class, _ time.Duration) {
				mu.Lock()
				defer mu.Unlock()
				if t := byClass[c]; t != nil {
					t.queued++
				}
			}}))
	}
	return egress.New(probe{conns}, opts...)
}

// arrivals calls fire at each arrival of sender w of st from start until
// end (or ctx's end): evenly spaced, the senders out of phase, or at
// random (exponential gaps drawn from rng).
func arrivals(ctx context.Context, st stream, w int, rng *rand.Rand, start, end time.Time, fire func()) {
	perSender := st.rate / float64(st.senders)
	gap := time.Duration(float64(time.Second) / perSender)
	next := start.Add(gap * time.Duration(w) / time.Duration(st.senders))
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for {
		if st.poisson {
			next = next.Add(time.Duration(rng.ExpFloat64() / perSender * float64(time.Second)))
		}
		if !next.Before(end) {
			return
		}
		timer.Reset(time.Until(next))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		fire()
		if !st.poisson {
			next = next.Add(gap)
		}
	}
}

// outcome is what became of one request.
type outcome struct {
	start, sent time.Time // sent is zero when it was not sent
	status      int       // the provider's answer; 0 when none
	err         error
	late        bool // sent, but its deadline ended before the answer
	cut         bool // it was still waiting when the run ended
}

// call sends one request of st, with st's Class and deadline.
func call(ctx context.Context, client *http.Client, url string, st stream) outcome {
	var sent sentAt
	ctx, cancel := context.WithTimeout(ctx, st.deadline)
	defer cancel()
	reqCtx := context.WithValue(egress.WithClass(ctx, st.class), sentKey{}, &sent)
	req, err := http.NewRequestWithContext(reqCtx, http.MethodGet, url, nil)
	if err != nil {
		return outcome{err: err}
	}
	o := outcome{start: time.Now()}
	resp, err := client.Do(req)
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		o.status = resp.StatusCode
	}
	if ns := sent.Load(); ns != 0 {
		o.sent = time.Unix(0, ns)
	}
	o.err = err
	o.late = !o.sent.IsZero() && err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded)
	// A request not sent, and refused for no reason of egress's, was cut
	// by the end of the run.
	o.cut = o.sent.IsZero() && err != nil && !errors.Is(err, egress.ErrRateLimited) && ctx.Err() != nil
	return o
}

// add counts o, a request of t's stream; le's Class is checked when the
// run has priorities. The requests sent from on count in measured.
func (t *tally) add(o outcome, prio bool, from time.Time) {
	t.offered++
	if !o.start.Before(from) {
		t.arrived++
	}
	var le *egress.LimitError
	switch {
	case !o.sent.IsZero():
		t.sent++
		t.waits = append(t.waits, o.sent.Sub(o.start))
		if !o.sent.Before(from) {
			t.measured++
		}
		if o.late {
			t.late++
		}
		if o.status == http.StatusTooManyRequests {
			t.limited++
		}
	case errors.As(o.err, &le):
		t.refused++
		if prio && le.Class != t.class {
			t.wrongErr++
		}
	case o.cut:
		t.cut++
	default:
		t.failed++
	}
}

// sentAt is when a request left egress for the provider, in Unix
// nanoseconds; 0 until then.
type sentAt struct{ atomic.Int64 }

type sentKey struct{}

// probe is the Transport's base: it notes when each request is sent.
type probe struct{ base http.RoundTripper }

func (p probe) RoundTrip(req *http.Request) (*http.Response, error) {
	if s, ok := req.Context().Value(sentKey{}).(*sentAt); ok {
		s.CompareAndSwap(0, time.Now().UnixNano())
	}
	return p.base.RoundTrip(req)
}

// reportStreams prints the two runs of the streams, then what changed.
func reportStreams(out io.Writer, fifo, prio result) {
	fmt.Fprintf(out, "\n%-24s %7s %5s %7s %5s %9s %9s %5s\n",
		"", "offered", "sent", "refused", "late", "p50 wait", "p99 wait", "429s")
	for _, r := range []result{fifo, prio} {
		fmt.Fprintf(out, "%s\n", runTitle(r))
		for _, t := range r.tallies {
			fmt.Fprintf(out, "  %-22s %7d %5d %7d %5d %9s %9s %5d\n", t.label(), t.offered, t.sent, t.refused, t.late,
				round(t.p(0.50)), round(t.p(0.99)), t.limited)
		}
		fmt.Fprintf(out, "  (the provider accepted %d and answered %d with 429; %s)\n",
			r.upstream.Accepted, r.upstream.Limited, leftovers(r))
	}
	fmt.Fprintf(out, "refused: by egress, without sending, as the wait would outlast the deadline.\n"+
		"late: sent, but the deadline ended before the answer came.\n")
	fi, pi := fifo.tallies[0], prio.tallies[0]
	fb, pb := fifo.tallies[1], prio.tallies[1]
	fmt.Fprintf(out, "\nWith priorities the %s requests went ahead of the %s: their p99 wait went from %s to %s\n",
		pi.name, pb.name, round(fi.p(0.99)), round(pi.p(0.99)))
	fmt.Fprintf(out, "and %d of %d were refused instead of %d of %d, while the %s sent %d instead of %d.\n",
		pi.refused, pi.offered, fi.refused, fi.offered, pb.name, pb.sent, fb.sent)
}

// reportTenants prints the tenants' rates in the two runs beside their
// max-min fair shares, then what changed. The rates asked are counted in
// the first run: the arrivals are the same in both.
func reportTenants(out io.Writer, fifo, prio result) {
	asked := make([]float64, len(tenants))
	for i, t := range fifo.tallies {
		asked[i] = float64(t.arrived) / fifo.measured.Seconds()
	}
	fair := maxMin(asked, limit)
	fmt.Fprintf(out, "\n%-10s %7s %13s %20s %17s\n", "requests/s", "asked", "max-min fair", "sent: "+shortName(fifo), "sent: "+shortName(prio))
	for i, t := range fifo.tallies {
		fmt.Fprintf(out, "  %-8s %7.1f %13.1f %20.1f %17.1f\n", t.name, asked[i], fair[i], rateOf(fifo, i), rateOf(prio, i))
	}
	for _, r := range []result{fifo, prio} {
		var refused, late, limited int
		for _, t := range r.tallies {
			refused, late, limited = refused+t.refused, late+t.late, limited+t.limited
		}
		fmt.Fprintf(out, "  (%s: %d refused, %d late, %d answered 429 by the provider; %s)\n",
			shortName(r), refused, late, limited, leftovers(r))
	}
	light, heavy := 0, len(tenants)-1
	fmt.Fprintf(out, "\nIn arrival order %s got %.1f/s of the %.1f/s it asked for and %s %.1f/s; with priorities\n"+
		"%s got %.1f/s and %s %.1f/s, against a max-min split of %.1f and %.1f.\n",
		tenants[light].name, rateOf(fifo, light), asked[light], tenants[heavy].name, rateOf(fifo, heavy),
		tenants[light].name, rateOf(prio, light), tenants[heavy].name, rateOf(prio, heavy), fair[light], fair[heavy])
}

// maxMin splits capacity between demands max-min fairly: each gets its
// demand or an equal share of what the smaller demands leave, whichever
// is less.
func maxMin(demands []float64, capacity float64) []float64 {
	share := make([]float64, len(demands))
	order := make([]int, len(demands))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return int(math.Copysign(1, demands[a]-demands[b])) })
	left := capacity
	for n, i := range order {
		share[i] = min(demands[i], left/float64(len(order)-n))
		left -= share[i]
	}
	return share
}

func rateOf(r result, i int) float64 { return float64(r.tallies[i].measured) / r.measured.Seconds() }

func runTitle(r result) string {
	if r.name == nameArrival {
		return "without WithPriorities (arrival order)"
	}
	return "with WithPriorities"
}

func shortName(r result) string {
	if r.name == nameArrival {
		return "arrival order"
	}
	return "priorities"
}

// leftovers says how many requests the end of the run cut, and any that
// failed otherwise.
func leftovers(r result) string {
	var cut, failed, wrong int
	for _, t := range r.tallies {
		cut += t.cut
		failed += t.failed
		wrong += t.wrongErr
	}
	s := fmt.Sprintf("%d still waiting at the end were cancelled", cut)
	if failed > 0 {
		s += fmt.Sprintf("; %d failed otherwise", failed)
	}
	if wrong > 0 {
		s += fmt.Sprintf("; %d refusals without their request's class", wrong)
	}
	return s
}

func round(d time.Duration) string {
	switch {
	case d < 0:
		return "–"
	case d < 10*time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	}
	return d.Round(time.Millisecond).String()
}
