package fakellm_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/egress-go/egress/internal/clock"
	"github.com/egress-go/egress/internal/fakellm"
)

// A provider of 3 requests and 1000 tokens per minute, on a clock that
// does not move: each completion reserves input + max_tokens and is
// refunded what its output did not use; the fourth request is refused by
// RPM.
func Example() {
	llm, err := fakellm.New(fakellm.Config{
		RPM:    3,
		TPM:    1000,
		Output: fakellm.Uniform(0.5, 0.5), // always half of max_tokens
		Clock:  clock.NewFake(time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)),
	})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(llm)
	tr := &http.Transport{}
	defer srv.Close()
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}

	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"Say hello."}],"max_tokens":200}`
	for range 4 {
		resp, err := c.Post(srv.URL+fakellm.ChatCompletionsPath, "application/json", strings.NewReader(body))
		if err != nil {
			panic(err)
		}
		var completion struct {
			Usage struct {
				Total int `json:"total_tokens"`
			} `json:"usage"`
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		json.Unmarshal(b, &completion)
		h := resp.Header
		fmt.Printf("%d used %d; requests %s %s; tokens %s %s; retry-after-ms %q\n", resp.StatusCode, completion.Usage.Total,
			h.Get("x-ratelimit-remaining-requests"), h.Get("x-ratelimit-reset-requests"),
			h.Get("x-ratelimit-remaining-tokens"), h.Get("x-ratelimit-reset-tokens"), h.Get("retry-after-ms"))
	}
	st := llm.Stats()
	fmt.Println("accepted", st.Accepted, "refused", st.Refused, "by RPM", st.RPM.Refused)
	fmt.Println("charged", st.InputTokens+st.OutputTokens, "peak TPM", st.TPM.Peak, "of", st.TPM.Limit)
	// Output:
	// 200 used 109; requests 2 20s; tokens 791 12.54s; retry-after-ms ""
	// 200 used 109; requests 1 40s; tokens 682 19.08s; retry-after-ms ""
	// 200 used 109; requests 0 1m0s; tokens 573 25.62s; retry-after-ms ""
	// 429 used 0; requests 0 1m0s; tokens 673 19.62s; retry-after-ms "20000"
	// accepted 3 refused 1 by RPM 1
	// charged 327 peak TPM 427 of 1000
}

// InputTokens counts a body as the provider does, so that a client can
// estimate a request's cost with the same rule.
func ExampleInputTokens() {
	n, err := fakellm.InputTokens([]byte(`{"model":"gpt-4o","messages":[
		{"role":"system","content":"You are terse."},
		{"role":"user","content":"Say hello."}]}`))
	if err != nil {
		panic(err)
	}
	// 3 per request; 3 per message, plus 14 bytes (4 tokens) and 10 bytes (3 tokens).
	fmt.Println(n)
	// Output: 16
}
