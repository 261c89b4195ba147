package fakeapi_test

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/egress-go/egress/internal/fakeapi"
)

// A GitHub-like API: 2 requests per hour in a sliding window, refused with
// 403 and remaining 0 once spent.
func ExampleDialect() {
	api, err := fakeapi.Start(fakeapi.Config{
		Limits:  []fakeapi.Limit{fakeapi.Sliding(2, time.Hour)},
		Dialect: fakeapi.GitHub,
	})
	if err != nil {
		panic(err)
	}
	tr := &http.Transport{}
	defer api.Close()
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	for range 3 {
		resp, err := c.PostForm(api.URL()+"/v1/charges", url.Values{"amount": {"100"}})
		if err != nil {
			panic(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		h := resp.Header
		fmt.Println(resp.StatusCode, h.Get("X-RateLimit-Limit"), h.Get("X-RateLimit-Remaining"),
			h.Get("X-RateLimit-Used"), h.Get("X-RateLimit-Resource"))
	}
	st := api.Stats(time.Time{})
	fmt.Println("accepted", st.Accepted, "forbidden", st.Forbidden, "refused", st.Refused)
	// Output:
	// 200 2 1 1 core
	// 200 2 0 2 core
	// 403 2 0 2 core
	// accepted 2 forbidden 1 refused 1
}
