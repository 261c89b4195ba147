package main

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestDemo runs the demo for 2 s a run (1.5 s for the tenants) and checks
// what it promises: with priorities the interactive requests wait less and
// are not refused, the backfill still gets most of the limit, and the
// light tenant gets what it asks for.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo on the real clock: make test runs it, make fast (-short) does not")
	}
	s := settings{duration: 2 * time.Second, seed: 1}
	var out bytes.Buffer
	runs, err := run(t.Context(), s, &out)
	require.NoError(t, err)
	t.Log("\n" + out.String())
	require.Len(t, runs, 4)
	fifo, prio, tFifo, tPrio := runs[0], runs[1], runs[2], runs[3]
	for i, r := range runs {
		assert.Equal(t, []string{nameArrival, namePriorities}[i%2], r.name)
		for _, tl := range r.tallies {
			assert.Zero(t, tl.failed, "%s, %s: requests that failed for no reason of the demo's", r.name, tl.name)
			assert.Zero(t, tl.wrongErr, "%s, %s: refusals without the request's Class", r.name, tl.name)
			if r.name == nameArrival {
				assert.Zero(t, tl.queued, "%s, %s: OnQueued without WithPriorities", r.name, tl.name)
			}
		}
		assert.LessOrEqual(t, r.upstream.Limited, 5, "%s: 429s from the provider", r.name)
	}

	fi, pi := fifo.tallies[0], prio.tallies[0]
	fb, pb := fifo.tallies[1], prio.tallies[1]
	require.Equal(t, fi.offered, pi.offered, "the same clicks in both runs")
	assert.Zero(t, pi.refused, "interactive refused with priorities")
	assert.Equal(t, pi.offered, pi.sent+pi.cut, "every click sent with priorities (but those cut by the end)")
	assert.Greater(t, fi.refused, pi.refused, "interactive refused: more in arrival order")
	assert.Less(t, pi.p(0.99), 200*time.Millisecond, "interactive p99 wait with priorities")
	if fi.sent > 0 {
		assert.Less(t, pi.p(0.99), fi.p(0.99), "interactive p99 wait: lower with priorities")
	}
	assert.Positive(t, pi.queued, "OnQueued told of the interactive requests that waited")
	assert.Positive(t, pb.queued, "OnQueued told of the backfill requests that waited")
	// The backfill keeps the rest of the limit: together the two streams
	// send at least 80% of it.
	floor := int(0.8 * limit * s.duration.Seconds())
	assert.GreaterOrEqual(t, fi.sent+fb.sent, floor, "sent in arrival order")
	assert.GreaterOrEqual(t, pi.sent+pb.sent, floor, "sent with priorities")

	light, heavy := 0, len(tenants)-1
	assert.GreaterOrEqual(t, tPrio.tallies[light].measured, tPrio.tallies[light].arrived*8/10,
		"the light tenant gets what it asks with priorities")
	assert.Greater(t, rateOf(tPrio, light), rateOf(tFifo, light), "the light tenant: more with priorities")
	assert.Less(t, rateOf(tPrio, heavy), rateOf(tFifo, heavy), "the heavy tenant: less with priorities")

	text := out.String()
	for _, want := range []string{"p99 wait", "without WithPriorities (arrival order)", "with WithPriorities", "max-min fair"} {
		assert.Contains(t, text, want)
	}
}

func TestFlags(t *testing.T) {
	var stdout, stderr bytes.Buffer
	assert.Equal(t, 2, realMain(t.Context(), []string{"-duration", "1ms"}, &stdout, &stderr))
	assert.Contains(t, stderr.String(), "-duration 1ms")
	assert.Equal(t, 2, realMain(t.Context(), []string{"extra"}, io.Discard, &stderr))
	assert.Equal(t, 0, realMain(t.Context(), []string{"-h"}, &stdout, io.Discard))
	assert.Contains(t, stdout.String(), "go run ./examples/priorities")
}
