package fakellm

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// openAI is the dialect of ChatCompletionsPath.
type openAI struct{}

func (openAI) maxTokens(w *wireRequest, def int) *int {
	switch {
	case w.MaxCompletionTokens != nil:
		return w.MaxCompletionTokens
	case w.MaxTokens != nil:
		return w.MaxTokens
	}
	return &def
}

// writeLimits writes the requests and tokens limits; OpenAI has no headers
// for InputTPM and OutputTPM.
func (openAI) writeLimits(h http.Header, _ time.Time, rs []reading) {
	for _, r := range rs {
		var name string
		switch r.dim {
		case dimRequests:
			name = "requests"
		case dimTokens:
			name = "tokens"
		default:
			continue
		}
		h.Set("x-ratelimit-limit-"+name, strconv.Itoa(r.quota))
		h.Set("x-ratelimit-remaining-"+name, strconv.Itoa(r.remaining))
		h.Set("x-ratelimit-reset-"+name, goDuration(r.reset))
	}
}

func (openAI) writeRetry(h http.Header, wait time.Duration) {
	h.Set("retry-after-ms", strconv.FormatInt(max(1, ceilMillis(wait)), 10))
	h.Set("retry-after", retrySeconds(wait))
}

type openAIError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func openAIErrorBody(msg, typ string, code *string) []byte {
	var e openAIError
	e.Error.Message, e.Error.Type, e.Error.Code = msg, typ, code
	return mustJSON(e)
}

func (openAI) invalidBody(bad *invalid) []byte {
	return openAIErrorBody(bad.msg, "invalid_request_error", nil)
}

// openAILimitName is a dimension's name in the messages, and the error
// type of its refusals.
func openAILimitName(d dimension) (text, typ string) {
	switch d {
	case dimRequests:
		return "requests per min (RPM)", "requests"
	case dimInput:
		return "input tokens per min (ITPM)", "input_tokens"
	case dimOutput:
		return "output tokens per min (OTPM)", "output_tokens"
	}
	return "tokens per min (TPM)", "tokens"
}

// refusalBody is OpenAI's rate-limit error: "Rate limit reached for ...",
// or "Request too large for ..." when the request never fits.
func (openAI) refusalBody(r refusal) []byte {
	const more = "Visit https://platform.openai.com/account/rate-limits to learn more."
	name, typ := openAILimitName(r.reading.dim)
	code := "rate_limit_exceeded"
	var msg string
	if r.tooLarge {
		msg = fmt.Sprintf("Request too large for %s in organization %s on %s: Limit %d, Requested %d. "+
			"The input or output tokens must be reduced in order to run successfully. %s",
			r.model, organization, name, r.reading.quota, r.requested, more)
	} else {
		msg = fmt.Sprintf("Rate limit reached for %s in organization %s on %s: Limit %d, Used %d, Requested %d. "+
			"Please try again in %s. %s",
			r.model, organization, name, r.reading.quota, r.used(), r.requested, goDuration(r.wait), more)
	}
	return openAIErrorBody(msg, typ, &code)
}

type openAIUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func (c completion) openAIUsage() openAIUsage {
	return openAIUsage{PromptTokens: c.input, CompletionTokens: c.output, TotalTokens: c.input + c.output}
}

func (c completion) openAIID() string { return "chatcmpl-fakellm-" + strconv.Itoa(c.id) }

func (c completion) finishReason() string {
	if c.truncated() {
		return "length"
	}
	return "stop"
}

// chatCompletion is OpenAI's non-streamed body, usage at the end.
type chatCompletion struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	Choices           []choice     `json:"choices"`
	SystemFingerprint string       `json:"system_fingerprint"`
	Usage             *openAIUsage `json:"usage"`
}

type choice struct {
	Index        int       `json:"index"`
	Message      *message  `json:"message,omitempty"`
	Delta        *delta    `json:"delta,omitempty"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
}

type message struct {
	Role    string  `json:"role"`
	Content string  `json:"content"`
	Refusal *string `json:"refusal"`
}

type delta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

const fingerprint = "fp_fakellm"

func (openAI) completionBody(c completion) []byte {
	finish := c.finishReason()
	u := c.openAIUsage()
	return mustJSON(chatCompletion{
		ID:      c.openAIID(),
		Object:  "chat.completion",
		Created: c.created.Unix(),
		Model:   c.model,
		Choices: []choice{{
			Message:      &message{Role: "assistant", Content: completionText(0, c.output)},
			FinishReason: &finish,
		}},
		SystemFingerprint: fingerprint,
		Usage:             &u,
	})
}

// chunk is one event of OpenAI's stream. Usage is left out unless the
// usage chunk is sent; then it is null in every other chunk.
type chunk struct {
	ID                string          `json:"id"`
	Object            string          `json:"object"`
	Created           int64           `json:"created"`
	Model             string          `json:"model"`
	SystemFingerprint string          `json:"system_fingerprint"`
	Choices           []choice        `json:"choices"`
	Usage             json.RawMessage `json:"usage,omitempty"`
}

// chunk is the event of one choice (none when ch is nil), with usage, or
// a null usage when the usage chunk is to come.
func (c completion) chunk(ch *choice, usage *openAIUsage) string {
	k := chunk{
		ID:                c.openAIID(),
		Object:            "chat.completion.chunk",
		Created:           c.created.Unix(),
		Model:             c.model,
		SystemFingerprint: fingerprint,
		Choices:           []choice{},
	}
	if ch != nil {
		k.Choices = append(k.Choices, *ch)
	}
	switch {
	case usage != nil:
		k.Usage = mustJSON(usage)
	case c.includeUsage:
		k.Usage = json.RawMessage("null")
	}
	return "data: " + string(mustJSON(k)) + "\n\n"
}

func (openAI) streamStart(c completion) []string {
	empty := ""
	return []string{c.chunk(&choice{Delta: &delta{Role: "assistant", Content: &empty}}, nil)}
}

func (openAI) streamDelta(c completion, text string) []string {
	return []string{c.chunk(&choice{Delta: &delta{Content: &text}}, nil)}
}

// streamEnd is the finish chunk, the usage chunk (with no choices) when
// asked for, and [DONE].
func (openAI) streamEnd(c completion) []string {
	finish := c.finishReason()
	events := []string{c.chunk(&choice{Delta: &delta{}, FinishReason: &finish}, nil)}
	if c.includeUsage {
		u := c.openAIUsage()
		events = append(events, c.chunk(nil, &u))
	}
	return append(events, "data: [DONE]\n\n")
}
