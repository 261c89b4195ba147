package dialect

import (
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
