package fakellm

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
)

// BenchmarkServeHTTP is the provider's own cost per completion, without
// the network, under limits it never reaches.
func BenchmarkServeHTTP(b *testing.B) {
	for _, bc := range []struct {
		name   string
		stream bool
	}{{"response", false}, {"stream of 8 chunks", true}} {
		b.Run(bc.name, func(b *testing.B) {
			s, err := New(Config{RPM: 1 << 40, TPM: 1 << 50, Chunks: 8})
			if err != nil {
				b.Fatal(err)
			}
			body := []byte(chatBody(prompt16, 100, bc.stream))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					w := httptest.NewRecorder()
					s.ServeHTTP(w, httptest.NewRequest(http.MethodPost, ChatCompletionsPath, bytes.NewReader(body)))
					if w.Code != http.StatusOK {
						b.Errorf("status %d: %s", w.Code, w.Body)
						return
					}
				}
			})
		})
	}
}
