package sdk

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/egress-go/egress/internal/fakellm"
	"github.com/stretchr/testify/require"
)

// newAnthropic returns an anthropic-sdk-go client as a user makes one,
// with its default retries (2), its HTTP client hc, and opts.
func newAnthropic(url string, hc *http.Client, opts ...option.RequestOption) anthropic.Client {
	return anthropic.NewClient(append([]option.RequestOption{
		option.WithBaseURL(url),
		option.WithAPIKey("k"),
		option.WithHTTPClient(hc),
	}, opts...)...)
}

// anthropicParams is a message whose text names the call.
func anthropicParams(tag string, maxTokens int64) anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model:     anthropic.ModelClaudeHaiku5_5,
		MaxTokens: maxTokens,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello to " + tag + "."))},
	}
}

// anthropicMessage is one message.
func anthropicMessage(ctx context.Context, url string, hc *http.Client, tag string) error {
	return anthropicMessageWith()(ctx, url, hc, tag)
}

// anthropicMessageWith is one message by a client with opts.
func anthropicMessageWith(opts ...option.RequestOption) sdkCall {
	return func(ctx context.Context, url string, hc *http.Client, tag string) error {
		c := newAnthropic(url, hc, opts...)
		_, err := c.Messages.New(ctx, anthropicParams(tag, 16), option.WithHeader(callHeader, tag))
		return err
	}
}

// anthropicStream is one streamed message, read to its end.
func anthropicStream(ctx context.Context, url string, hc *http.Client, tag string) error {
	c := newAnthropic(url, hc)
	stream := c.Messages.NewStreaming(ctx, anthropicParams(tag, streamMaxTokens), option.WithHeader(callHeader, tag))
	defer stream.Close()
	for stream.Next() {
		_ = stream.Current()
	}
	return stream.Err()
}

// anthropicStatus is the status of an *anthropic.Error in err.
func anthropicStatus(err error) (int, bool) {
	var e *anthropic.Error
	if !errors.As(err, &e) {
		return 0, false
	}
	return e.StatusCode, true
}

// TestAnthropicAttemptsPerCall: with anthropic-sdk-go's default retries
// and egress WithRetry(MaxAttempts 3), a provider answering every attempt
// 429 or 529 sees each call at most 3 times, and the caller gets an
// *anthropic.Error with the provider's status. (Anthropic's retry-after
// is whole seconds: the 429s ask for 1 s.)
func TestAnthropicAttemptsPerCall(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		outage fakellm.Outage
		status int
	}{
		{"429 with retry-after 1", fakellm.Outage{Status: http.StatusTooManyRequests, RetryAfter: 100 * time.Millisecond}, 429},
		{"529 overloaded_error", fakellm.Outage{Status: fakellm.StatusOverloaded}, fakellm.StatusOverloaded},
		{"503 overloaded_error", fakellm.Outage{Status: http.StatusServiceUnavailable}, 503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkAttemptsPerCall(t, anthropicMessage, anthropicStatus, tc.outage, tc.status)
		})
	}
}

// TestAnthropicRefusalIsNotSent: a call egress refuses reaches the
// provider 0 times, though anthropic-sdk-go sends it again
// (X-Stainless-Retry-Count 1, 2), and its error matches
// egress.ErrRateLimited. With WithRequestTimeout, anthropic-sdk-go gives
// each attempt a context of its own, with a deadline of its own.
func TestAnthropicRefusalIsNotSent(t *testing.T) {
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
			checkRefusalNotSent(t, anthropicMessageWith(tc.opts...), llm)
		})
	}
}

// TestAnthropicStreams is the stream scenario with anthropic-sdk-go.
func TestAnthropicStreams(t *testing.T) {
	t.Parallel()
	runStreams(t, anthropicStream)
}
