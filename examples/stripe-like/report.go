package main

import (
	"fmt"
	"io"
	"time"

	"github.com/egress-go/egress/examples/internal/demo"
)

const (
	labelWidth = 42
	colWidth   = 16
)

// report prints the runs side by side, then a chart of the charges
// accepted per second; source says where the upstream counts come from.
func report(out io.Writer, s settings, source string, runs []result) {
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
	fleet := s.role != "api"
	row("charges accepted (200)", func(r result) string { return fmt.Sprint(r.upstream.Accepted) })
	row("429s received", func(r result) string { return fmt.Sprint(r.upstream.Limited) })
	row("503s received", func(r result) string { return fmt.Sprint(r.upstream.Unavailable) })
	row("upstream requests", func(r result) string { return fmt.Sprint(r.upstream.Requests) })
	if fleet {
		row("failed charges (after retries)", func(r result) string { return fmt.Sprint(r.failed) })
		row("retries", func(r result) string { return fmt.Sprint(r.retries) })
		row("pauses learnt from the provider", func(r result) string { return egressOnly(r, r.pauses) })
		row("refused by egress (not sent)", func(r result) string { return egressOnly(r, r.refused) })
		row("p50 latency of a successful charge", func(r result) string { return round(r.p50) })
		row("p99 latency of a successful charge", func(r result) string { return round(r.p99) })
	}
	row(fmt.Sprintf("max accepted in any 1 s (limit %g + %d)", limitRate(s), s.burst),
		func(r result) string { return fmt.Sprint(r.upstream.MaxPerSecond) })
	fmt.Fprintf(out, "\n(upstream figures: %s)\n", source)
	chart(out, s, runs)
}

// chart draws the charges accepted in each second of each run, with the
// provider's rate marked.
func chart(out io.Writer, s settings, runs []result) {
	scale := float64(limitRate(s)) + float64(s.burst)
	for _, r := range runs {
		for _, n := range r.upstream.PerSecond {
			scale = max(scale, float64(n))
		}
	}
	mark := int(limitRate(s) / scale * demo.BarWidth)
	fmt.Fprintf(out, "\ncharges accepted per second (│ marks the provider's %g/s)\n", limitRate(s))
	for _, r := range runs {
		fmt.Fprintf(out, "  %s\n", r.name)
		for i, n := range r.upstream.PerSecond {
			note := ""
			if s.duration > 0 && time.Duration(i)*time.Second >= s.duration {
				note = "  after the end: charges already under way"
			}
			fmt.Fprintf(out, "  %4ds %s %4d%s\n", i, demo.Bar(int(float64(n)/scale*demo.BarWidth+0.5), mark), n, note)
		}
	}
}

// limitRate is the rate the report compares with: what the provider
// enforces when this process knows it, else the documented rate.
func limitRate(s settings) float64 {
	if s.role == "client" {
		return s.rate
	}
	return s.providerRate
}

func egressOnly(r result, n int64) string {
	if r.name != nameEgress {
		return "–"
	}
	return fmt.Sprint(n)
}

func round(d time.Duration) string {
	switch {
	case d == 0:
		return "–"
	case d < 10*time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	}
	return d.Round(time.Millisecond).String()
}
