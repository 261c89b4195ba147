package fakellm

import (
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// anthropic is the dialect of MessagesPath.
type anthropic struct{}

// maxTokens: Anthropic requires max_tokens.
func (anthropic) maxTokens(w *wireRequest, _ int) *int { return w.MaxTokens }

// writeLimits writes anthropic-ratelimit-{requests,tokens,input-tokens,
// output-tokens}-{limit,remaining,reset}. The tokens headers report the
// token limit (TPM, InputTPM or OutputTPM) with the least remaining, the
// most restrictive one. Remaining counts are exact (Anthropic rounds
// token counts to the thousand); resets are RFC 3339, rounded up to the
// second.
func (anthropic) writeLimits(h http.Header, now time.Time, rs []reading) {
	write := func(name string, r reading) {
		p := "anthropic-ratelimit-" + name + "-"
		h.Set(p+"limit", strconv.Itoa(r.quota))
		h.Set(p+"remaining", strconv.Itoa(r.remaining))
		h.Set(p+"reset", rfc3339(now, r.reset))
	}
	var tokens *reading
	for i, r := range rs {
		switch r.dim {
		case dimRequests:
			write("requests", r)
			continue
		case dimInput:
			write("input-tokens", r)
		case dimOutput:
			write("output-tokens", r)
		}
		if tokens == nil || r.remaining < tokens.remaining {
			tokens = &rs[i]
		}
	}
	if tokens != nil {
		write("tokens", *tokens)
	}
}

func (anthropic) writeRetry(h http.Header, wait time.Duration) {
	h.Set("retry-after", retrySeconds(wait))
}

type anthropicError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func anthropicErrorBody(typ, msg string) []byte {
	e := anthropicError{Type: "error"}
	e.Error.Type, e.Error.Message = typ, msg
	return mustJSON(e)
}

func (anthropic) invalidBody(bad *invalid) []byte {
	typ := "invalid_request_error"
	if bad.status == http.StatusRequestEntityTooLarge {
		typ = "request_too_large"
	}
	return anthropicErrorBody(typ, bad.msg)
}

// refusalBody is Anthropic's rate_limit_error.
func (anthropic) refusalBody(r refusal) []byte {
	unit := "tokens"
	switch r.reading.dim {
	case dimRequests:
		unit = "requests"
	case dimInput:
		unit = "input tokens"
	case dimOutput:
		unit = "output tokens"
	}
	msg := fmt.Sprintf("This request would exceed the rate limit for your organization (%s) of %s %s per minute. "+
		"For details, refer to: https://docs.claude.com/en/api/rate-limits. "+
		"You can see the response headers for current usage. "+
		"Please reduce the prompt length or the maximum tokens requested, or try again later.",
		organization, thousands(r.reading.quota), unit)
	return anthropicErrorBody("rate_limit_error", msg)
}

type anthropicUsage struct {
	InputTokens  int `json:"input_tokens,omitempty"`
	OutputTokens int `json:"output_tokens"`
}

type anthropicMessage struct {
	ID           string          `json:"id"`
	Type         string          `json:"type"`
	Role         string          `json:"role"`
	Model        string          `json:"model"`
	Content      []anthropicText `json:"content"`
	StopReason   *string         `json:"stop_reason"`
	StopSequence *string         `json:"stop_sequence"`
	Usage        anthropicUsage  `json:"usage"`
}

type anthropicText struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

func (c completion) stopReason() string {
	if c.truncated() {
		return "max_tokens"
	}
	return "end_turn"
}

// message is the body's message, or the message_start event's (no
// content, no stop reason, output_tokens 1) when start.
func (c completion) message(start bool) anthropicMessage {
	m := anthropicMessage{
		ID:      "msg_fakellm_" + strconv.Itoa(c.id),
		Type:    "message",
		Role:    "assistant",
		Model:   c.model,
		Content: []anthropicText{},
		Usage:   anthropicUsage{InputTokens: c.input, OutputTokens: 1},
	}
	if !start {
		stop := c.stopReason()
		m.Content = append(m.Content, anthropicText{Type: "text", Text: completionText(0, c.output)})
		m.StopReason = &stop
		m.Usage.OutputTokens = c.output
	}
	return m
}

func (anthropic) completionBody(c completion) []byte { return mustJSON(c.message(false)) }

// event frames one named event.
func event(name string, data any) string {
	return "event: " + name + "\ndata: " + string(mustJSON(data)) + "\n\n"
}

type typed struct {
	Type string `json:"type"`
}

// streamStart is message_start (usage.input_tokens, and output_tokens 1
// as Anthropic sends), content_block_start and a ping.
func (anthropic) streamStart(c completion) []string {
	return []string{
		event("message_start", struct {
			Type    string           `json:"type"`
			Message anthropicMessage `json:"message"`
		}{"message_start", c.message(true)}),
		event("content_block_start", struct {
			Type         string        `json:"type"`
			Index        int           `json:"index"`
			ContentBlock anthropicText `json:"content_block"`
		}{"content_block_start", 0, anthropicText{Type: "text"}}),
		event("ping", typed{"ping"}),
	}
}

type textDelta struct {
	Type string `json:"type"` // "text_delta"
	Text string `json:"text"`
}

type blockDelta struct {
	Type  string    `json:"type"`
	Index int       `json:"index"`
	Delta textDelta `json:"delta"`
}

type stopDelta struct {
	StopReason   string  `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
}

type messageDelta struct {
	Type  string         `json:"type"`
	Delta stopDelta      `json:"delta"`
	Usage anthropicUsage `json:"usage"`
}

type blockStop struct {
	Type  string `json:"type"`
	Index int    `json:"index"`
}

func (anthropic) streamDelta(_ completion, text string) []string {
	return []string{event("content_block_delta", blockDelta{Type: "content_block_delta", Delta: textDelta{"text_delta", text}})}
}

// streamEnd is content_block_stop, message_delta (the stop reason and
// usage.output_tokens, the whole output) and message_stop.
func (anthropic) streamEnd(c completion) []string {
	return []string{
		event("content_block_stop", blockStop{"content_block_stop", 0}),
		event("message_delta", messageDelta{
			Type:  "message_delta",
			Delta: stopDelta{StopReason: c.stopReason()},
			Usage: anthropicUsage{OutputTokens: c.output},
		}),
		event("message_stop", typed{"message_stop"}),
	}
}
