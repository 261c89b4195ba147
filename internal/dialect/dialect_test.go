package dialect

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestSignalNameIsContains: signalName is strings.Contains of "imit" or
// "Retry", at either end of a name and in names shorter than either.
func TestSignalNameIsContains(t *testing.T) {
	names := append(Headers(), "", "R", "Retr", "Retry", "Retry-After", "X-Should-Retry", "imi", "imit", "Limit", "X-Retry", "Xretry",
		"Content-Type", "Date", "Server", "Strict-Transport-Security", "Imit", "X-Li-Mit", "RetrY", "Rate-Limit")
	for _, n := range names {
		want := strings.Contains(n, "imit") || strings.Contains(n, "Retry")
		assert.Equal(t, want, signalName(n), "%q", n)
	}
}

// TestSignalNameSkips: signalName is strings.Contains on names drawn from
// the needles' letters, where a skip too long would miss a match.
func TestSignalNameSkips(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const letters = "imtReyrx-"
	for range 20000 {
		b := make([]byte, r.IntN(14))
		for i := range b {
			b[i] = letters[r.IntN(len(letters))]
		}
		n := string(b)
		want := strings.Contains(n, "imit") || strings.Contains(n, "Retry")
		if signalName(n) != want {
			t.Fatalf("%q: %v, want %v", n, !want, want)
		}
	}
}

func BenchmarkSignalName(b *testing.B) {
	names := []string{"Content-Type", "Date", "Server", "X-Request-Id", "Cache-Control", "Content-Length", "Strict-Transport-Security", "Vary"}
	for b.Loop() {
		for _, n := range names {
			if signalName(n) {
				b.Fatal(n)
			}
		}
	}
}
