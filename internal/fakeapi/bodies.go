package fakeapi

import (
	"fmt"
	"net/http"
	"strings"
)

// The JSON bodies, Stripe-like unless a dialect has its own.
const (
	bodyOK          = `{"object":"charge","status":"succeeded"}`
	bodyRateLimited = `{"error":{"type":"rate_limit_error","message":"Too many requests hit the API too quickly."}}`
	bodyUnavailable = `{"error":{"type":"api_error","message":"The service is temporarily unavailable."}}`
	bodyInvalid     = `{"error":{"type":"invalid_request_error","message":"Missing required param: amount."}}`

	// bodyLockTimeout is Stripe's 429 for an object another request holds:
	// not a rate limit.
	bodyLockTimeout = `{"error":{"code":"lock_timeout","type":"invalid_request_error",` +
		`"message":"This object cannot be accessed right now because another API request or Stripe process is currently accessing it. Please retry in a moment."}}`
	// bodyInsufficientQuota is OpenAI's billing error, sent as a 429: not
	// a rate limit, and retrying does not help.
	bodyInsufficientQuota = `{"error":{"message":"You exceeded your current quota, please check your plan and billing details.",` +
		`"type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`
)

// body is a Stripe-like JSON body for status.
func body(status int) string {
	switch status {
	case http.StatusOK:
		return bodyOK
	case http.StatusTooManyRequests:
		return bodyRateLimited
	case http.StatusServiceUnavailable:
		return bodyUnavailable
	default:
		return bodyInvalid
	}
}

// body is the answer's JSON body in the API's dialect.
func (api *API) body(a *answer) string {
	switch {
	case a.cause == causeBilling:
		return bodyInsufficientQuota
	case a.cause == causeStorm && api.cfg.Storm.LockTimeout:
		return bodyLockTimeout
	case a.throttled() && a.status != http.StatusServiceUnavailable:
		return api.cfg.Dialect.throttledBody(a)
	}
	return body(a.status)
}

// throttledBody is the body of a refusal or a storm's 429.
func (d Dialect) throttledBody(a *answer) string {
	storm := a.cause == causeStorm
	switch d {
	case GitHub:
		if storm {
			return `{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again.",` +
				`"documentation_url":"https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"}`
		}
		return `{"message":"API rate limit exceeded.","documentation_url":"https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"}`
	case Okta:
		return `{"errorCode":"E0000047","errorSummary":"API call exceeded rate limit due to too many requests."}`
	case OpenAI, AzureOpenAI:
		kind := "requests"
		if !storm && a.readings[a.by].Unit != Requests {
			kind = "tokens"
		}
		return fmt.Sprintf(`{"error":{"message":"Rate limit reached for %s.","type":"%s","param":null,"code":"rate_limit_exceeded"}}`, kind, kind)
	case Anthropic:
		return `{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed the rate limit."}}`
	case Discord:
		global := !storm && a.readings[a.by].Name == "global"
		return fmt.Sprintf(`{"message":"You are being rate limited.","retry_after":%s,"global":%t}`, decimalSeconds(a.retryAfter), global)
	case Shopify:
		return `{"errors":"Exceeded 2 calls per second for api client. Reduce request rates to resume uninterrupted service."}`
	case Salesforce:
		return `[{"message":"TotalRequests Limit exceeded.","errorCode":"REQUEST_LIMIT_EXCEEDED"}]`
	case HubSpot:
		policy := "SECONDLY"
		if !storm {
			if _, daily := hubSpotPolicies(a.readings); daily != nil && daily.Name == a.readings[a.by].Name {
				policy = "DAILY"
			}
		}
		return fmt.Sprintf(`{"status":"error","message":"You have reached your %s limit.","errorType":"RATE_LIMIT","policyName":"%s"}`,
			strings.ToLower(policy), policy)
	}
	return bodyRateLimited
}
