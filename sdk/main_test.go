package sdk

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test runs beside the others (t.Parallel): each starts its own
// provider and its own egress client, and spends its time waiting on real
// time (about 10 s of CPU in 70 s, one after the other).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
