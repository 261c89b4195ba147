package main

import (
	"fmt"
	"io"
	"time"

	"github.com/egress-go/egress/examples/internal/demo"
)

const (
	labelWidth = 46
	colWidth   = 16
)

// report prints the runs side by side, then a chart of the tokens the
// provider accepted in each period.
func report(out io.Writer, s settings, runs []result) {
	fmt.Fprintf(out, "\n%-*s", labelWidth, "")
	for _, r := range runs {
		fmt.Fprintf(out, "%*s", colWidth, r.name)
	}
	row := func(label string, f func(result) string) {
		fmt.Fprintf(out, "\n%-*s", labelWidth, label)
		for _, r := range runs {
			fmt.Fprintf(out, "%*s", colWidth, f(r))
		}
	}
	after := afterFirst(s)
	row("requests accepted (200)", func(r result) string { return fmt.Sprint(r.provider.Accepted) })
	row("429s received", func(r result) string { return fmt.Sprint(r.limited) })
	row("429s after the first second", func(r result) string { return fmt.Sprint(r.late) })
	row("failed calls (after retries)", func(r result) string { return fmt.Sprint(r.failed) })
	row("retries", func(r result) string { return fmt.Sprint(r.retries) })
	row("refused by egress (not sent)", func(r result) string { return egressOnly(r, r.refused) })
	row("tokens accepted per second", func(r result) string { return fmt.Sprintf("%.0f", tokensPerSecond(r)) })
	row(fmt.Sprintf("utilisation of TPM, %s", after), func(r result) string {
		return percent(tokenUtilisation(s, r))
	})
	row(fmt.Sprintf("utilisation of RPM, %s", after), func(r result) string {
		return percent(requestUtilisation(s, r))
	})
	row(fmt.Sprintf("peak tokens in use (limit %d)", s.tpm), func(r result) string { return fmt.Sprint(r.provider.TPM.Peak) })
	row("p50 latency of a successful call", func(r result) string { return round(r.p50) })
	row("p99 latency of a successful call", func(r result) string { return round(r.p99) })
	fmt.Fprintf(out, "\n(the provider's count, but 429s and latencies as the clients saw them)\n")
	chart(out, s, runs)
}

// afterFirst names the periods the utilisation is measured over.
func afterFirst(s settings) string {
	if n := s.periods(); n > 2 {
		return fmt.Sprintf("periods 2–%d", n)
	}
	return "period 2"
}

// tokensPerSecond is the tokens the provider charged over the run.
func tokensPerSecond(r result) float64 {
	return float64(r.provider.InputTokens+r.provider.OutputTokens) / r.elapsed.Seconds()
}

// tokenUtilisation is the tokens the provider charged in the whole periods
// of the run after the first (the first has the bucket's initial burst),
// over TPM per period.
func tokenUtilisation(s settings, r result) float64 {
	sum, n := 0, 0
	for i := 1; i < s.periods() && i < len(r.provider.Windows); i++ {
		sum += r.provider.Windows[i].Tokens()
		n++
	}
	return ratio(sum, n*s.tpm)
}

// requestUtilisation is tokenUtilisation for requests and RPM.
func requestUtilisation(s settings, r result) float64 {
	sum, n := 0, 0
	for i := 1; i < s.periods() && i < len(r.provider.Windows); i++ {
		sum += r.provider.Windows[i].Accepted
		n++
	}
	return ratio(sum, n*s.rpm)
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// chart draws the tokens the provider accepted in each period of each run,
// with its TPM marked.
func chart(out io.Writer, s settings, runs []result) {
	scale := 1.25 * float64(s.tpm)
	for _, r := range runs {
		for _, w := range r.provider.Windows {
			scale = max(scale, float64(w.Tokens()))
		}
	}
	mark := int(float64(s.tpm) / scale * demo.BarWidth)
	fmt.Fprintf(out, "\ntokens accepted per period of %v (│ marks the provider's %d)\n", s.minute, s.tpm)
	for _, r := range runs {
		fmt.Fprintf(out, "  %s\n", r.name)
		for i, w := range r.provider.Windows {
			note := ""
			switch {
			case i == 0:
				note = "  the first: the bucket starts full"
			case i >= s.periods():
				note = "  after the end: calls already under way"
			}
			n := w.Tokens()
			fmt.Fprintf(out, "  %5s %s %7d%s\n", period(s, i), demo.Bar(int(float64(n)/scale*demo.BarWidth+0.5), mark), n, note)
		}
	}
}

// period labels period i by its start, in seconds from the run's start.
func period(s settings, i int) string {
	return fmt.Sprintf("%gs", (time.Duration(i) * s.minute).Seconds())
}

func egressOnly(r result, n int64) string {
	if r.name != nameEgress {
		return "–"
	}
	return fmt.Sprint(n)
}

func percent(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) }

func round(d time.Duration) string {
	switch {
	case d == 0:
		return "–"
	case d < 10*time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	}
	return d.Round(time.Millisecond).String()
}
