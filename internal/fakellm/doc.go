// Package fakellm is a fake LLM provider for tests, demos and benchmarks:
// an http.Handler that answers OpenAI-style chat completions on
// POST /v1/chat/completions and Anthropic-style messages on POST
// /v1/messages, and enforces per-minute rate limits on requests and tokens
// over all its callers, exactly as its headers report them.
//
// The model. Each request's input tokens are counted from its body by a
// fixed rule (see InputTokens: one token per BytesPerToken bytes of text,
// rounded up, plus TokensPerMessage per message and TokensPerRequest per
// request), and its completion's output tokens are drawn, from a generator
// seeded by Config.Seed, between 1 and the request's max_tokens
// (Config.Output; by default uniformly in [max_tokens/4, max_tokens]). The
// limits are Config.RPM requests, Config.TPM input+output tokens, and
// optionally Config.InputTPM and Config.OutputTPM tokens, per
// Config.Minute (a minute by default; tests shorten it). Each limit is a
// token bucket refilled continuously (OpenAI's behaviour, the default), a
// fixed window or a sliding window (Config.Enforcement). A request is
// admitted only when every limit has room for what it is charged up front
// (Config.Upfront; by default 1 request and input + max_tokens tokens, as
// OpenAI reserves the maximum); otherwise it is refused with 429 and spends
// nothing. When the completion ends (the response is complete, or a
// stream's last content chunk is written), the request is charged its
// actual tokens, input + output: the difference with the up-front charge is
// refunded (or, when less was charged up front, charged extra).
//
// Every response from the two endpoints carries the provider's rate-limit
// headers, read at the moment the request was decided: OpenAI's
// x-ratelimit-{limit,remaining,reset}-{requests,tokens}, resets as Go
// durations ("1s", "6m0s", "12ms"), or Anthropic's
// anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,
// remaining,reset}, resets in RFC 3339. A reset is the time until the limit
// is whole again if nothing more were spent. A 429 adds retry-after-ms and
// retry-after (OpenAI) or retry-after (Anthropic), the time until every
// limit has room, and the provider's error body; a request too large ever
// to fit (its up-front charge exceeds a whole quota) gets the error body
// ("Request too large for ...") without retry headers. Stats tells what the
// provider accepted, refused and charged, and the peak usage each limit
// measured, so that a test can check no limit was ever exceeded.
//
//	llm, err := fakellm.New(fakellm.Config{RPM: 60, TPM: 30000, Minute: time.Second})
//	if err != nil { ... }
//	srv := httptest.NewServer(llm)
//	defer srv.Close()
//	... POST {"model":"gpt-4o","messages":[...],"max_tokens":100} to
//	    srv.URL + fakellm.ChatCompletionsPath ...
//	st := llm.Stats() // st.TPM.Peak <= 30000
package fakellm
