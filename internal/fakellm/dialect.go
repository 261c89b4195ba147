package fakellm

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// dialect is how one endpoint speaks: its headers, bodies and events.
type dialect interface {
	// maxTokens is the request's max_tokens, def when the dialect has a
	// default, or nil when it is missing and required.
	maxTokens(w *wireRequest, def int) *int
	// writeLimits writes the limits' headers, read at now.
	writeLimits(h http.Header, now time.Time, rs []reading)
	// writeRetry writes a 429's retry headers.
	writeRetry(h http.Header, wait time.Duration)
	invalidBody(bad *invalid) []byte
	refusalBody(r refusal) []byte
	completionBody(c completion) []byte
	// The events of a stream, each framed and ending in a blank line:
	// before the content, one content chunk, and after the content.
	streamStart(c completion) []string
	streamDelta(c completion, text string) []string
	streamEnd(c completion) []string
}

// dialectFor is the dialect of the endpoint at path.
func dialectFor(path string) (dialect, bool) {
	switch path {
	case ChatCompletionsPath:
		return openAI{}, true
	case MessagesPath:
		return anthropic{}, true
	}
	return nil, false
}

// refusal is what a 429 body says.
type refusal struct {
	model     string
	reading   reading // of the limit named
	requested int     // the request's up-front charge to that limit
	wait      time.Duration
	tooLarge  bool
}

// used is the limit's quota in use, as the headers imply it.
func (r refusal) used() int { return r.reading.quota - r.reading.remaining }

// completion is what the bodies and events say of an admitted request.
type completion struct {
	id           int
	model        string
	created      time.Time
	input        int
	output       int
	maxTokens    int
	includeUsage bool // OpenAI streams: send the usage chunk
}

// truncated reports whether the output stopped at max_tokens.
func (c completion) truncated() bool { return c.output >= c.maxTokens }

// organization is the organization the error messages name.
const organization = "org-fakellm"

// mustJSON marshals v, which is one of this package's body types and
// cannot fail.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("fakellm: " + err.Error())
	}
	return b
}

// goDuration is d as a Go duration rounded up to the millisecond, as
// OpenAI writes its resets: "6m0s", "1.5s", "12ms", "0s".
func goDuration(d time.Duration) string {
	return (time.Duration(ceilMillis(d)) * time.Millisecond).String()
}

// rfc3339 is now+d in RFC 3339, UTC, rounded up to the second.
func rfc3339(now time.Time, d time.Duration) string {
	t := now.Add(d).UTC()
	if t2 := t.Truncate(time.Second); !t2.Equal(t) {
		t = t2.Add(time.Second)
	}
	return t.Format(time.RFC3339)
}

func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// retrySeconds is a retry-after in whole seconds, rounded up, at least 1.
func retrySeconds(d time.Duration) string {
	return strconv.FormatInt(max(1, int64((d+time.Second-1)/time.Second)), 10)
}

// thousands writes n with commas: 40000 is "40,000".
func thousands(n int) string {
	s := strconv.Itoa(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
