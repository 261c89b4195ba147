package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/egress-go/egress/internal/fakeapi"
	"github.com/egress-go/egress/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// maxEgress429s is the handful of 429s the egress run may receive.
const maxEgress429s = 5

// mustParse parses flags that are valid.
func mustParse(t *testing.T, args ...string) settings {
	t.Helper()
	s, err := parse(args)
	require.NoError(t, err)
	return s
}

// checkRuns asserts what the demo promises: the naive fleet gets the 429
// storm; egress gets close to the provider's limit, with a handful of 429s
// at most, and never more than the provider's rate + burst in any second.
func checkRuns(t *testing.T, s settings, runs []result) {
	t.Helper()
	require.Len(t, runs, 2)
	naive, shaped := runs[0], runs[1]
	assert.Equal(t, nameNaive, naive.name)
	assert.Equal(t, nameEgress, shaped.name)

	limit := int(s.providerRate) + s.burst
	assert.LessOrEqual(t, shaped.upstream.Limited, maxEgress429s, "429s with egress")
	assert.LessOrEqual(t, shaped.upstream.MaxPerSecond, limit, "egress: max accepted in any 1 s")
	assert.Greater(t, naive.upstream.Limited, shaped.upstream.Limited, "the naive fleet gets more 429s")
	// (A storm: several 429s for each success. Under -race on a loaded
	// 2-core machine the naive client role's fleet sent 9.8 for each.)
	assert.Greater(t, naive.upstream.Limited, 5*naive.upstream.Accepted, "the naive fleet's 429 storm")
	assert.Greater(t, naive.failed, shaped.failed, "failed charges")

	// egress uses the limit: at least 80% of rate × duration.
	floor := int(0.8 * s.providerRate * s.duration.Seconds())
	assert.GreaterOrEqual(t, shaped.upstream.Accepted, floor, "charges accepted with egress")
	assert.Equal(t, shaped.upstream.Accepted, shaped.charges, "every accepted request is a successful charge")
}

func TestDemoInProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo on the real clock: make test runs it, make fast (-short) does not")
	}
	cases := []struct {
		name string
		args []string
	}{
		{"token bucket", []string{"-duration", "3s"}},
		{"leaky bucket", []string{"-duration", "2s", "-mode", "leaky", "-instances", "3", "-workers", "6"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := mustParse(t, c.args...)
			var out bytes.Buffer
			runs, err := run(t.Context(), s, &out)
			require.NoError(t, err)
			checkRuns(t, s, runs)

			text := out.String()
			for _, want := range []string{
				"— without egress", "— with egress", "waiting",
				"429s received", "max accepted in any 1 s (limit 50 + 10)",
				"charges accepted per second",
			} {
				assert.Contains(t, text, want)
			}
			assert.GreaterOrEqual(t, strings.Count(text, "  t=  1s  sent"), 2, "a live line per second, in each run")
			t.Log("\n" + text)
		})
	}
}

// TestDemoClientRole runs a client process's fleet against an API of its
// own, coordinated through a real Redis: each pod has its own shared
// limiter, as separate processes would.
func TestDemoClientRole(t *testing.T) {
	srv := redistest.Start(t)
	api, err := fakeapi.Start(fakeapi.Config{Rate: 40, Burst: 8, Advertise: true, Latency: 20 * time.Millisecond})
	require.NoError(t, err)
	defer api.Close()

	s := mustParse(t, "-role", "client", "-api", api.URL(), "-redis", "redis://"+srv.Addr,
		"-rate", "40", "-burst", "8", "-instances", "3", "-workers", "4", "-duration", "2s")
	var out bytes.Buffer
	runs, err := run(t.Context(), s, &out)
	require.NoError(t, err)
	s.providerRate = 40 // what the API enforces: the client role does not know it
	checkRuns(t, s, runs)

	// The provider's own count of the egress run agrees.
	st := api.Stats(time.Time{})
	i, _ := slices.BinarySearchFunc(st.Arrivals, runs[1].start, time.Time.Compare)
	assert.LessOrEqual(t, fakeapi.MaxInWindow(st.Arrivals[i:], time.Second), 40+8)
	assert.Contains(t, out.String(), "the -role api process counts the whole fleet")
}

func TestAPIRole(t *testing.T) {
	s := mustParse(t, "-role", "api", "-duration", "1200ms", "-rate", "20")
	var out bytes.Buffer
	runs, err := run(t.Context(), s, &out)
	require.NoError(t, err)
	assert.Empty(t, runs)
	assert.Contains(t, out.String(), "fake payments API at http://127.0.0.1:")
	assert.Contains(t, out.String(), "max accepted in any 1 s (limit 20 + 10)")
}

func TestAPIRoleStopsWhenInterrupted(t *testing.T) {
	s := mustParse(t, "-role", "api")
	assert.Zero(t, s.duration, "-role api serves until interrupted by default")
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err := run(ctx, s, &bytes.Buffer{})
	assert.NoError(t, err)
}

func TestParseDefaults(t *testing.T) {
	s := mustParse(t)
	assert.Equal(t, "all", s.role)
	assert.Equal(t, 50.0, s.rate)
	assert.Equal(t, 50.0, s.providerRate, "-provider-rate defaults to -rate")
	assert.Equal(t, 10*time.Second, s.duration)
	assert.LessOrEqual(t, 2*s.duration, 25*time.Second, "the demo fits in about 30 s")

	s = mustParse(t, "-rate", "30", "-provider-rate", "20")
	assert.Equal(t, 30.0, s.rate)
	assert.Equal(t, 20.0, s.providerRate)

	mustParse(t, "-role", "api", "-api", "http://127.0.0.1:8080", "-latency", "0s", "-errors", "0", "-advertise=false")
	mustParse(t, "-role", "client", "-api", "http://127.0.0.1:8080", "-redis", "redis://127.0.0.1:6379/0", "-mode", "leaky")
	mustParse(t, "-redis", "redis://:secret@localhost:6379/2")
}

func TestParseInvalid(t *testing.T) {
	cases := []struct {
		args []string
		want string // in the message
	}{
		{[]string{"-rate", "0"}, "-rate 0"},
		{[]string{"-rate", "-3"}, "-rate -3"},
		{[]string{"-rate", "NaN"}, "-rate NaN"},
		{[]string{"-rate", "abc"}, "-rate"},
		{[]string{"-provider-rate", "-1"}, "-provider-rate -1"},
		{[]string{"-burst", "0"}, "-burst 0"},
		{[]string{"-instances", "0"}, "-instances 0"},
		{[]string{"-instances", "100000"}, "-instances 100000"},
		{[]string{"-workers", "-2"}, "-workers -2"},
		{[]string{"-duration", "0s"}, "-duration 0s"},
		{[]string{"-duration", "-1s"}, "-duration -1s"},
		{[]string{"-duration", "2h"}, "-duration 2h0m0s"},
		{[]string{"-duration", "ten"}, "-duration"},
		{[]string{"-mode", "fifo"}, "-mode fifo"},
		{[]string{"-role", "server"}, "-role server"},
		{[]string{"-errors", "1.5"}, "-errors 1.5"},
		{[]string{"-latency", "-5ms"}, "-latency -5ms"},
		{[]string{"-redis", "http://localhost:6379"}, "-redis"},
		{[]string{"-nope"}, "-nope"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"-api", "http://127.0.0.1:8080"}, "-api does not apply to -role all"},
		{[]string{"-role", "client", "-redis", "redis://127.0.0.1:6379"}, "-role client needs -api"},
		{[]string{"-role", "client", "-api", "http://127.0.0.1:8080"}, "-role client needs -api and -redis"},
		{[]string{"-role", "client", "-api", "ftp://x:1", "-redis", "redis://127.0.0.1"}, "-api"},
		{[]string{"-role", "client", "-api", "http://127.0.0.1", "-redis", "redis://127.0.0.1"}, "a host and a port"},
		{[]string{"-role", "client", "-api", "http://h:1", "-redis", "redis://h", "-errors", "0.1"}, "-errors does not apply to -role client"},
		{[]string{"-role", "api", "-redis", "redis://127.0.0.1"}, "-redis does not apply to -role api"},
		{[]string{"-role", "api", "-mode", "leaky"}, "-mode does not apply to -role api"},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			_, err := parse(c.args)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)

			var stdout, stderr bytes.Buffer
			code := realMain(t.Context(), c.args, &stdout, &stderr)
			assert.Equal(t, 2, code, "exit status")
			assert.Contains(t, stderr.String(), c.want)
			assert.Empty(t, stdout.String())
		})
	}
}

func TestHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	assert.Equal(t, 0, realMain(t.Context(), []string{"-h"}, &stdout, &stderr))
	for _, f := range []string{"-rate", "-burst", "-provider-rate", "-instances", "-workers", "-duration", "-mode", "-redis", "-role", "-api"} {
		assert.Contains(t, stdout.String(), f)
	}
}
