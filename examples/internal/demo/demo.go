// Package demo holds what the examples share: the bars of their charts.
// (The naive client they run beside egress is internal/naive.)
package demo

import "strings"

// BarWidth is the cells of a chart's bar at the chart's scale.
const BarWidth = 40

// Bar is a bar of n cells in a field of BarWidth, with the mark drawn where
// the bar does not reach it.
func Bar(n, mark int) string {
	var b strings.Builder
	for i := range BarWidth + 1 {
		switch {
		case i < n:
			b.WriteString("█")
		case i == mark:
			b.WriteString("│")
		default:
			b.WriteByte(' ')
		}
	}
	return b.String()
}
