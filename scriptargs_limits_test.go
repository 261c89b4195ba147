package egress

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wire returns args as go-redis writes them to Redis.
func wire(t *testing.T, args []any) []string {
	t.Helper()
	out := make([]string, len(args))
	for k, a := range args {
		switch v := a.(type) {
		case int64:
			out[k] = strconv.FormatInt(v, 10)
		case float64:
			out[k] = strconv.FormatFloat(v, 'f', -1, 64)
		case string:
			out[k] = v
		default:
			t.Fatalf("argument %d: %T", k, a)
		}
	}
	return out
}

// TestLimitsArgs: limits.lua's encoders write each operation's ARGV as the
// script's header says, for a window (10 a second) and a bucket (5 a
// second, a burst of 2), with a margin of 5 ms.
func TestLimitsArgs(t *testing.T) {
	win, bucket := WindowOf(Requests, 10, time.Second), BucketOf(Tokens, PerSecond(5), 2)
	groups := []limitsLimit{limitGroup(&win, 5*time.Millisecond), limitGroup(&bucket, 5*time.Millisecond)}
	head := []string{"2", "1", "10", "1005000", "0", "0", "2", "200000", "5000"}
	req := limitsRequest{limitsCosts: limitsCosts{costs: []int{1, 300}, maxWait: -1}, level: 2, share: 0.25, tenant: "t", weight: 1.5, work: 150000}
	for _, tc := range []struct {
		name string
		args []any
		want []string
	}{
		{"reserve", limitsReserveArgs(groups, 0, []limitsRequest{req, req}), []string{"0", "1", "300", "-1", "1", "300", "-1"}},
		{"reserve", limitsReserveArgs(groups, 100000, []limitsRequest{req}), []string{"100000", "1", "300", "-1", "2", "0.25", "t", "1.5", "150000"}},
		{"settle", limitsSettleArgs(groups, &limitsSettle{turn: 77, costs: []limitsSettled{{1, 0}, {300, 120}}, replan: 1, channel: "ch", id: "k"}),
			[]string{"77", "1", "0", "300", "120", "1", "ch", "k"}},
		{"learn", limitsLearnArgs(groups, &limitsLearn{hold: 2000, channel: "ch", id: "k", caps: []limitsCap{{keep: 3, reset: 500, bucket: 0}, {keep: -1, reset: -1, bucket: 1}}}),
			[]string{"2000", "ch", "k", "3", "500", "0", "-1", "-1", "1"}},
		{"window", limitsWindowArgs(groups, 1, maxPlanGrants), []string{"1", "2048"}},
	} {
		want := append(append([]string{tc.name}, head...), tc.want...)
		assert.Equal(t, want, wire(t, tc.args), tc.name)
	}
}

// TestLimitsReserveReply: a reserve's reply is read by one decoder, which
// takes the server's now and four integers a request, and refuses
// anything else.
func TestLimitsReserveReply(t *testing.T) {
	at := time.Now()
	got, err := parseReserved([]any{int64(9), int64(2), int64(20_000), int64(0), int64(0), int64(0), int64(5), int64(77), int64(3), int64(1), int64(40), int64(2), int64(0)}, 3, at)
	require.NoError(t, err)
	assert.Equal(t, limitsReserved{now: 9, requests: []limitsReply{
		{held: true, wait: 20 * time.Millisecond, at: at},
		{wait: 5 * time.Microsecond, turn: 77, gid: 3, at: at},
		{refused: true, wait: 40 * time.Microsecond, binding: 2, at: at},
	}}, got)
	for _, bad := range []any{
		nil,
		"1",
		[]any{},
		[]any{int64(1), int64(3), int64(0), int64(0), int64(0)},
		[]any{int64(1), int64(-1), int64(0), int64(0), int64(0)},
		[]any{int64(1), int64(0), int64(-1), int64(0), int64(0)},
		[]any{int64(1), "0", int64(0), int64(0), int64(0)},
		[]any{int64(1), int64(0), int64(0), int64(0), nil},
		[]any{"1", int64(0), int64(0), int64(0), int64(0)},
		[]any{int64(1), int64(0), int64(0), int64(0)},
		[]any{int64(1), int64(0), int64(0), int64(0), int64(0), int64(0)},
	} {
		_, err := parseReserved(bad, 1, at)
		assert.Error(t, err, "%v", bad)
	}
}

// TestLimitsWindowReply: a window's reply is read by one decoder, which
// takes the server's now and a (turn, cost) pair a grant, and refuses
// anything else.
func TestLimitsWindowReply(t *testing.T) {
	got, err := parseWindowed([]int64{100, 40, 3, 90, 1})
	require.NoError(t, err)
	assert.Equal(t, limitsWindowed{now: 100, grants: []windowGrant{{turn: 40, cost: 3}, {turn: 90, cost: 1}}}, got)
	got, err = parseWindowed([]int64{100})
	require.NoError(t, err)
	assert.Equal(t, limitsWindowed{now: 100, grants: []windowGrant{}}, got)
	for _, bad := range [][]int64{nil, {}, {100, 40}, {100, 40, 3, 90}, {-1}, {100, -40, 3}, {100, 40, -3}} {
		_, err := parseWindowed(bad)
		assert.Error(t, err, "%v", bad)
	}
}
