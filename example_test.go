package egress_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/egress-go/egress"
)

// Wrap the transport of an http.Client: every request it sends passes the
// limiter, keyed by host.
func ExampleNew() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `{"id":"ch_1"}`)
	}))
	defer api.Close()

	limiter, err := egress.NewTokenBucket(egress.PerSecond(30), 10)
	if err != nil {
		fmt.Println(err)
		return
	}
	tr, err := egress.New(http.DefaultTransport, egress.WithLimiter(limiter))
	if err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: tr}
	defer client.CloseIdleConnections()

	resp, err := client.Get(api.URL + "/v1/charges/ch_1")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	fmt.Println(resp.Status)
	// Output: 200 OK
}

// A token bucket lets a burst through at once, then holds requests to the
// rate. Here the burst is 2 and a request may wait at most 100 ms: the third
// request in a row would need about a second, so it is refused at once.
func ExampleNewTokenBucket() {
	api := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer api.Close()

	limiter, err := egress.NewTokenBucket(egress.PerSecond(1), 2)
	if err != nil {
		fmt.Println(err)
		return
	}
	tr, err := egress.New(nil, egress.WithLimiter(limiter), egress.WithMaxWait(100*time.Millisecond))
	if err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: tr}
	defer client.CloseIdleConnections()

	for i := 1; i <= 3; i++ {
		resp, err := client.Get(api.URL)
		if err != nil {
			fmt.Printf("request %d: rate limited: %v\n", i, errors.Is(err, egress.ErrRateLimited))
			continue
		}
		resp.Body.Close()
		fmt.Printf("request %d: %s\n", i, resp.Status)
	}
	// Output:
	// request 1: 200 OK
	// request 2: 200 OK
	// request 3: rate limited: true
}

// A leaky bucket releases requests one by one, 1/rate apart, in order of
// arrival: three requests in a row at 10 per second take at least 200 ms.
// With no queue (depth 0) a request that cannot go at once is refused.
func ExampleNewLeakyBucket() {
	api := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer api.Close()

	limiter, err := egress.NewLeakyBucket(egress.PerSecond(10), 5)
	if err != nil {
		fmt.Println(err)
		return
	}
	tr, err := egress.New(nil, egress.WithLimiter(limiter))
	if err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: tr}
	defer client.CloseIdleConnections()

	start := time.Now()
	for range 3 {
		resp, err := client.Get(api.URL)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
	}
	fmt.Println("spaced 100 ms apart:", time.Since(start) >= 200*time.Millisecond)

	noQueue, err := egress.NewLeakyBucket(egress.PerSecond(10), 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	_, err = noQueue.Wait(ctx, "payments", 1, 0) // goes at once
	fmt.Println("first:", err)
	_, err = noQueue.Wait(ctx, "payments", 1, 0) // would have to queue
	fmt.Println("second, queue full:", errors.Is(err, egress.ErrQueueFull))
	// Output:
	// spaced 100 ms apart: true
	// first: <nil>
	// second, queue full: true
}

// A request whose wait would outlast its context's deadline is refused at
// once, before it is sent, with a *LimitError that says why and how long it
// would have waited.
func ExampleLimitError() {
	limiter, err := egress.NewTokenBucket(egress.PerSecond(1), 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	tr, err := egress.New(nil, egress.WithLimiter(limiter))
	if err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: tr}

	// Someone else just used the key's only token.
	if _, err := limiter.Wait(context.Background(), "api.example.com", 1, 0); err != nil {
		fmt.Println(err)
		return
	}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://api.example.com/v1/charges", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = client.Do(req) // never leaves the process

	fmt.Println("rate limited:", errors.Is(err, egress.ErrRateLimited))
	var le *egress.LimitError
	if errors.As(err, &le) {
		fmt.Println("key:", le.Key)
		fmt.Println("reason:", le.Reason)
		fmt.Println("would wait about:", le.Wait.Round(time.Second))
	}
	// Output:
	// rate limited: true
	// key: api.example.com
	// reason: deadline
	// would wait about: 1s
}

// Rates are written the way provider docs write them.
func ExamplePerSecond() {
	for _, r := range []egress.Rate{
		egress.PerSecond(30),
		egress.PerSecond(0.5),
		egress.PerMinute(100),
		egress.Per(1000, time.Hour),
		egress.Per(5, 10*time.Second),
		egress.Every(250 * time.Millisecond),
	} {
		fmt.Printf("%-8s = %8.4f/s, one every %v\n", r, r.PerSecond(), r.Interval())
	}
	// Output:
	// 30/s     =  30.0000/s, one every 33.333334ms
	// 0.5/s    =   0.5000/s, one every 2s
	// 100/min  =   1.6667/s, one every 600ms
	// 1000/h   =   0.2778/s, one every 3.6s
	// 5/10s    =   0.5000/s, one every 2s
	// 1/250ms  =   4.0000/s, one every 250ms
}

// Requests and tokens per minute, kept together: a request goes only when
// both limits have room. Its tokens are estimated from its body (LLMCost:
// about 620 here, most of it max_tokens) and settled from the usage its
// response reports (50): without the settlement, the second request's
// estimate would not fit beside the first's within the minute.
func ExampleNewLimits() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `{"object":"chat.completion","usage":{"prompt_tokens":20,"completion_tokens":30,"total_tokens":50}}`)
	}))
	defer api.Close()

	limits, err := egress.NewLimits(
		egress.WindowOf(egress.Requests, 500, time.Minute),
		egress.WindowOf(egress.Tokens, 1000, time.Minute),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	tr, err := egress.New(http.DefaultTransport,
		egress.WithLimiter(limits),
		egress.WithCosts(egress.LLMCost),
		egress.WithMaxWait(time.Second),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: tr}
	defer client.CloseIdleConnections()

	body := `{"model":"m","messages":[{"role":"user","content":"Hello"}],"max_tokens":600}`
	for i := range 3 {
		resp, err := client.Post(api.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			fmt.Println(i, errors.Is(err, egress.ErrRateLimited))
			continue
		}
		io.Copy(io.Discard, resp.Body) // at the body's end, its 50 tokens replace the estimate
		resp.Body.Close()
		fmt.Println(i, resp.Status)
	}
	// Output:
	// 0 200 OK
	// 1 200 OK
	// 2 200 OK
}

// Order the requests that wait for a key: a user's call goes before a
// backfill's, and each account gets its fair share. The class comes from
// the request's context, or from Classify for calls made through an SDK.
func ExampleWithPriorities() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `{"ok":true}`)
	}))
	defer api.Close()

	limiter, err := egress.NewTokenBucket(egress.PerSecond(50), 5)
	if err != nil {
		panic(err)
	}
	tr, err := egress.New(api.Client().Transport,
		egress.WithLimiter(limiter),
		egress.WithPriorities(egress.Priorities{
			// Calls whose context says nothing: a backfill, by account.
			Classify: func(req *http.Request) egress.Class {
				return egress.Class{Priority: egress.PriorityLow, Tenant: req.Header.Get("X-Account")}
			},
		}),
	)
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: tr}

	ctx := egress.WithClass(context.Background(), egress.Class{Priority: egress.PriorityHigh, Tenant: "acme"})
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, api.URL+"/v1/orders", nil)
	resp, err := client.Do(req)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	c, _ := egress.ClassOf(ctx)
	fmt.Println(resp.StatusCode, c)
	// Output: 200 priority high, tenant "acme"
}
