package main

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The fleet runs a bounded number of charges against the provider, then the
// test scrapes /metrics over HTTP and checks the figures against what the
// provider counted and what the fleet saw.
func TestMetricsMatchTheProvider(t *testing.T) {
	s := settings{
		rate: 30, providerRate: 20, burst: 4, // the provider enforces less than it documents: 429s
		instances: 2, workers: 3,
		duration: 5 * time.Second, requests: 40,
	}
	d, err := newDemo(s, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: d.Handler(), ReadHeaderTimeout: time.Second}
	go srv.Serve(ln)
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := d.Run(ctx)
	if r.calls != s.requests || r.failed != 0 {
		t.Fatalf("fleet: %+v, want %d charges and no failure", r, s.requests)
	}

	m := scrape(t, "http://"+ln.Addr().String()+"/metrics")
	received := float64(d.provider.received.Load())
	accepted := float64(d.provider.accepted.Load())
	throttled := float64(d.provider.throttled.Load())
	t.Logf("provider: %v received, %v accepted, %v answered 429; fleet %+v", received, accepted, throttled, r)
	if throttled == 0 {
		t.Log("the provider answered no 429: the 429 checks hold trivially")
	}

	sent := m.sum("egress_requests_total", "egress_result", "sent")
	waited := m.sum("egress_requests_total", "egress_result", "waited")
	refused := m.sum("egress_requests_total", "egress_result", "refused")
	retries := m.sum("egress_retries_total", "", "")
	checks := []struct {
		what      string
		got, want float64
	}{
		{"requests sent at once or after a wait = requests the provider received", sent + waited, received},
		{"attempts = requests the provider received", m.sum("egress_attempts_total", "", ""), received},
		{"attempts answered 200 = charges the provider accepted", m.sum("egress_attempts_total", "http_response_status_code", "200"), accepted},
		{"attempts answered 429 = 429s the provider sent", m.sum("egress_attempts_total", "http_response_status_code", "429"), throttled},
		{"charges succeeded = charges the provider accepted", float64(r.ok), accepted},
		{"requests through the limiter = charges + retries", sent + waited + refused, float64(r.calls) + retries},
		{"requests refused = charges refused by egress", refused, float64(r.refused)},
		{"retries for a 429 + charges ended in 429 = 429s sent", m.sum("egress_retries_total", "egress_retry_cause", "throttled") + float64(r.throttled), throttled},
		{"waits timed = requests that waited", m.sum("egress_wait_duration_seconds_count", "", ""), waited},
		{"requests waiting now", m.sum("egress_requests_waiting", "", ""), 0},
		{"requests in flight now", m.sum("egress_requests_in_flight", "", ""), 0},
		{"the provider's reported limit", m.sum("egress_provider_limit", "egress_quota_dimension", "requests"), float64(s.burst)},
		{"a rate gauge per pod", float64(len(m["egress_rate_effective_per_second"])), float64(s.instances)},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.what, c.got, c.want)
		}
	}
	if rem := m["egress_provider_remaining"]; len(rem) != 1 || rem[0].value < 0 || rem[0].value > float64(s.burst) {
		t.Errorf("egress_provider_remaining = %+v, want one series within [0, %d]", rem, s.burst)
	}
	for _, p := range m["egress_rate_effective_per_second"] {
		if p.value <= 0 || p.value > s.rate/float64(s.instances) {
			t.Errorf("egress_rate_effective_per_second%v = %v, want within (0, %v]", p.labels, p.value, s.rate/float64(s.instances))
		}
	}
	if pauses := m.sum("egress_pauses_total", "", ""); pauses > throttled {
		t.Errorf("pauses %v > 429s %v", pauses, throttled)
	}
}

// sample is one line of the exposition: its labels and value.
type sample struct {
	labels map[string]string
	value  float64
}

// scraped are the samples of a scrape by metric name.
type scraped map[string][]sample

// sum adds the values of name's samples whose label has the value given
// (every sample when label is "").
func (m scraped) sum(name, label, value string) float64 {
	total := 0.0
	for _, s := range m[name] {
		if label == "" || s.labels[label] == value {
			total += s.value
		}
	}
	return total
}

// scrape reads the text exposition at url: lines of name{labels} value.
func scrape(t *testing.T, url string) scraped {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %s: %s", url, resp.Status, b)
	}
	m := scraped{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			t.Fatalf("bad sample %q: %v", line, err)
		}
		name, labels := line[:sp], map[string]string{}
		if i := strings.IndexByte(name, '{'); i >= 0 {
			for _, kv := range strings.Split(strings.TrimSuffix(name[i+1:], "}"), ",") {
				k, val, _ := strings.Cut(kv, "=")
				labels[k] = strings.Trim(val, `"`)
			}
			name = name[:i]
		}
		m[name] = append(m[name], sample{labels, v})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestInvalidFlags(t *testing.T) {
	for _, args := range [][]string{{"-rate", "0"}, {"-instances", "0"}, {"-requests", "-1"}, {"-nope"}} {
		if _, err := parse(args); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
