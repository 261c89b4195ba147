package fakellm

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// The token-counting rule, the same for both endpoints. It is a stand-in
// for a tokenizer: deterministic, cheap, and close to the "4 characters per
// token" rule of thumb for English text.
const (
	// BytesPerToken is how many bytes of text make one token, the last
	// one rounded up: 1 to 4 bytes are 1 token, 5 bytes are 2.
	BytesPerToken = 4
	// TokensPerMessage is the overhead of each message (its role and
	// delimiters), and of a non-null Anthropic system prompt.
	TokensPerMessage = 3
	// TokensPerRequest is the overhead of each request (the priming of the
	// reply).
	TokensPerRequest = 3
)

// TextTokens is the number of tokens of s: ⌈len(s)/BytesPerToken⌉, len in
// bytes. The text of a completion of n output tokens counts n tokens.
func TextTokens(s string) int {
	return (len(s) + BytesPerToken - 1) / BytesPerToken
}

// InputTokens is the number of input tokens the provider charges for a
// request body of either endpoint:
//
//	TokensPerRequest + Σ over the messages (and a non-null top-level
//	"system") of TokensPerMessage + TextTokens(its text)
//
// A message's text is its "content" when that is a string, or the
// concatenation of the "text" fields of its parts when it is an array
// (other parts, such as images, count nothing). Other fields (model, role,
// name, tools) count nothing. It fails only when the body is not such a
// JSON object; a body without messages counts TokensPerRequest.
func InputTokens(body []byte) (int, error) {
	var w wireRequest
	if err := json.Unmarshal(body, &w); err != nil {
		return 0, fmt.Errorf("fakellm: request body: %w", err)
	}
	return w.inputTokens(), nil
}

// wireRequest is the part of a request body the provider reads, from
// either endpoint.
type wireRequest struct {
	Model               string        `json:"model"`
	Messages            []wireMessage `json:"messages"`
	System              text          `json:"system"`
	MaxTokens           *int          `json:"max_tokens"`
	MaxCompletionTokens *int          `json:"max_completion_tokens"`
	Stream              bool          `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

type wireMessage struct {
	Role    string `json:"role"`
	Content text   `json:"content"`
}

func (w *wireRequest) inputTokens() int {
	n := TokensPerRequest
	if w.System.set {
		n += TokensPerMessage + TextTokens(w.System.s)
	}
	for _, m := range w.Messages {
		n += TokensPerMessage + TextTokens(m.Content.s)
	}
	return n
}

// text is a message's content or a system prompt: a string, an array of
// parts with "text" fields, or null.
type text struct {
	s   string
	set bool // not null
}

var errContent = errors.New("content must be a string or an array of content parts")

// UnmarshalJSON reads a string, an array of parts, or null.
func (t *text) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*t = text{}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*t = text{s: s, set: true}
		return nil
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if err := json.Unmarshal(b, &parts); err != nil {
		return errContent
	}
	var sb strings.Builder
	for _, p := range parts {
		sb.WriteString(p.Text)
	}
	*t = text{s: sb.String(), set: true}
	return nil
}
