package sdk

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/egress-go/egress/internal/fakellm"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"
)

// newOpenAI returns an openai-go client as a user makes one, with its
// default retries (2), its HTTP client hc, and opts.
func newOpenAI(url string, hc *http.Client, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{
		option.WithBaseURL(url + "/v1"),
		option.WithAPIKey("k"),
		option.WithHTTPClient(hc),
	}, opts...)...)
}

// openAIParams is a chat completion whose message names the call.
func openAIParams(tag string, maxTokens int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     openai.ChatModelGPT4oMini,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello to " + tag + ".")},
		MaxTokens: openai.Int(maxTokens),
	}
}

// openAIChat is one chat completion.
func openAIChat(ctx context.Context, url string, hc *http.Client, tag string) error {
	return openAIChatWith()(ctx, url, hc, tag)
}

// openAIChatWith is one chat completion by a client with opts.
func openAIChatWith(opts ...option.RequestOption) sdkCall {
	return func(ctx context.Context, url string, hc *http.Client, tag string) error {
		c := newOpenAI(url, hc, opts...)
		_, err := c.Chat.Completions.New(ctx, openAIParams(tag, 16), option.WithHeader(callHeader, tag))
		return err
	}
}

// openAIStream is one streamed chat completion, read to its end.
func openAIStream(ctx context.Context, url string, hc *http.Client, tag string) error {
	c := newOpenAI(url, hc)
	params := openAIParams(tag, streamMaxTokens)
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := c.Chat.Completions.NewStreaming(ctx, params, option.WithHeader(callHeader, tag))
	defer stream.Close()
	for stream.Next() {
		_ = stream.Current()
	}
	return stream.Err()
}

// openAIStatus is the status of an *openai.Error in err.
func openAIStatus(err error) (int, bool) {
	var e *openai.Error
	if !errors.As(err, &e) {
		return 0, false
	}
	return e.StatusCode, true
}

// TestOpenAIAttemptsPerCall: with openai-go's default retries and egress
// WithRetry(MaxAttempts 3), a provider answering every attempt 429 or 503
// sees each call at most 3 times, and the caller gets an *openai.Error
// with the provider's status.
func TestOpenAIAttemptsPerCall(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		outage fakellm.Outage
		status int
	}{
		{"429 with retry-after-ms 100", fakellm.Outage{Status: http.StatusTooManyRequests, RetryAfter: 100 * time.Millisecond}, 429},
		{"503 overloaded without Retry-After", fakellm.Outage{Status: http.StatusServiceUnavailable}, 503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkAttemptsPerCall(t, openAIChat, openAIStatus, tc.outage, tc.status)
		})
	}
}

// TestOpenAIRefusalIsNotSent: a call egress refuses reaches the provider
// 0 times, though openai-go sends it again (X-Stainless-Retry-Count 1, 2),
// and its error matches egress.ErrRateLimited. With WithRequestTimeout,
// openai-go gives each attempt a context of its own, with a deadline of
// its own.
func TestOpenAIRefusalIsNotSent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts []option.RequestOption
	}{
		{"default options", nil},
		{"WithRequestTimeout 5s", []option.RequestOption{option.WithRequestTimeout(5 * time.Second)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			llm, err := fakellm.New(fakellm.Config{})
			require.NoError(t, err)
			checkRefusalNotSent(t, openAIChatWith(tc.opts...), llm)
		})
	}
}

// TestOpenAIStreams is the stream scenario with openai-go.
func TestOpenAIStreams(t *testing.T) {
	t.Parallel()
	runStreams(t, openAIStream)
}
