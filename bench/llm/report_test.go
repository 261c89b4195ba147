package llm

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// goroutineLeakGrace is how long goroutines have to end after the last row.
const goroutineLeakGrace = 5 * time.Second

// markdown returns a markdown table with its columns padded to line up; a
// column whose every cell starts with a digit is right-aligned.
func markdown(header []string, rows [][]string) string {
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

// count formats n with its thousands separated: 12,345.
func count(n int) string {
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

// ms formats a latency in milliseconds, or seconds from 10 s.
func ms(d time.Duration) string {
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

func percent(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) }

// checkGoroutines fails the test when more goroutines run than before it,
// once every row has been closed and a grace period has passed.
func checkGoroutines(t *testing.T, before int) {
	deadline := time.Now().Add(goroutineLeakGrace)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		var b strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
		t.Errorf("%d goroutines left running (%d before the rows):\n%s", n-before, before, b.String())
	}
}

// machine describes where the figures were measured.
func machine() string {
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
		model, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), runtime.GOOS, runtime.GOARCH, loadAvg())
}

// loadAvg is the 1, 5 and 15 minute load averages, or "n/a".
func loadAvg() string {
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
