package egress

import (
	"bytes"
	"io"
	"math"
	"net/http"
	"testing"
	"time"
)

// The fuzz target of the readers, over whole responses. Its seed corpus,
// under testdata/fuzz, holds the providers' literal values
// (docs/dialects.md); the values' parsers are fuzzed in internal/field.

// FuzzReadSignal reads a response whose headers egress reads carry the
// values a, b or c (header i gets one of them when bit i%64 of mask is
// set), with one more header of any name, a body, and a reset unit set for
// X-Rate-Limit-Reset. The signal must hold its invariants, and the caller
// must get the body whole.
func FuzzReadSignal(f *testing.F) {
	f.Add(429, uint64(math.MaxUint64), "6m0s", "2025-08-21T12:40:59Z", "32/40", "zendesk-ratelimit-tickets-index",
		"total=100; remaining=99; resets=41", []byte(`{"retry_after": 64.57, "global": false}`), uint8(0), raNow().Unix(), int64(time.Minute))
	names := allSignalHeaders()
	f.Fuzz(func(t *testing.T, status int, mask uint64, a, b, c, extraName, extraValue string, body []byte, unit uint8, nowUnix, maxNanos int64) {
		values := [3]string{a, b, c}
		h := http.Header{"Content-Type": {"application/json"}}
		for i, name := range names {
			if mask&(1<<(i%64)) != 0 {
				h[name] = append(h[name], values[i%3])
			}
		}
		h.Add(extraName, extraValue)
		orig := &spyBody{r: bytes.NewReader(body)}
		resp := &http.Response{StatusCode: status, Header: h, Body: orig}
		cfg := &signalConfig{units: []resetOverride{{host: "fuzz.example", header: "X-Rate-Limit-Reset", unit: ResetUnit(unit % 7)}}}
		now := time.Unix(nowUnix, 0)
		s := cfg.readSignal(resp, "fuzz.example", now, now, fuzzMax(maxNanos))
		if s.MaxWait != fuzzMax(maxNanos) {
			t.Fatalf("MaxWait %v", s.MaxWait)
		}
		checkSignal(t, &s)
		if orig.read.Load() > BodyPeekLimit {
			t.Fatalf("read %d bytes of the body", orig.read.Load())
		}
		got, err := io.ReadAll(resp.Body)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("the body came back as %d bytes (%v); want %d", len(got), err, len(body))
		}
		if resp.Body.Close(); orig.closes.Load() != 1 {
			t.Fatalf("the original body was closed %d times", orig.closes.Load())
		}
	})
}
