package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// settings are the validated flags.
type settings struct {
	role string // "all", "api" or "client"

	rate         float64 // the limit as documented: what the clients are configured with
	burst        int     // the provider's burst; egress takes half of it (see egressBurst)
	providerRate float64 // what the API enforces; default rate

	instances int
	workers   int
	duration  time.Duration // of each run; for -role api, 0 serves until interrupted
	mode      string        // "token" or "leaky"

	redisURL string // "" runs in-process limiters
	apiURL   string // -role client: the API to call; -role api: where to listen

	latency   time.Duration // the API's, on every response
	errors    float64       // share of 503s the API injects
	advertise bool          // the API advertises its limit in headers
	adaptive  bool          // egress discovers an unadvertised limit (on by default; off is WithoutDiscovery)
}

// Bounds of the flags, so that a demo stays a demo.
const (
	maxRate      = 1_000_000
	maxBurst     = 1_000_000
	maxInstances = 256
	maxWorkers   = 256
	maxDuration  = 10 * time.Minute
	maxLatency   = 10 * time.Second
)

// flags declares the flags on a new FlagSet writing to out; set receives
// them.
func flags(set *settings, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("stripe-like", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&set.role, "role", "all", "all: API and fleet in this process; api: only the fake API; client: only a fleet (needs -api and -redis)")
	fs.Float64Var(&set.rate, "rate", 50, "the provider's documented limit, requests per second over the whole fleet: what egress is configured with")
	fs.IntVar(&set.burst, "burst", 10, "the provider's burst; egress uses half of it, to leave headroom")
	fs.Float64Var(&set.providerRate, "provider-rate", 0, "the rate the fake API actually enforces (default, or 0: -rate)")
	fs.IntVar(&set.instances, "instances", 4, "simulated pods, each with its own http.Client and limiter")
	fs.IntVar(&set.workers, "workers", 8, "goroutines per pod, each charging as fast as it can")
	fs.DurationVar(&set.duration, "duration", 10*time.Second, "length of each run (-role api: how long to serve; default until interrupted)")
	fs.StringVar(&set.mode, "mode", "token", "egress limiter: token (token bucket) or leaky (smooth pacing)")
	fs.StringVar(&set.redisURL, "redis", "", "coordinate the fleet through this Redis, e.g. redis://127.0.0.1:6379/0")
	fs.StringVar(&set.apiURL, "api", "", "-role client: the API's URL; -role api: where to listen, e.g. http://127.0.0.1:8080")
	fs.DurationVar(&set.latency, "latency", 20*time.Millisecond, "the fake API's latency, on every response")
	fs.Float64Var(&set.errors, "errors", 0.02, "share of requests within the limit that the fake API answers 503")
	fs.BoolVar(&set.advertise, "advertise", true, "the fake API advertises its limit in RateLimit and X-RateLimit headers")
	fs.BoolVar(&set.adaptive, "adaptive", true, "egress discovers an unadvertised limit from 429s (-adaptive=false: WithoutDiscovery)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: go run ./examples/stripe-like [flags]\n\n"+
			"Runs a fleet against a rate-limited fake payments API, without egress then with it.\n\n")
		fs.PrintDefaults()
	}
	return fs
}

// parse reads and validates the flags. It prints nothing: a flag it cannot
// read, a value out of range or a flag that does not apply to the role is
// an error naming the flag; -h is flag.ErrHelp.
func parse(args []string) (settings, error) {
	var s settings
	fs := flags(&s, io.Discard)
	if err := fs.Parse(args); err != nil {
		return s, err
	}
	if fs.NArg() > 0 {
		return s, fmt.Errorf("unexpected argument %q: every setting is a flag", fs.Arg(0))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if s.role == "api" && !given["duration"] {
		s.duration = 0
	}
	if err := errors.Join(s.validate(), checkRole(s.role, given)); err != nil {
		return s, err
	}
	if s.providerRate == 0 {
		s.providerRate = s.rate
	}
	return s, nil
}

// validate checks every value, naming the flag of each one out of range.
func (s settings) validate() error {
	var errs []error
	bad := func(name string, v any, why string) { errs = append(errs, fmt.Errorf("-%s %v: %s", name, v, why)) }
	if !slices.Contains(allRoles, s.role) {
		bad("role", s.role, "must be all, api or client")
	}
	if !slices.Contains([]string{"token", "leaky"}, s.mode) {
		bad("mode", s.mode, "must be token or leaky")
	}
	if !(s.rate > 0 && s.rate <= maxRate) {
		bad("rate", s.rate, fmt.Sprintf("must be a number of requests per second in (0, %d]", maxRate))
	}
	if s.providerRate != 0 && !(s.providerRate > 0 && s.providerRate <= maxRate) {
		bad("provider-rate", s.providerRate, fmt.Sprintf("must be a number of requests per second in (0, %d]", maxRate))
	}
	if s.burst < 1 || s.burst > maxBurst {
		bad("burst", s.burst, fmt.Sprintf("must be in [1, %d]", maxBurst))
	}
	if s.instances < 1 || s.instances > maxInstances {
		bad("instances", s.instances, fmt.Sprintf("must be in [1, %d]", maxInstances))
	}
	if s.workers < 1 || s.workers > maxWorkers {
		bad("workers", s.workers, fmt.Sprintf("must be in [1, %d]", maxWorkers))
	}
	if s.duration < 0 || s.duration > maxDuration || (s.duration == 0 && s.role != "api") {
		bad("duration", s.duration, fmt.Sprintf("must be positive and at most %v", maxDuration))
	}
	if s.latency < 0 || s.latency > maxLatency {
		bad("latency", s.latency, fmt.Sprintf("must be in [0, %v]", maxLatency))
	}
	if !(s.errors >= 0 && s.errors <= 1) { // NaN too
		bad("errors", s.errors, "must be a share in [0, 1]")
	}
	if s.redisURL != "" {
		if _, err := redis.ParseURL(s.redisURL); err != nil {
			bad("redis", fmt.Sprintf("%q", s.redisURL), err.Error())
		}
	}
	if s.apiURL != "" {
		if err := checkAPIURL(s.apiURL); err != nil {
			bad("api", fmt.Sprintf("%q", s.apiURL), err.Error())
		}
	}
	return errors.Join(errs...)
}

var allRoles = []string{"all", "api", "client"}

// roleFlags lists the flags that apply to only some roles.
var roleFlags = map[string][]string{
	"api":           {"api", "client"},
	"redis":         {"all", "client"},
	"instances":     {"all", "client"},
	"workers":       {"all", "client"},
	"mode":          {"all", "client"},
	"provider-rate": {"all", "api"},
	"latency":       {"all", "api"},
	"errors":        {"all", "api"},
	"advertise":     {"all", "api"},
	"adaptive":      {"all", "client"},
}

// checkRole refuses flags that the role would ignore, and requires what
// -role client needs.
func checkRole(role string, given map[string]bool) error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(given)) {
		if roles, ok := roleFlags[name]; ok && slices.Contains(allRoles, role) && !slices.Contains(roles, role) {
			errs = append(errs, fmt.Errorf("-%s does not apply to -role %s (only to -role %s)", name, role, strings.Join(roles, " or ")))
		}
	}
	if role == "client" && (!given["api"] || !given["redis"]) {
		errs = append(errs, errors.New("-role client needs -api and -redis: the client processes share one API and coordinate through one Redis"))
	}
	return errors.Join(errs...)
}

// checkAPIURL accepts http://host:port, with no path.
func checkAPIURL(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return err
	case u.Scheme != "http":
		return errors.New("must be an http:// URL, e.g. http://127.0.0.1:8080")
	case u.Hostname() == "" || u.Port() == "":
		return errors.New("must name a host and a port, e.g. http://127.0.0.1:8080")
	case u.Path != "" && u.Path != "/", u.RawQuery != "", u.User != nil:
		return errors.New("must be the API's base URL: no path, query or user")
	}
	return nil
}

// egressBurst is the burst egress is configured with: half the provider's.
// The provider's bucket and egress's are not in step (requests take a
// varying time to arrive), so egress leaves headroom rather than spend the
// provider's whole burst.
func (s settings) egressBurst() int { return max(1, s.burst/2) }

// queueDepth is the leaky bucket's queue: room for every worker of this
// process, and for two seconds of the fleet's traffic.
func (s settings) queueDepth() int {
	return max(s.instances*s.workers, int(math.Ceil(2*s.rate)))
}
