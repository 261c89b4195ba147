package dialect

// The names of the headers the readers read, and the quota a
// "used/capacity" pair says. The grammar of their values (counts, resets,
// timestamps, structured-field members) is internal/field's.

// Header names, in the canonical form of http.CanonicalHeaderKey, so that a
// lookup is a plain map index and costs no allocation.
const (
	hRateLimit           = "Ratelimit"
	hRateLimitPolicy     = "Ratelimit-Policy"
	hBetaRateLimit       = "Beta-Ratelimit"
	hBetaRateLimitPolicy = "Beta-Ratelimit-Policy"
	hRateLimitLimit      = "Ratelimit-Limit"
	hRateLimitRemaining  = "Ratelimit-Remaining"
	hRateLimitReset      = "Ratelimit-Reset"
	hRateLimitResetTime  = "Ratelimit-Resettime"
	hRateLimitName       = "Ratelimit-Name"
	hRateLimitObserved   = "Ratelimit-Observed"

	hXRateLimitLimit      = "X-Ratelimit-Limit"
	hXRateLimitRemaining  = "X-Ratelimit-Remaining"
	hXRateLimitUsed       = "X-Ratelimit-Used"
	hXRateLimitReset      = "X-Ratelimit-Reset"
	hXRateLimitResetAfter = "X-Ratelimit-Reset-After"
	hXRateLimitResource   = "X-Ratelimit-Resource"
	hXRateLimitBucket     = "X-Ratelimit-Bucket"
	hXRateLimitGlobal     = "X-Ratelimit-Global"
	hXRateLimitScope      = "X-Ratelimit-Scope"

	hXRateLimitHyphen          = "X-Rate-Limit"
	hXRateLimitHyphenLimit     = "X-Rate-Limit-Limit"
	hXRateLimitHyphenRemaining = "X-Rate-Limit-Remaining"
	hXRateLimitHyphenReset     = "X-Rate-Limit-Reset"
	hFastlyRemaining           = "Fastly-Ratelimit-Remaining"
	hFastlyReset               = "Fastly-Ratelimit-Reset"

	hXRateLimitLimitRequests     = "X-Ratelimit-Limit-Requests"
	hXRateLimitLimitTokens       = "X-Ratelimit-Limit-Tokens"
	hXRateLimitRemainingRequests = "X-Ratelimit-Remaining-Requests"
	hXRateLimitRemainingTokens   = "X-Ratelimit-Remaining-Tokens"
	hXRateLimitResetRequests     = "X-Ratelimit-Reset-Requests"
	hXRateLimitResetTokens       = "X-Ratelimit-Reset-Tokens"

	hAnthropicRequestsLimit     = "Anthropic-Ratelimit-Requests-Limit"
	hAnthropicRequestsRemaining = "Anthropic-Ratelimit-Requests-Remaining"
	hAnthropicRequestsReset     = "Anthropic-Ratelimit-Requests-Reset"
	hAnthropicTokensLimit       = "Anthropic-Ratelimit-Tokens-Limit"
	hAnthropicTokensRemaining   = "Anthropic-Ratelimit-Tokens-Remaining"
	hAnthropicTokensReset       = "Anthropic-Ratelimit-Tokens-Reset"
	hAnthropicInputLimit        = "Anthropic-Ratelimit-Input-Tokens-Limit"
	hAnthropicInputRemaining    = "Anthropic-Ratelimit-Input-Tokens-Remaining"
	hAnthropicInputReset        = "Anthropic-Ratelimit-Input-Tokens-Reset"
	hAnthropicOutputLimit       = "Anthropic-Ratelimit-Output-Tokens-Limit"
	hAnthropicOutputRemaining   = "Anthropic-Ratelimit-Output-Tokens-Remaining"
	hAnthropicOutputReset       = "Anthropic-Ratelimit-Output-Tokens-Reset"

	hShopifyCallLimit = "X-Shopify-Shop-Api-Call-Limit"
	hGorgiasCallLimit = "X-Gorgias-Account-Api-Call-Limit"
	hSforceLimitInfo  = "Sforce-Limit-Info"

	hHubSpotDaily             = "X-Hubspot-Ratelimit-Daily"
	hHubSpotDailyRemaining    = "X-Hubspot-Ratelimit-Daily-Remaining"
	hHubSpotSecondly          = "X-Hubspot-Ratelimit-Secondly"
	hHubSpotSecondlyRemaining = "X-Hubspot-Ratelimit-Secondly-Remaining"
	hHubSpotIntervalMs        = "X-Hubspot-Ratelimit-Interval-Milliseconds"
	hHubSpotMax               = "X-Hubspot-Ratelimit-Max"
	hHubSpotRemaining         = "X-Hubspot-Ratelimit-Remaining"

	hStripeReason = "Stripe-Rate-Limited-Reason"

	hXRateLimitNearLimit     = "X-Ratelimit-Nearlimit"
	hXBetaRateLimitNearLimit = "X-Beta-Ratelimit-Nearlimit"
	hRateLimitReason         = "Ratelimit-Reason"
	hXBetaRateLimitReason    = "X-Beta-Ratelimit-Reason"
	hXBetaRateLimitReset     = "X-Beta-Ratelimit-Reset"

	zendeskPrefix = "Zendesk-Ratelimit-"
)

// StripeShouldRetry is Stripe's word on retrying a response, which the
// stripe reader reads and the root's Transport writes (false) on a
// response it has retried as far as its policy allows.
const StripeShouldRetry = "Stripe-Should-Retry"

// pairQuota is the quota a "used/capacity" pair says: Remaining is what is
// left of the capacity, never below 0.
func pairQuota(used, capacity float64) Quota {
	return Quota{
		Dimension: Requests,
		Limit:     capacity, HasLimit: true,
		Used: used, HasUsed: true,
		Remaining: max(capacity-used, 0), HasRemaining: true,
	}
}

// Headers returns the name of every header the readers read, a Zendesk
// field by one example's: for tests that send them all.
func Headers() []string {
	return []string{
		hRateLimit, hRateLimitPolicy, hBetaRateLimit, hBetaRateLimitPolicy,
		hRateLimitLimit, hRateLimitRemaining, hRateLimitReset, hRateLimitResetTime, hRateLimitName, hRateLimitObserved,
		hXRateLimitLimit, hXRateLimitRemaining, hXRateLimitUsed, hXRateLimitReset, hXRateLimitResetAfter,
		hXRateLimitResource, hXRateLimitBucket, hXRateLimitGlobal, hXRateLimitScope,
		hXRateLimitHyphen, hXRateLimitHyphenLimit, hXRateLimitHyphenRemaining, hXRateLimitHyphenReset, hFastlyRemaining, hFastlyReset,
		hXRateLimitLimitRequests, hXRateLimitLimitTokens, hXRateLimitRemainingRequests, hXRateLimitRemainingTokens,
		hXRateLimitResetRequests, hXRateLimitResetTokens,
		hAnthropicRequestsLimit, hAnthropicRequestsRemaining, hAnthropicRequestsReset, hAnthropicTokensLimit,
		hAnthropicTokensRemaining, hAnthropicTokensReset, hAnthropicInputLimit, hAnthropicInputRemaining, hAnthropicInputReset,
		hAnthropicOutputLimit, hAnthropicOutputRemaining, hAnthropicOutputReset,
		hShopifyCallLimit, hGorgiasCallLimit, hSforceLimitInfo,
		hHubSpotDaily, hHubSpotDailyRemaining, hHubSpotSecondly, hHubSpotSecondlyRemaining, hHubSpotIntervalMs, hHubSpotMax, hHubSpotRemaining,
		StripeShouldRetry, hStripeReason, hXRateLimitNearLimit, hXBetaRateLimitNearLimit, hRateLimitReason, hXBetaRateLimitReason,
		hXBetaRateLimitReset, zendeskPrefix + "Tickets-Index",
	}
}
