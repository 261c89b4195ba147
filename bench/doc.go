// Package benchpeers holds benchmarks that compare egress with its peers.
// It is its own module so that the peer libraries never enter egress's
// go.mod. Everything is in _test.go files; see BENCHMARKS.md at the repo root.
package benchpeers
