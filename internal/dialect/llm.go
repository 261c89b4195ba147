package dialect

import (
	"encoding/json"
	"net/http"

	"github.com/egress-go/egress/internal/field"
)

// The built-in readers of the LLM providers' dialects.

// openAIReader reads OpenAI's, Azure OpenAI's and Groq's
// x-ratelimit-{limit,remaining,reset}-{requests,tokens}: one Quota for
// requests and one for tokens, whose reset is the time until the bucket is
// full again ("6m0s", "12ms", "2m59.56s"; Azure sends plain seconds, which
// the shape rule reads too). Azure's -1 sentinels are ignored. A 429 whose
// JSON body says insufficient_quota (as its type or code) is a billing
// error: ScopeBilling, RetryNo.
type openAIReader struct{}

func (openAIReader) read(resp *http.Response, s *Reading) {
	h := resp.Header
	readBucketQuota(s, Requests, h[hXRateLimitLimitRequests], h[hXRateLimitRemainingRequests], h[hXRateLimitResetRequests], hXRateLimitResetRequests)
	readBucketQuota(s, Tokens, h[hXRateLimitLimitTokens], h[hXRateLimitRemainingTokens], h[hXRateLimitResetTokens], hXRateLimitResetTokens)
	if b := jsonErrorPrefix(resp, "insufficient_quota"); b != nil {
		var body struct {
			Error struct {
				Type any `json:"type"`
				Code any `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal(b, &body) // a field of the wrong type leaves the others read
		if body.Error.Type == "insufficient_quota" || body.Error.Code == "insufficient_quota" {
			s.SetScope(ScopeBilling)
			s.SetRetry(RetryNo)
		}
	}
}

// anthropicReader reads anthropic-ratelimit-{requests,tokens,input-tokens,
// output-tokens}-{limit,remaining,reset}: one Quota per dimension, whose
// reset (RFC 3339) is when the bucket is fully replenished. Anthropic's
// retry-after, retry-after-ms and x-should-retry are retryReader's.
type anthropicReader struct{}

func (anthropicReader) read(resp *http.Response, s *Reading) {
	h := resp.Header
	readBucketQuota(s, Requests, h[hAnthropicRequestsLimit], h[hAnthropicRequestsRemaining], h[hAnthropicRequestsReset], hAnthropicRequestsReset)
	readBucketQuota(s, Tokens, h[hAnthropicTokensLimit], h[hAnthropicTokensRemaining], h[hAnthropicTokensReset], hAnthropicTokensReset)
	readBucketQuota(s, InputTokens, h[hAnthropicInputLimit], h[hAnthropicInputRemaining], h[hAnthropicInputReset], hAnthropicInputReset)
	readBucketQuota(s, OutputTokens, h[hAnthropicOutputLimit], h[hAnthropicOutputRemaining], h[hAnthropicOutputReset], hAnthropicOutputReset)
}

// readBucketQuota adds the quota of dimension d that a bucket server's
// limit, remaining and reset values state, if any; resetHeader names the
// reset for WithResetUnit.
func readBucketQuota(s *Reading, d Dimension, limit, remaining, reset []string, resetHeader string) {
	if len(limit) == 0 && len(remaining) == 0 && len(reset) == 0 {
		return
	}
	q := Quota{Dimension: d, Kind: KindBucket}
	q.Limit, q.HasLimit = field.Lowest(limit)
	q.Remaining, q.HasRemaining = field.Lowest(remaining)
	q.Reset, q.HasReset = field.LatestReset(reset, s.ResetUnit(resetHeader), s.Now(), s.MaxWait())
	s.AddQuota(q)
}
