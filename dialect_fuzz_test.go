package egress

import (
	"bytes"
	"io"
	"math"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// The fuzz targets of the readers. Their seed corpora, under
// testdata/fuzz, hold the providers' literal values (docs/dialects.md).

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
		cfg := &signalConfig{units: []resetOverride{{host: "fuzz.example", header: hXRateLimitHyphenReset, unit: ResetUnit(unit % 7)}}}
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

// FuzzParseReset reads one reset value in each unit.
func FuzzParseReset(f *testing.F) {
	f.Add("6m0s", uint8(ResetAuto), raNow().Unix(), int64(time.Hour))
	f.Fuzz(func(t *testing.T, v string, unit uint8, nowUnix, maxNanos int64) {
		max := fuzzMax(maxNanos)
		for _, u := range []ResetUnit{ResetUnit(unit), ResetAuto, ResetUnit(unit % 7)} {
			d, ok := parseReset(v, u, time.Unix(nowUnix, 0), max)
			if d < 0 || d > max || (!ok && d != 0) {
				t.Fatalf("parseReset(%q, %v) = %v, %v; outside [0, %v]", v, u, d, ok, max)
			}
		}
		d, ok := latestReset([]string{v, v + "," + v}, ResetUnit(unit%7), time.Unix(nowUnix, 0), max)
		if d < 0 || d > max || (!ok && d != 0) {
			t.Fatalf("latestReset(%q) = %v, %v; outside [0, %v]", v, d, ok, max)
		}
	})
}

// FuzzParseAmount reads counts and "used/capacity" pairs.
func FuzzParseAmount(f *testing.F) {
	f.Add("999.0")
	f.Fuzz(func(t *testing.T, v string) {
		if n, ok := parseAmount(v); ok {
			if n < 0 || math.IsNaN(n) || math.IsInf(n, 0) {
				t.Fatalf("parseAmount(%q) = %v", v, n)
			}
			if _, err := strconv.ParseFloat(v, 64); err != nil && digitsOnly(v) && v != "" {
				t.Fatalf("parseAmount(%q) read what strconv refuses: %v", v, err)
			}
		}
		if used, capacity, ok := parsePair(v); ok {
			q := pairQuota(used, capacity)
			if q.Remaining < 0 || q.Remaining > capacity {
				t.Fatalf("parsePair(%q): remaining %v of %v", v, q.Remaining, capacity)
			}
		}
		lo, okLo := lowestAmount([]string{v})
		hi, okHi := highestAmount([]string{v})
		if okLo != okHi || lo > hi {
			t.Fatalf("lowest %v (%v) above highest %v (%v) of %q", lo, okLo, hi, okHi, v)
		}
	})
}
