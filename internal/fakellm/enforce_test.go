package fakellm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRefusals steps each enforcement through a fake clock: RPM 2 per
// second; a refusal's retry-after-ms is the wait until a request fits.
func TestRefusals(t *testing.T) {
	type step struct {
		advance time.Duration // before the request
		status  int
		retryMs string // on a 429
	}
	cases := []struct {
		e     Enforcement
		steps []step
	}{
		{TokenBucket, []step{
			{0, 200, ""}, {0, 200, ""}, {0, 429, "500"},
			{500 * ms, 200, ""}, {0, 429, "500"},
			{time.Second, 200, ""}, {0, 200, ""}, {0, 429, "500"}, // the bucket holds 2 at most
		}},
		{FixedWindow, []step{
			{0, 200, ""}, {0, 200, ""}, {0, 429, "1000"},
			{500 * ms, 429, "500"},
			{500 * ms, 200, ""}, {0, 200, ""}, {0, 429, "1000"},
		}},
		{SlidingWindow, []step{
			{0, 200, ""}, {400 * ms, 200, ""}, {100 * ms, 429, "500"},
			{500 * ms, 200, ""}, {100 * ms, 429, "300"},
			{300 * ms, 200, ""},
		}},
	}
	for _, c := range cases {
		t.Run(c.e.String(), func(t *testing.T) {
			s, url, cl, fc := serveFake(t, Config{RPM: 2, Minute: time.Second, Enforcement: c.e}, t0)
			refused := 0
			for i, st := range c.steps {
				fc.Advance(st.advance)
				resp, body := post(t, cl, url+ChatCompletionsPath, chatBody("hi", 10, false))
				require.Equal(t, st.status, resp.StatusCode, "step %d: %s", i, body)
				assert.Equal(t, st.retryMs, resp.Header.Get("retry-after-ms"), "step %d", i)
				if st.status == 429 {
					refused++
					assert.Contains(t, body, `"type":"requests"`, "step %d", i)
				}
			}
			st := s.Stats()
			assert.Equal(t, refused, st.Refused)
			assert.Equal(t, refused, st.RPM.Refused)
			assert.Equal(t, len(c.steps)-refused, st.Accepted)
			assert.Equal(t, 2, st.RPM.Peak)
			assert.Equal(t, 0, st.InFlight)
		})
	}
}

// TestUpfrontAndRefund: a request is charged up front by the Upfront rule
// and, once complete, its actual tokens. The clock does not move, so no
// limit gives anything back but the refund.
func TestUpfrontAndRefund(t *testing.T) {
	// Each request: 16 input tokens, max_tokens 100, output 50.
	cases := []struct {
		u              Upfront
		first, second  int // remaining tokens after admitting the 1st and the 2nd
		outFirst       int // remaining output tokens after admitting the 1st
		peakTPM, peakO int
	}{
		{ReserveInputAndMax, 10000 - 116, 10000 - 66 - 116, 5000 - 100, 66 + 116, 150},
		{ReserveLarger, 10000 - 100, 10000 - 66 - 100, 5000 - 100, 66 + 100, 150},
		{ReserveInput, 10000 - 16, 10000 - 66 - 16, 5000, 66 + 66, 100},
	}
	for _, e := range []Enforcement{TokenBucket, FixedWindow, SlidingWindow} {
		for _, c := range cases {
			t.Run(e.String()+"/"+c.u.String(), func(t *testing.T) {
				s, url, cl, _ := serveFake(t, Config{
					TPM: 10000, OutputTPM: 5000, Enforcement: e, Upfront: c.u, Output: Uniform(0.5, 0.5),
				}, t0)
				resp, body := post(t, cl, url+MessagesPath, claudeBody(prompt16, 100, false))
				require.Equal(t, 200, resp.StatusCode, body)
				assert.Equal(t, strconv.Itoa(min(c.first, c.outFirst)), resp.Header.Get("anthropic-ratelimit-tokens-remaining"))
				assert.Equal(t, strconv.Itoa(c.outFirst), resp.Header.Get("anthropic-ratelimit-output-tokens-remaining"))
				assert.Contains(t, body, `"usage":{"input_tokens":16,"output_tokens":50}`)

				resp, body = post(t, cl, url+ChatCompletionsPath, chatBody(prompt16, 100, false))
				require.Equal(t, 200, resp.StatusCode, body)
				assert.Equal(t, strconv.Itoa(c.second), resp.Header.Get("x-ratelimit-remaining-tokens"))

				st := s.Stats()
				assert.Equal(t, c.peakTPM, st.TPM.Peak, "TPM peak")
				assert.Equal(t, c.peakO, st.OutputTPM.Peak, "OutputTPM peak")
				assert.Equal(t, 32, st.InputTokens)
				assert.Equal(t, 100, st.OutputTokens)
				require.Len(t, st.Windows, 1)
				assert.Equal(t, Window{Start: t0, Accepted: 2, InputTokens: 32, OutputTokens: 100}, st.Windows[0])

				// After both: 132 tokens charged in all, whatever the rule.
				resp, _ = post(t, cl, url+ChatCompletionsPath, `{"model":"m","messages":[{"content":"x"}],"max_tokens":1}`)
				require.Equal(t, 200, resp.StatusCode)
				assert.Equal(t, strconv.Itoa(10000-132-7-upfrontOne(c.u)), resp.Header.Get("x-ratelimit-remaining-tokens"))
			})
		}
	}
}

// upfrontOne is the up-front charge beyond input of a request of 7 input
// tokens and max_tokens 1.
func upfrontOne(u Upfront) int {
	if u == ReserveInputAndMax {
		return 1
	}
	return 0
}

// TestExtraChargeCanExceed: when only the input is charged up front, the
// output charged at the end can take the limit over its quota, and Stats
// shows it; the next request waits for the debt to be repaid.
func TestExtraChargeCanExceed(t *testing.T) {
	s, url, cl, _ := serveFake(t, Config{TPM: 100, Upfront: ReserveInput, Output: Uniform(1, 1)}, t0)
	resp, body := post(t, cl, url+ChatCompletionsPath, chatBody(prompt16, 100, false))
	require.Equal(t, 200, resp.StatusCode, body)
	assert.Equal(t, "84", resp.Header.Get("x-ratelimit-remaining-tokens"))

	resp, body = post(t, cl, url+ChatCompletionsPath, chatBody(prompt16, 100, false))
	require.Equal(t, 429, resp.StatusCode, body)
	assert.Equal(t, "0", resp.Header.Get("x-ratelimit-remaining-tokens"))
	// 16 in debt, 16 needed: 32 tokens at 100 per minute.
	assert.Equal(t, "19200", resp.Header.Get("retry-after-ms"))
	assert.Contains(t, body, "Limit 100, Used 100, Requested 16. Please try again in 19.2s.")
	st := s.Stats()
	assert.Equal(t, 116, st.TPM.Peak, "the limit was exceeded by 16")
	assert.Equal(t, 100, st.TPM.Limit)
}

// TestTooLarge: a request whose up-front charge exceeds a whole quota is
// refused without a retry-after: it would never fit.
func TestTooLarge(t *testing.T) {
	s, url, cl, _ := serveFake(t, Config{RPM: 100, TPM: 30000}, t0)
	resp, body := post(t, cl, url+ChatCompletionsPath, chatBody(prompt16, 40000, false))
	require.Equal(t, 429, resp.StatusCode)
	assert.Empty(t, resp.Header.Get("retry-after"))
	assert.Empty(t, resp.Header.Get("retry-after-ms"))
	assert.Equal(t, "30000", resp.Header.Get("x-ratelimit-remaining-tokens"), "a refusal spends nothing")
	assert.Equal(t, "100", resp.Header.Get("x-ratelimit-remaining-requests"))
	assert.JSONEq(t, `{"error":{"message":"Request too large for gpt-4o in organization org-fakellm on tokens per min (TPM): `+
		`Limit 30000, Requested 40016. The input or output tokens must be reduced in order to run successfully. `+
		`Visit https://platform.openai.com/account/rate-limits to learn more.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`, body)
	st := s.Stats()
	assert.Equal(t, 1, st.TooLarge)
	assert.Equal(t, 1, st.Refused)
	assert.Equal(t, 1, st.TPM.Refused)
}

// TestStreamChargesAtTheEnd: a stream holds its up-front charge until its
// last content chunk is written; then the actual charge replaces it,
// before the usage reaches the caller.
func TestStreamChargesAtTheEnd(t *testing.T) {
	// A fixed window of an hour: nothing comes back while the clock moves.
	_, url, cl, fc := serveFake(t, Config{
		TPM: 10000, Enforcement: FixedWindow, Minute: time.Hour,
		Output: Uniform(0.5, 0.5), Chunks: 2, ChunkDelay: time.Second,
	}, t0)
	resp, err := cl.Post(url+ChatCompletionsPath, "application/json", strings.NewReader(chatBody(prompt16, 100, true)))
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, "9884", resp.Header.Get("x-ratelimit-remaining-tokens"))
	events := bufio.NewReader(resp.Body)
	first, err := events.ReadString('\n')
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(first, "data: {"), first)

	// While it streams, its reservation holds.
	other, _ := post(t, cl, url+ChatCompletionsPath, chatBody(prompt16, 100, false))
	assert.Equal(t, strconv.Itoa(10000-116-116), other.Header.Get("x-ratelimit-remaining-tokens"))

	for range 2 {
		fc.WaitTimers(1)
		fc.Advance(time.Second)
	}
	rest, err := io.ReadAll(events)
	require.NoError(t, err)
	assert.Contains(t, string(rest), `"usage":{"prompt_tokens":16,"completion_tokens":50,"total_tokens":66}`)
	assert.True(t, strings.HasSuffix(string(rest), "data: [DONE]\n\n"))

	last, _ := post(t, cl, url+ChatCompletionsPath, chatBody(prompt16, 100, false))
	assert.Equal(t, strconv.Itoa(10000-66-66-116), last.Header.Get("x-ratelimit-remaining-tokens"))
}

// TestCallerLeavesMidStream: a stream cut short by its caller is still
// settled, charged its whole output.
func TestCallerLeavesMidStream(t *testing.T) {
	s, url, cl := serve(t, Config{TPM: 10000, Output: Uniform(1, 1), Chunks: 5, ChunkDelay: 50 * ms})
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+ChatCompletionsPath, strings.NewReader(chatBody(prompt16, 100, true)))
	require.NoError(t, err)
	resp, err := cl.Do(req)
	require.NoError(t, err)
	_, err = bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	cancel()
	resp.Body.Close()
	require.Eventually(t, func() bool { return s.Stats().InFlight == 0 }, time.Second, 5*ms)
	st := s.Stats()
	assert.Equal(t, 1, st.Accepted)
	assert.Equal(t, 100, st.OutputTokens)
}

// TestLimitsNeverExceeded: concurrent callers, streaming or not, against
// every enforcement with the default up-front rule and 200ms "minutes":
// every limit's peak stays within its quota, some requests are refused,
// and what the callers were told they used is what the provider charged.
func TestLimitsNeverExceeded(t *testing.T) {
	for _, e := range []Enforcement{TokenBucket, FixedWindow, SlidingWindow} {
		t.Run(e.String(), func(t *testing.T) {
			t.Parallel()
			cfg := Config{
				RPM: 40, TPM: 4000, OutputTPM: 2500, Minute: 200 * ms, Enforcement: e, Seed: 7,
				Chunks: 3, ChunkDelay: ms, PerToken: 10 * time.Microsecond,
			}
			s, url, cl := serve(t, cfg)
			const callers, run = 8, 500 * ms
			deadline := time.Now().Add(run)
			var mu sync.Mutex
			told := 0 // total_tokens the callers were told
			var wg sync.WaitGroup
			for g := range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; time.Now().Before(deadline); i++ {
						stream := (g+i)%2 == 0
						resp, body, err := send(cl, url+ChatCompletionsPath, chatBody(strings.Repeat("w", 40*(g+1)), 50+20*g, stream))
						if err != nil {
							t.Error(err)
							return
						}
						switch resp.StatusCode {
						case 200:
							n := totalTokens(t, body, stream)
							mu.Lock()
							told += n
							mu.Unlock()
						case 429:
							time.Sleep(5 * ms)
						default:
							t.Errorf("status %d: %s", resp.StatusCode, body)
							return
						}
					}
				}()
			}
			wg.Wait()
			st := s.Stats()
			assert.Equal(t, 0, st.InFlight)
			assert.Positive(t, st.Accepted)
			assert.Positive(t, st.Refused)
			assert.Equal(t, told, st.InputTokens+st.OutputTokens, "charged what the callers were told")
			for name, l := range map[string]LimitStats{"RPM": st.RPM, "TPM": st.TPM, "OutputTPM": st.OutputTPM} {
				assert.LessOrEqual(t, l.Peak, l.Limit, "%s peak", name)
				assert.Positive(t, l.Peak, "%s peak", name)
			}
			sum := 0
			for _, w := range st.Windows {
				sum += w.Accepted
				if e == FixedWindow { // the windows of Stats are the limit's windows
					assert.LessOrEqual(t, w.Accepted, cfg.RPM, "window %v", w.Start)
					assert.LessOrEqual(t, w.Tokens(), cfg.TPM, "window %v", w.Start)
					assert.LessOrEqual(t, w.OutputTokens, cfg.OutputTPM, "window %v", w.Start)
				}
			}
			assert.Equal(t, st.Accepted, sum)
			t.Logf("%v: accepted %d, refused %d (RPM %d, TPM %d, OutputTPM %d); peaks %d/%d, %d/%d, %d/%d; "+
				"TPM used %.0f%% of %d windows' quota", e, st.Accepted, st.Refused, st.RPM.Refused, st.TPM.Refused, st.OutputTPM.Refused,
				st.RPM.Peak, st.RPM.Limit, st.TPM.Peak, st.TPM.Limit, st.OutputTPM.Peak, st.OutputTPM.Limit,
				100*float64(st.InputTokens+st.OutputTokens)/float64(cfg.TPM*len(st.Windows)), len(st.Windows))
		})
	}
}

// totalTokens is the total_tokens of a response's usage, streamed or not.
func totalTokens(t *testing.T, body string, stream bool) int {
	var u struct {
		Usage *openAIUsage `json:"usage"`
	}
	if !stream {
		if err := json.Unmarshal([]byte(body), &u); err != nil || u.Usage == nil {
			t.Errorf("no usage in %s (%v)", body, err)
			return 0
		}
		return u.Usage.TotalTokens
	}
	for _, ev := range strings.Split(body, "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		if err := json.Unmarshal([]byte(data), &u); err == nil && u.Usage != nil {
			return u.Usage.TotalTokens
		}
	}
	t.Errorf("no usage chunk in %s", body)
	return 0
}

// TestSeedDeterminesOutputs: the same seed and the same order of requests
// give the same outputs.
func TestSeedDeterminesOutputs(t *testing.T) {
	outputs := func(seed uint64) string {
		_, url, cl := serve(t, Config{Seed: seed})
		var got []string
		for i := range 8 {
			_, body := post(t, cl, url+ChatCompletionsPath, chatBody("hi", 100+i, false))
			var c struct{ Usage openAIUsage }
			require.NoError(t, json.Unmarshal([]byte(body), &c))
			require.GreaterOrEqual(t, c.Usage.CompletionTokens, (100+i)/4)
			require.LessOrEqual(t, c.Usage.CompletionTokens, 100+i)
			got = append(got, fmt.Sprint(c.Usage.CompletionTokens))
		}
		return strings.Join(got, " ")
	}
	a := outputs(1)
	assert.Equal(t, a, outputs(1))
	assert.NotEqual(t, a, outputs(2))
}

// TestLatency: a response waits Latency + PerToken × output; a stream
// waits Latency, then ChunkDelay + PerToken × tokens before each chunk.
func TestLatency(t *testing.T) {
	_, url, cl := serve(t, Config{
		Latency: 30 * ms, PerToken: ms, Output: Uniform(1, 1), Chunks: 4, ChunkDelay: 10 * ms,
	})
	start := time.Now()
	resp, _ := post(t, cl, url+ChatCompletionsPath, chatBody("hi", 20, false))
	require.Equal(t, 200, resp.StatusCode)
	assert.GreaterOrEqual(t, time.Since(start), 50*ms)

	start = time.Now()
	resp, body := post(t, cl, url+ChatCompletionsPath, chatBody("hi", 20, true))
	require.Equal(t, 200, resp.StatusCode)
	assert.GreaterOrEqual(t, time.Since(start), 90*ms) // 30 + 4×10 + 20×1
	assert.Equal(t, 4, strings.Count(body, `"content":"`)-1, "four content chunks after the opening one")
}
