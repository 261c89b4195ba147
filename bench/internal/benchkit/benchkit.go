// Package benchkit holds what the bench module's scenario tests share: the
// markdown tables and the formats of their cells, the machine a run was
// measured on, the pods' connection pools and Redis clients, and the
// check that a run leaves no goroutine behind.
package benchkit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Markdown returns a markdown table with its columns padded to line up; a
// column whose every cell starts with a digit is right-aligned.
func Markdown(header []string, rows [][]string) string {
	widths := make([]int, len(header))
	for i, h := range header {
		widths[i] = utf8.RuneCountInString(h)
	}
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	numeric := make([]bool, len(header))
	for i := range header {
		numeric[i] = len(rows) > 0
		for _, r := range rows {
			numeric[i] = numeric[i] && startsWithDigit(r[i])
		}
	}
	var b strings.Builder
	line := func(cells []string, right []bool) {
		b.WriteString("|")
		for i, c := range cells {
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c))
			if right != nil && right[i] {
				fmt.Fprintf(&b, " %s%s |", pad, c)
			} else {
				fmt.Fprintf(&b, " %s%s |", c, pad)
			}
		}
		b.WriteString("\n")
	}
	line(header, nil)
	b.WriteString("|")
	for i, w := range widths {
		if numeric[i] {
			fmt.Fprintf(&b, " %s: |", strings.Repeat("-", max(w-1, 2)))
		} else {
			fmt.Fprintf(&b, " %s |", strings.Repeat("-", max(w, 3)))
		}
	}
	b.WriteString("\n")
	for _, r := range rows {
		line(r, numeric)
	}
	return b.String()
}

func startsWithDigit(s string) bool { return s != "" && s[0] >= '0' && s[0] <= '9' }

// Count formats n with its thousands separated: 12,345.
func Count(n int) string {
	s := fmt.Sprint(n)
	if n < 0 || len(s) <= 3 {
		return s
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// Ms formats a latency in milliseconds, or seconds from 10 s.
func Ms(d time.Duration) string {
	switch {
	case d == 0:
		return "–"
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	case d < 10*time.Second:
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
}

// Secs formats d in seconds, to a tenth.
func Secs(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }

// Percent formats a share as a percentage, to a tenth.
func Percent(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) }

// Quantile returns the q-quantile of sorted, 0 when it is empty.
func Quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(q*float64(len(sorted)-1))]
}

// CheckGoroutines fails t when more goroutines run than before, once grace
// has passed for them to end.
func CheckGoroutines(t testing.TB, before int, grace time.Duration) {
	t.Helper()
	deadline := time.Now().Add(grace)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		var b strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
		t.Errorf("%d goroutines left running (%d before the runs):\n%s", n-before, before, b.String())
	}
}

// Machine describes where the figures were measured.
func Machine() string {
	model := "unknown CPU"
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if name, ok := strings.CutPrefix(line, "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(name), ":"))
				break
			}
		}
	}
	return fmt.Sprintf("%s, %d CPUs (GOMAXPROCS %d), %s %s/%s; load average before the run: %s.",
		model, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), runtime.GOOS, runtime.GOARCH, LoadAvg())
}

// LoadAvg is the 1, 5 and 15 minute load averages, or "n/a".
func LoadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "n/a"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "n/a"
	}
	return strings.Join(f[:3], " ")
}

// Sleep waits d, or returns ctx's error if ctx ends first.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Pods owns the pods' own connection pools and Redis clients, and closes
// them. Safe for concurrent use; the zero value is ready.
type Pods struct {
	mu      sync.Mutex
	closers []func() error // guarded by mu
}

// Pool returns a new pod's own connection pool.
func (p *Pods) Pool(workers int) *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = workers
	p.Add(func() error { tr.CloseIdleConnections(); return nil })
	return tr
}

// Redis returns a new pod's own Redis client.
func (p *Pods) Redis(addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{
		Addr:                     addr,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	p.Add(rdb.Close)
	return rdb
}

// Add registers f to run at Close, before what was made earlier (a
// limiter before its Redis client).
func (p *Pods) Add(f func() error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closers = append(p.closers, f)
}

// Close closes every pool and client, the last made first.
func (p *Pods) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for i := len(p.closers) - 1; i >= 0; i-- {
		errs = append(errs, p.closers[i]())
	}
	p.closers = nil
	return errors.Join(errs...)
}
