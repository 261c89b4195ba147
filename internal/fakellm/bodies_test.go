package fakellm

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestChatCompletionBody: a chat.completion with the usage at the end;
// finish_reason "length" when the output reached max_tokens.
func TestChatCompletionBody(t *testing.T) {
	cases := []struct {
		out    Distribution
		output int
		finish string
	}{
		{Uniform(0.5, 0.5), 50, "stop"},
		{Uniform(1, 1), 100, "length"},
	}
	for _, c := range cases {
		t.Run(c.finish, func(t *testing.T) {
			_, url, cl, _ := serveFake(t, Config{Output: c.out}, t0)
			resp, body := post(t, cl, url+ChatCompletionsPath, chatBody(prompt16, 100, false))
			require.Equal(t, 200, resp.StatusCode)
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			var got struct {
				ID      string `json:"id"`
				Object  string `json:"object"`
				Created int64  `json:"created"`
				Model   string `json:"model"`
				Choices []struct {
					Index   int `json:"index"`
					Message struct {
						Role    string `json:"role"`
						Content string `json:"content"`
					} `json:"message"`
					FinishReason string `json:"finish_reason"`
				} `json:"choices"`
			}
			require.NoError(t, json.Unmarshal([]byte(body), &got))
			assert.Equal(t, "chatcmpl-fakellm-1", got.ID)
			assert.Equal(t, "chat.completion", got.Object)
			assert.Equal(t, t0.Unix(), got.Created)
			assert.Equal(t, "gpt-4o", got.Model)
			require.Len(t, got.Choices, 1)
			assert.Equal(t, "assistant", got.Choices[0].Message.Role)
			assert.Equal(t, c.output, TextTokens(got.Choices[0].Message.Content))
			assert.Equal(t, c.finish, got.Choices[0].FinishReason)
			usage := regexp.MustCompile(`,"usage":\{"prompt_tokens":16,"completion_tokens":(\d+),"total_tokens":(\d+)\}\}\n$`)
			m := usage.FindStringSubmatch(body)
			require.NotNil(t, m, "usage last: %s", body)
			assert.Equal(t, []string{itoa(c.output), itoa(16 + c.output)}, m[1:])
		})
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// sseEvents splits a stream into its events, checking the framing: each
// event ends in a blank line, and the stream ends after the last one.
func sseEvents(t *testing.T, body string) []string {
	t.Helper()
	require.True(t, strings.HasSuffix(body, "\n\n"), "ends with a blank line: %q", body)
	events := strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n")
	for _, e := range events {
		require.NotEmpty(t, e)
	}
	return events
}

// openAIChunk is the part of a chat.completion.chunk the tests read.
type openAIChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Choices []struct {
		Delta struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage json.RawMessage `json:"usage"`
}

// TestChatCompletionStream: data-only events, the role first, then the
// content chunks, the finish chunk, the usage chunk (no choices; usage
// null in the others), then [DONE].
func TestChatCompletionStream(t *testing.T) {
	cases := []struct {
		name         string
		onRequest    bool // StreamUsageOnRequest
		includeUsage bool // the request's stream_options.include_usage
		usage        bool // a usage chunk is sent
	}{
		{"usage by default", false, false, true},
		{"usage on request, asked", true, true, true},
		{"usage on request, not asked", true, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, url, cl, _ := serveFake(t, Config{Output: Uniform(0.5, 0.5), Chunks: 3, StreamUsageOnRequest: c.onRequest}, t0)
			var req map[string]any
			require.NoError(t, json.Unmarshal([]byte(chatBody(prompt16, 100, true)), &req))
			if c.includeUsage {
				req["stream_options"] = map[string]bool{"include_usage": true}
			}
			b, _ := json.Marshal(req)
			resp, body := post(t, cl, url+ChatCompletionsPath, string(b))
			require.Equal(t, 200, resp.StatusCode)
			assert.Equal(t, "text/event-stream; charset=utf-8", resp.Header.Get("Content-Type"))
			events := sseEvents(t, body)
			want := 1 + 3 + 1 + 1 // role, content ×3, finish, [DONE]
			if c.usage {
				want++
			}
			require.Len(t, events, want, body)
			assert.Equal(t, "data: [DONE]", events[len(events)-1])
			var chunks []openAIChunk
			for _, e := range events[:len(events)-1] {
				data, ok := strings.CutPrefix(e, "data: ")
				require.True(t, ok, "%q", e)
				require.NotContains(t, data, "\n")
				var k openAIChunk
				require.NoError(t, json.Unmarshal([]byte(data), &k), data)
				assert.Equal(t, "chatcmpl-fakellm-1", k.ID)
				assert.Equal(t, "chat.completion.chunk", k.Object)
				chunks = append(chunks, k)
			}
			require.Equal(t, "assistant", *chunks[0].Choices[0].Delta.Role)
			var text strings.Builder
			for _, k := range chunks[1:4] {
				require.Len(t, k.Choices, 1)
				text.WriteString(*k.Choices[0].Delta.Content)
				assert.Nil(t, k.Choices[0].FinishReason)
			}
			assert.Equal(t, completionText(0, 50), text.String())
			assert.Equal(t, "stop", *chunks[4].Choices[0].FinishReason)
			for _, k := range chunks[:5] {
				if c.usage {
					assert.Equal(t, "null", string(k.Usage))
				} else {
					assert.Nil(t, k.Usage)
				}
			}
			if c.usage {
				last := chunks[5]
				assert.Empty(t, last.Choices)
				assert.JSONEq(t, `{"prompt_tokens":16,"completion_tokens":50,"total_tokens":66}`, string(last.Usage))
				assert.Contains(t, events[5], `"choices":[],"usage":{"prompt_tokens":16,"completion_tokens":50,"total_tokens":66}}`)
			}
		})
	}
}

// TestMessagesBody: Anthropic's message with usage.input_tokens and
// output_tokens.
func TestMessagesBody(t *testing.T) {
	_, url, cl, _ := serveFake(t, Config{Output: Uniform(1, 1)}, t0)
	body := `{"model":"claude-sonnet-4-5","system":"abcdefgh","max_tokens":7,` +
		`"messages":[{"role":"user","content":[{"type":"text","text":"hello"}]}]}`
	resp, b := post(t, cl, url+MessagesPath, body)
	require.Equal(t, 200, resp.StatusCode, b)
	assert.JSONEq(t, `{"id":"msg_fakellm_1","type":"message","role":"assistant","model":"claude-sonnet-4-5",`+
		`"content":[{"type":"text","text":"the fox ran far and saw two "}],"stop_reason":"max_tokens","stop_sequence":null,`+
		`"usage":{"input_tokens":13,"output_tokens":7}}`, b)
}

// TestMessagesStream: named events, message_start with the input tokens,
// content deltas, message_delta with the whole output, message_stop.
func TestMessagesStream(t *testing.T) {
	_, url, cl, _ := serveFake(t, Config{Output: Uniform(0.5, 0.5), Chunks: 2}, t0)
	resp, body := post(t, cl, url+MessagesPath, claudeBody(prompt16, 10, true))
	require.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "text/event-stream; charset=utf-8", resp.Header.Get("Content-Type"))
	assert.Equal(t, "no-cache", resp.Header.Get("Cache-Control"))
	events := sseEvents(t, body)
	var names []string
	var datas []map[string]any
	for _, e := range events {
		lines := strings.Split(e, "\n")
		require.Len(t, lines, 2, "%q", e)
		name, ok := strings.CutPrefix(lines[0], "event: ")
		require.True(t, ok, "%q", e)
		data, ok := strings.CutPrefix(lines[1], "data: ")
		require.True(t, ok, "%q", e)
		var d map[string]any
		require.NoError(t, json.Unmarshal([]byte(data), &d))
		assert.Equal(t, name, d["type"], "the event's name is its type")
		names = append(names, name)
		datas = append(datas, d)
	}
	assert.Equal(t, []string{"message_start", "content_block_start", "ping", "content_block_delta", "content_block_delta",
		"content_block_stop", "message_delta", "message_stop"}, names)
	start := datas[0]["message"].(map[string]any)
	assert.Equal(t, map[string]any{"input_tokens": 16.0, "output_tokens": 1.0}, start["usage"])
	assert.Equal(t, "msg_fakellm_1", start["id"])
	assert.Nil(t, start["stop_reason"])
	text := datas[3]["delta"].(map[string]any)["text"].(string) + datas[4]["delta"].(map[string]any)["text"].(string)
	assert.Equal(t, completionText(0, 5), text)
	assert.Equal(t, map[string]any{"output_tokens": 5.0}, datas[6]["usage"])
	assert.Equal(t, "end_turn", datas[6]["delta"].(map[string]any)["stop_reason"])
}

// TestInvalidRequests: answered in the endpoint's dialect, with the limit
// headers, spending nothing.
func TestInvalidRequests(t *testing.T) {
	cases := []struct {
		name   string
		method string
		path   string
		body   string
		status int
		want   string // in the body
	}{
		{"GET", http.MethodGet, ChatCompletionsPath, "", 405, `"type":"invalid_request_error"`},
		{"not JSON", http.MethodPost, ChatCompletionsPath, `{"model":`, 400, "could not parse the JSON body"},
		{"no model", http.MethodPost, ChatCompletionsPath, `{"messages":[{"role":"user","content":"hi"}]}`, 400, "model"},
		{"no messages", http.MethodPost, ChatCompletionsPath, `{"model":"m","messages":[]}`, 400, "messages"},
		{"bad content", http.MethodPost, ChatCompletionsPath, `{"model":"m","messages":[{"content":3}]}`, 400, "content must be"},
		{"max_tokens 0", http.MethodPost, ChatCompletionsPath, `{"model":"m","messages":[{"content":"x"}],"max_tokens":0}`, 400, "max_tokens"},
		{"anthropic without max_tokens", http.MethodPost, MessagesPath, `{"model":"m","messages":[{"content":"x"}]}`, 400,
			`{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required."}}`},
		{"unknown path", http.MethodPost, "/v1/completions", chatBody("x", 1, false), 404,
			`{"error":{"message":"Invalid URL (POST /v1/completions)","type":"invalid_request_error","param":null,"code":null}}`},
	}
	s, url, cl, _ := serveFake(t, Config{RPM: 10, TPM: 1000}, t0)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest(c.method, url+c.path, strings.NewReader(c.body))
			require.NoError(t, err)
			resp, err := cl.Do(req)
			require.NoError(t, err)
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			assert.Equal(t, c.status, resp.StatusCode)
			assert.Contains(t, string(b), c.want)
			if c.status != 404 {
				assert.NotEmpty(t, resp.Header.Get("x-ratelimit-remaining-requests")+resp.Header.Get("anthropic-ratelimit-requests-remaining"))
			}
		})
	}
	resp, _ := post(t, cl, url+ChatCompletionsPath, chatBody("x", 1, false))
	require.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "9", resp.Header.Get("x-ratelimit-remaining-requests"), "the invalid requests spent nothing")
	st := s.Stats()
	assert.Equal(t, len(cases)-1, st.Invalid)
	assert.Equal(t, len(cases), st.Requests, "the 404 is not counted")
	assert.Equal(t, 1, st.Accepted)
}
