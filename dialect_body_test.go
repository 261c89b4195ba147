package egress

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

func TestDialectBodyPrefix(t *testing.T) {
	big := `{"error": {"type": "insufficient_quota", "code": "insufficient_quota", "message": "` +
		strings.Repeat("x", 3*BodyPeekLimit) + `"}}`
	small := `{"error": {"type": "insufficient_quota", "code": "insufficient_quota"}}`
	for _, tt := range []struct {
		name, body string
		wantRead   int // bytes read from the original body by readSignal
		scope      Scope
	}{
		{"larger than the prefix", big, BodyPeekLimit, ScopeUnknown}, // the JSON is cut: not read, ignored
		{"smaller than the prefix", small, len(small), ScopeBilling},
		{"exactly the prefix", small + strings.Repeat(" ", BodyPeekLimit-len(small)), BodyPeekLimit, ScopeBilling},
	} {
		t.Run(tt.name, func(t *testing.T) {
			orig := &spyBody{r: strings.NewReader(tt.body)}
			resp := &http.Response{StatusCode: 429, Header: http.Header{"Content-Type": {"application/json"}}, Body: orig}
			s := readSignal(resp, raNow(), raNow(), time.Minute)
			if orig.read.Load() != int64(tt.wantRead) {
				t.Fatalf("readSignal read %d bytes of the body; want %d", orig.read.Load(), tt.wantRead)
			}
			if s.Scope != tt.scope {
				t.Fatalf("Scope = %v; want %v", s.Scope, tt.scope)
			}
			got, err := io.ReadAll(resp.Body)
			if err != nil || string(got) != tt.body {
				t.Fatalf("the caller read %d bytes (err %v); want the %d of the body, intact", len(got), err, len(tt.body))
			}
			if err := resp.Body.Close(); err != nil || orig.closes.Load() != 1 {
				t.Fatalf("Close = %v, original closed %d times; want once", err, orig.closes.Load())
			}
		})
	}
}

func TestDialectBodyPeek(t *testing.T) {
	t.Run("twice reads once", func(t *testing.T) {
		orig := &spyBody{r: strings.NewReader(strings.Repeat("a", 2*BodyPeekLimit))}
		resp := &http.Response{Body: orig}
		a := PeekBody(resp)
		b := PeekBody(resp)
		if len(a) != BodyPeekLimit || !bytes.Equal(a, b) || orig.read.Load() != BodyPeekLimit {
			t.Fatalf("peeks of %d and %d bytes, %d read", len(a), len(b), orig.read.Load())
		}
	})
	t.Run("read error comes back in its place", func(t *testing.T) {
		boom := errors.New("connection reset")
		resp := &http.Response{Body: io.NopCloser(io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(boom)))}
		if p := PeekBody(resp); string(p) != "abc" {
			t.Fatalf("PeekBody = %q", p)
		}
		got, err := io.ReadAll(resp.Body)
		if string(got) != "abc" || !errors.Is(err, boom) {
			t.Fatalf("ReadAll = %q, %v; want abc, %v", got, err, boom)
		}
	})
	t.Run("no body", func(t *testing.T) {
		for _, resp := range []*http.Response{nil, {}, {Body: http.NoBody}} {
			if p := PeekBody(resp); p != nil {
				t.Fatalf("PeekBody = %q", p)
			}
		}
	})
	t.Run("only a 429 that may be JSON is read", func(t *testing.T) {
		for _, tt := range []struct {
			status int
			ct     string
		}{{200, ""}, {500, "application/json"}, {429, "text/html"}, {403, ""}} {
			orig := &spyBody{r: strings.NewReader(`{"error": {"type": "insufficient_quota"}, "retry_after": 1}`)}
			h := http.Header{}
			if tt.ct != "" {
				h.Set("Content-Type", tt.ct)
			}
			readSignal(&http.Response{StatusCode: tt.status, Header: h, Body: orig}, raNow(), raNow(), time.Minute)
			if orig.read.Load() != 0 {
				t.Fatalf("status %d, %q: %d bytes read", tt.status, tt.ct, orig.read.Load())
			}
		}
	})
}
