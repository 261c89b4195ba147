package fakellm

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTextTokens(t *testing.T) {
	cases := []struct {
		s    string
		want int
	}{
		{"", 0}, {"a", 1}, {"abcd", 1}, {"abcde", 2}, {"héllo", 2}, // é is 2 bytes: 6 bytes
		{strings.Repeat("x", 4000), 1000}, {strings.Repeat("x", 4001), 1001},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, TextTokens(c.s), "%q", c.s)
	}
}

func TestInputTokens(t *testing.T) {
	cases := []struct {
		name string
		body string
		want int
	}{
		{"one message", `{"model":"m","messages":[{"role":"user","content":"hello"}]}`, 3 + 3 + 2},
		{"empty content", `{"messages":[{"role":"user","content":""}]}`, 3 + 3},
		{"null content", `{"messages":[{"role":"assistant","content":null}]}`, 3 + 3},
		{"two messages", `{"messages":[{"role":"system","content":"abcd"},{"role":"user","content":"abcde"}]}`, 3 + 4 + 5},
		{"content parts", `{"messages":[{"role":"user","content":[{"type":"text","text":"abcd"},` +
			`{"type":"image_url","image_url":{"url":"https://x/y.png"}},{"type":"text","text":"efgh"}]}]}`, 3 + 3 + 2},
		{"anthropic system", `{"system":"abcdefgh","messages":[{"role":"user","content":"a"}]}`, 3 + 5 + 4},
		{"anthropic system blocks", `{"system":[{"type":"text","text":"abcdefgh"}],"messages":[{"role":"user","content":"a"}]}`, 3 + 5 + 4},
		{"other fields count nothing", `{"model":"a-very-long-model-name","max_tokens":9,"stream":true,"tools":[1,2],` +
			`"messages":[{"role":"user","name":"somebody","content":"abcd"}]}`, 3 + 4},
		{"no messages", `{}`, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n, err := InputTokens([]byte(c.body))
			require.NoError(t, err)
			assert.Equal(t, c.want, n)
		})
	}
	for _, bad := range []string{``, `[]`, `{"messages":[{"content":7}]}`, `{"messages":"x"}`} {
		_, err := InputTokens([]byte(bad))
		assert.Error(t, err, "%s", bad)
	}
	n, err := InputTokens([]byte(chatBody(prompt16, 100, false)))
	require.NoError(t, err)
	assert.Equal(t, 16, n, "prompt16")
}

func TestUniform(t *testing.T) {
	cases := []struct {
		lo, hi float64
		u      float64
		max    int
		want   int
	}{
		{0.25, 1, 0, 100, 25},
		{0.25, 1, 0.9999, 100, 100},
		{0.25, 1, 0.5, 100, 63}, // 25 + ⌊0.5·76⌋
		{0.25, 1, 0.5, 1, 1},
		{0.25, 1, 0.5, 3, 2}, // among 1, 2, 3
		{1, 1, 0.3, 7, 7},
		{0.5, 0.5, 0.9, 100, 50},
		{0.5, 0.5, 0.9, 5, 3}, // ⌈2.5⌉ = 3; ⌊2.5⌋ below it counts as 3
		{0, 0, 0.9, 10, 1},    // at least 1
		{1, 0.5, 0.2, 10, 10}, // hi below lo counts as lo
	}
	for _, c := range cases {
		assert.Equal(t, c.want, Uniform(c.lo, c.hi)(c.u, c.max), "Uniform(%v, %v)(%v, %d)", c.lo, c.hi, c.u, c.max)
	}
	d := Uniform(0.25, 1)
	for max := 1; max <= 50; max++ {
		for u := 0.0; u < 1; u += 0.01 {
			n := d(u, max)
			require.True(t, n >= 1 && n <= max && n >= max/4, "Uniform(0.25, 1)(%v, %d) = %d", u, max, n)
		}
	}
}

func TestChunkSizes(t *testing.T) {
	assert.Equal(t, []int{1, 1, 1}, chunkSizes(3, 0))
	assert.Equal(t, []int{1, 1, 1}, chunkSizes(3, 5))
	assert.Equal(t, []int{4, 3, 3}, chunkSizes(10, 3))
	assert.Equal(t, []int{7}, chunkSizes(7, 1))
}

func TestCompletionText(t *testing.T) {
	full := completionText(0, 30)
	assert.Len(t, full, 30*BytesPerToken)
	assert.Equal(t, 30, TextTokens(full), "n tokens of text count n tokens")
	assert.Equal(t, full, completionText(0, 13)+completionText(13, 30), "chunks join into the text")
	assert.True(t, strings.HasPrefix(full, "the fox ran far "), full)
}

func TestFormats(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0s", time.Nanosecond: "1ms", 12 * ms: "12ms", 11200 * time.Microsecond: "12ms",
		1500 * ms: "1.5s", 6 * time.Minute: "6m0s", 2*time.Minute + 59560*ms: "2m59.56s", -time.Second: "0s",
	} {
		assert.Equal(t, want, goDuration(d), "goDuration(%v)", d)
	}
	now := time.Date(2025, 8, 21, 12, 40, 58, 0, time.UTC)
	assert.Equal(t, "2025-08-21T12:40:58Z", rfc3339(now, 0))
	assert.Equal(t, "2025-08-21T12:40:59Z", rfc3339(now, time.Nanosecond), "rounded up")
	assert.Equal(t, "2025-08-21T12:41:00Z", rfc3339(now.In(time.FixedZone("CEST", 7200)), 2*time.Second), "in UTC")
	for d, want := range map[time.Duration]string{0: "1", 300 * ms: "1", time.Second: "1", 2400 * ms: "3", time.Minute: "60"} {
		assert.Equal(t, want, retrySeconds(d), "retrySeconds(%v)", d)
	}
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 40000: "40,000", 1234567: "1,234,567", -1000: "-1,000"} {
		assert.Equal(t, want, thousands(n))
	}
}
