package usage

import (
	"bytes"
	"encoding/base64"
	"testing"
)

// The fuzz targets of the readers of bodies; egress's tests (TestUsageScan,
// TestLLMCostInlineImages) check what they read from the providers' bodies.

// FuzzUsageScan: any body, in any two pieces, reads as it does whole, and
// nothing panics.
func FuzzUsageScan(f *testing.F) {
	for _, b := range []string{
		`{"id":"chatcmpl-abc","usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29}}`,
		"data: {\"usage\":null}\n\ndata: {\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":7}}\n\ndata: [DONE]\n\n",
		`{"usage":{"input_tokens":25,"cache_creation_input_tokens":5,"output_tokens":13}}`,
		`{"extensions":{"cost":{"requestedQueryCost":52,"actualQueryCost":12}}}`,
		`"actualQueryCost": 3`, `{"usage":{"prompt_tokens":1e99}}`, `"usage":{"a":"\"}"}`, `"usage"`,
	} {
		f.Add(b, uint16(len(b)/2))
	}
	f.Fuzz(func(t *testing.T, body string, split uint16) {
		at := int(split) % (len(body) + 1)
		var whole, parts Scan
		whole.Feed([]byte(body))
		parts.Feed([]byte(body[:at]))
		parts.Feed([]byte(body[at:]))
		w, wf := whole.Counts()
		p, pf := parts.Counts()
		if w != p || wf != pf {
			t.Fatalf("whole %+v %v, split at %d %+v %v", w, wf, at, p, pf)
		}
		if w.Input < 0 || w.Output < 0 || w.Total < 0 || w.Points < 0 {
			t.Fatalf("a negative count: %+v", w)
		}
	})
}

// FuzzEstimate: any body gives an estimate without a panic, never
// negative, and never above its size over 4 plus ImageTokens for each KiB
// of it.
func FuzzEstimate(f *testing.F) {
	img := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1, 2, 3}, 400))
	for _, b := range []string{
		`{"model":"gpt-4o","messages":[{"role":"user","content":"Say hello."}],"max_tokens":50}`,
		`{"messages":[{"content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,` + img + `"}}]}],"max_completion_tokens":9}`,
		`{"content":[{"type":"image","source":{"type":"base64","media_type":"image/gif","data":"` + img + `"}}],"max_tokens":-3}`,
		`{"source":{"media_type":"application/pdf","data":"` + img + `"}}`,
		`not json`, `{"max_tokens":1e99}`, ``,
	} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body string) {
		in, out := Estimate([]byte(body))
		limit := (len(body)+3)/4 + ImageTokens*(len(body)/MinInlineData)
		if in < 0 || out < 0 || in > limit {
			t.Fatalf("%d bytes: input %d, output %d (input at most %d)", len(body), in, out, limit)
		}
	})
}
