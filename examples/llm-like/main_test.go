package main

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// minUtilisation is the share of TPM egress must use in the periods after
// the first: a loose bound (it uses about 95%), safe on a loaded machine.
const minUtilisation = 0.8

// mustParse parses flags that are valid.
func mustParse(t *testing.T, args ...string) settings {
	t.Helper()
	s, err := parse(args)
	require.NoError(t, err)
	return s
}

// checkRuns asserts what the demo promises: the naive fleet gets a storm
// of 429s; egress gets none after the first period and uses most of the
// tokens limit, which binds, and never more than it.
func checkRuns(t *testing.T, s settings, runs []result) {
	t.Helper()
	require.Len(t, runs, 2)
	naive, shaped := runs[0], runs[1]
	assert.Equal(t, nameNaive, naive.name)
	assert.Equal(t, nameEgress, shaped.name)

	require.Equal(t, time.Second, s.minute, "the test's first second is its first period")
	assert.Zero(t, shaped.late, "egress: 429s after the first period")
	assert.Zero(t, shaped.failed, "egress: failed calls")
	assert.Greater(t, naive.limited, int64(naive.provider.Accepted), "the naive fleet's 429 storm: more 429s than completions")
	assert.Equal(t, int64(shaped.provider.Refused), shaped.limited, "every 429 is counted")

	assert.GreaterOrEqual(t, tokenUtilisation(s, shaped), minUtilisation, "egress: utilisation of TPM")
	assert.Less(t, requestUtilisation(s, shaped), tokenUtilisation(s, shaped), "TPM binds, not RPM")
	assert.LessOrEqual(t, shaped.provider.TPM.Peak, s.tpm)
	assert.Equal(t, shaped.provider.Accepted, shaped.calls, "every accepted request is a successful call")
	assert.Positive(t, shaped.provider.OutputTokens)
}

func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo on the real clock: make test runs it, make fast (-short) does not")
	}
	cases := []struct {
		name string
		args []string
	}{
		{"LLMCost", nil},
		{"noisy estimate", []string{"-estimate-error", "0.5", "-stream", "1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The default rates per second, with a minute of 1 s: three periods.
			args := append([]string{"-duration", "3s", "-minute", "1s", "-rpm", "300", "-tpm", "30000"}, c.args...)
			s := mustParse(t, args...)
			var out bytes.Buffer
			runs, err := run(t.Context(), s, &out)
			require.NoError(t, err)
			checkRuns(t, s, runs)

			text := out.String()
			for _, want := range []string{
				"— without egress", "— with egress", "waiting",
				"429s received", "429s after the first second", "tokens accepted per second",
				"utilisation of TPM, periods 2–3", "p99 latency",
				"tokens accepted per period of 1s (│ marks the provider's 30000)",
			} {
				assert.Contains(t, text, want)
			}
			assert.Equal(t, 2, strings.Count(text, "  period  1  sent"), "a live line per period, in each run")
			t.Log("\n" + text)
		})
	}
}

func TestParseDefaults(t *testing.T) {
	s := mustParse(t)
	assert.Equal(t, 8*time.Second, s.duration)
	assert.Equal(t, 2*time.Second, s.minute)
	assert.Equal(t, 4, s.periods())
	assert.Equal(t, 4, s.instances)
	assert.Equal(t, 8, s.workers)
	assert.Zero(t, s.estimateError, "LLMCost by default")
	assert.LessOrEqual(t, 2*s.duration, 20*time.Second, "the demo fits in about 20 s")

	s = mustParse(t, "-estimate-error", "0.5", "-stream", "1", "-latency", "0s", "-minute", "1m", "-duration", "2m")
	assert.Equal(t, 0.5, s.estimateError)
	assert.Equal(t, 2, s.periods())
}

func TestParseInvalid(t *testing.T) {
	cases := []struct {
		args []string
		want string // in the message
	}{
		{[]string{"-rpm", "0"}, "-rpm 0"},
		{[]string{"-tpm", "100"}, "-tpm 100"},
		{[]string{"-tpm", "abc"}, "-tpm"},
		{[]string{"-minute", "1ms"}, "-minute 1ms"},
		{[]string{"-minute", "2m"}, "-minute 2m0s"},
		{[]string{"-duration", "0s"}, "-duration 0s"},
		{[]string{"-duration", "3s"}, "at least two -minute periods"},
		{[]string{"-duration", "2h"}, "-duration 2h0m0s"},
		{[]string{"-instances", "0"}, "-instances 0"},
		{[]string{"-workers", "-2"}, "-workers -2"},
		{[]string{"-latency", "-5ms"}, "-latency -5ms"},
		{[]string{"-stream", "1.5"}, "-stream 1.5"},
		{[]string{"-stream", "NaN"}, "-stream NaN"},
		{[]string{"-estimate-error", "1"}, "-estimate-error 1"},
		{[]string{"-estimate-error", "-0.1"}, "-estimate-error -0.1"},
		{[]string{"-nope"}, "-nope"},
		{[]string{"extra"}, `unexpected argument "extra"`},
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
	for _, f := range []string{"-duration", "-instances", "-workers", "-rpm", "-tpm", "-minute", "-latency", "-stream", "-estimate-error"} {
		assert.Contains(t, stdout.String(), f)
	}
}

func TestUsageTokens(t *testing.T) {
	cases := []struct {
		body string
		want int
	}{
		{`{"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}`, 15},
		{"data: {\"usage\":null}\n\ndata: {\"usage\":{\"total_tokens\":42}}\n\ndata: [DONE]\n\n", 42},
		{`{"error":{}}`, 0},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, usageTokens([]byte(c.body)), c.body)
	}
}

func TestNewCall(t *testing.T) {
	body, reservation := newCall(rand.New(rand.NewPCG(1, 1)), true)
	assert.Contains(t, string(body), `"stream":true`)
	assert.Contains(t, string(body), `"include_usage":true`)
	assert.GreaterOrEqual(t, reservation, minMaxTokens+minPrompt/4)
	assert.LessOrEqual(t, reservation, minTPM/2)
}
