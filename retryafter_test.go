package egress

import (
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/egress-go/egress/internal/field"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// raNow is the fixed "now" of the readers' tests: Tuesday, 2024-01-02
// 03:04:05 UTC.
func raNow() time.Time { return time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC) }

// fuzzMax turns a fuzzed number into a cap > 0.
func fuzzMax(n int64) time.Duration {
	if d := time.Duration(n & math.MaxInt64); d > 0 {
		return d
	}
	return time.Hour
}

// TestResetUnitsAreFields: each ResetUnit is the internal/field unit of
// the same number, which the readers convert it to.
func TestResetUnitsAreFields(t *testing.T) {
	units := map[ResetUnit]field.Unit{
		ResetAuto: field.UnitAuto, ResetDeltaSeconds: field.UnitDeltaSeconds, ResetDeltaMillis: field.UnitDeltaMillis,
		ResetEpochSeconds: field.UnitEpochSeconds, ResetEpochMillis: field.UnitEpochMillis,
		ResetDuration: field.UnitDuration, ResetTimestamp: field.UnitTimestamp,
	}
	require.Len(t, units, len(resetUnitNames))
	for u, f := range units {
		assert.Equal(t, f, field.Unit(u), "%v", u)
	}
}

// TestRetryAfterReadsDatesAsNetHTTP: internal/field reads an HTTP-date as
// net/http's ParseTime does, which it does not import (see its doc).
func TestRetryAfterReadsDatesAsNetHTTP(t *testing.T) {
	now := raNow()
	for _, v := range []string{
		"Tue, 02 Jan 2024 03:05:35 GMT", "Tuesday, 02-Jan-24 03:05:35 GMT", "Tue Jan  2 03:05:35 2024",
		"Sun, 06 Nov 1994 08:49:37 GMT", "Tue, 02 Jan 2024 03:05:35 UTC", "Tue, 2 Jan 2024 03:05:35 GMT",
		"2024-01-02T03:05:35Z", "Tue, 32 Jan 2024 03:05:35 GMT", "", "garbage",
	} {
		got, ok := field.RetryAfter([]string{v}, now, time.Hour)
		ts, err := http.ParseTime(v)
		assert.Equal(t, err == nil, ok, "%q", v)
		if err == nil {
			assert.Equal(t, min(max(ts.Sub(now), 0), time.Hour), got, "%q", v)
		}
	}
}
