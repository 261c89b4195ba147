package fakellm

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConfigValidation(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		want []string // each must appear in the error; none: valid
	}{
		{"zero", Config{}, nil},
		{"everything", Config{RPM: 1, TPM: 1, InputTPM: 1, OutputTPM: 1, Minute: time.Millisecond, Enforcement: SlidingWindow,
			Upfront: ReserveInput, DefaultMaxTokens: 1, Chunks: 1, Latency: 1, PerToken: 1, ChunkDelay: 1}, nil},
		{"negative limits", Config{RPM: -1, TPM: -2, InputTPM: -3, OutputTPM: -4},
			[]string{"RPM -1", "TPM -2", "InputTPM -3", "OutputTPM -4"}},
		{"short minute", Config{Minute: time.Microsecond}, []string{"Minute 1µs", "at least 1ms"}},
		{"negative minute", Config{Minute: -time.Second}, []string{"Minute -1s"}},
		{"negative delays", Config{Latency: -1, PerToken: -2, ChunkDelay: -3},
			[]string{"Latency -1ns", "PerToken -2ns", "ChunkDelay -3ns"}},
		{"negative counts", Config{DefaultMaxTokens: -1, Chunks: -1}, []string{"DefaultMaxTokens -1", "Chunks -1"}},
		{"unknown enums", Config{Enforcement: 3, Upfront: -1}, []string{"Enforcement 3", "Upfront -1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := New(c.cfg)
			if c.want == nil {
				require.NoError(t, err)
				require.NotNil(t, s)
				return
			}
			require.Error(t, err)
			assert.Nil(t, s)
			for _, w := range c.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestNames(t *testing.T) {
	assert.Equal(t, "TokenBucket", TokenBucket.String())
	assert.Equal(t, "SlidingWindow", SlidingWindow.String())
	assert.Equal(t, "Enforcement(9)", Enforcement(9).String())
	assert.Equal(t, "ReserveInputAndMax", ReserveInputAndMax.String())
	assert.Equal(t, "Upfront(9)", Upfront(9).String())
}

// TestDefaultMaxTokens: an OpenAI request without max_tokens reserves the
// default; max_completion_tokens wins over max_tokens.
func TestDefaultMaxTokens(t *testing.T) {
	cases := []struct {
		body      string
		remaining string
	}{
		{`{"model":"m","messages":[{"content":"abcd"}]}`, "9993"},                                             // 7 + 2000
		{`{"model":"m","messages":[{"content":"abcd"}],"max_tokens":10}`, "11983"},                            // 7 + 10
		{`{"model":"m","messages":[{"content":"abcd"}],"max_tokens":10,"max_completion_tokens":20}`, "11973"}, // 7 + 20
	}
	for _, c := range cases {
		_, url, cl, _ := serveFake(t, Config{TPM: 12000, DefaultMaxTokens: 2000}, t0)
		resp, body := post(t, cl, url+ChatCompletionsPath, c.body)
		require.Equal(t, 200, resp.StatusCode, body)
		assert.Equal(t, c.remaining, resp.Header.Get("x-ratelimit-remaining-tokens"), c.body)
	}
}

// TestStatsWindows: each window counts the requests decided in it and the
// actual tokens of those it admitted.
func TestStatsWindows(t *testing.T) {
	s, url, cl, fc := serveFake(t, Config{RPM: 2, Minute: time.Second, Enforcement: FixedWindow, Output: Uniform(1, 1)}, t0.Add(200*ms))
	for _, advance := range []time.Duration{0, 0, 0, 1500 * ms, 0, 2 * time.Second} {
		fc.Advance(advance)
		post(t, cl, url+ChatCompletionsPath, chatBody("abcd", 10, false)) // 7 input tokens, 10 output
	}
	st := s.Stats()
	assert.Equal(t, []Window{
		{Start: t0, Accepted: 2, Refused: 1, InputTokens: 14, OutputTokens: 20},
		{Start: t0.Add(time.Second), Accepted: 2, InputTokens: 14, OutputTokens: 20},
		{Start: t0.Add(2 * time.Second)},
		{Start: t0.Add(3 * time.Second), Accepted: 1, InputTokens: 7, OutputTokens: 10},
	}, st.Windows)
	assert.Equal(t, 34, st.Windows[0].Tokens())
	assert.Equal(t, Stats{
		Requests: 6, Accepted: 5, Refused: 1, InputTokens: 35, OutputTokens: 50,
		RPM: LimitStats{Limit: 2, Peak: 2, Refused: 1}, Windows: st.Windows,
	}, st)
}
