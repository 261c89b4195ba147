package field

import (
	"math"
	"strconv"
	"testing"
	"time"
)

// The tests of the value parsers, and their fuzz targets, whose seed
// corpora under testdata/fuzz hold the providers' literal values
// (docs/dialects.md). egress's tests read the same values through the
// dialect readers, and FuzzReadSignal whole responses.

// fixedNow is the fixed "now" of these tests: Tuesday, 2024-01-02 03:04:05 UTC.
func fixedNow() time.Time { return time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC) }

func TestRetryAfter(t *testing.T) {
	const max = time.Hour
	tests := []struct {
		name   string
		values []string
		max    time.Duration
		want   time.Duration
		wantOK bool
	}{
		// delta-seconds
		{"delta seconds", []string{"120"}, max, 120 * time.Second, true},
		{"zero", []string{"0"}, max, 0, true},
		{"leading zeros", []string{"007"}, max, 7 * time.Second, true},
		{"surrounding whitespace", []string{" \t120 \r\n"}, max, 120 * time.Second, true},
		{"decimal", []string{"1.5"}, max, 1500 * time.Millisecond, true},
		{"decimal without integer part", []string{".25"}, max, 250 * time.Millisecond, true},
		{"decimal without fraction", []string{"2."}, max, 2 * time.Second, true},
		{"fraction past nanoseconds is truncated", []string{"1.1234567899"}, max, 1123456789 * time.Nanosecond, true},
		// HTTP-dates, in the three formats of http.ParseTime
		{"IMF-fixdate", []string{"Tue, 02 Jan 2024 03:05:35 GMT"}, max, 90 * time.Second, true},
		{"RFC 850", []string{"Tuesday, 02-Jan-24 03:05:35 GMT"}, max, 90 * time.Second, true},
		{"asctime", []string{"Tue Jan  2 03:05:35 2024"}, max, 90 * time.Second, true},
		{"date with whitespace", []string{"  Tue, 02 Jan 2024 03:05:35 GMT\t"}, max, 90 * time.Second, true},
		{"date equal to now", []string{"Tue, 02 Jan 2024 03:04:05 GMT"}, max, 0, true},
		{"date in the past", []string{"Sun, 06 Nov 1994 08:49:37 GMT"}, max, 0, true},
		{"RFC 850 in the past", []string{"Sunday, 06-Nov-94 08:49:37 GMT"}, max, 0, true},
		{"date far in the future is capped", []string{"Fri, 31 Dec 9999 23:59:59 GMT"}, max, max, true},
		// the cap
		{"delta above the cap", []string{"7200"}, max, max, true},
		{"delta at the cap", []string{"3600"}, max, max, true},
		{"decimal just above the cap", []string{"3600.000000001"}, max, max, true},
		{"huge delta is capped", []string{"99999999999999999999"}, max, max, true},
		{"max int64 is capped", []string{"9223372036854775807"}, max, max, true},
		{"huge decimal is capped", []string{"99999999999999999999.5"}, max, max, true},
		{"cap near max duration", []string{"99999999999999999999"}, math.MaxInt64, math.MaxInt64, true},
		{"fraction near max duration", []string{"9223372036.9"}, math.MaxInt64, math.MaxInt64, true},
		{"zero cap", []string{"120"}, 0, 0, true},
		{"negative cap counts as zero", []string{"120"}, -time.Second, 0, true},
		// garbage
		{"no values", nil, max, 0, false},
		{"empty", []string{""}, max, 0, false},
		{"blank", []string{"   "}, max, 0, false},
		{"word", []string{"soon"}, max, 0, false},
		{"negative", []string{"-1"}, max, 0, false},
		{"negative zero", []string{"-0"}, max, 0, false},
		{"negative decimal", []string{"-1.5"}, max, 0, false},
		{"plus sign", []string{"+5"}, max, 0, false},
		{"exponent", []string{"1e3"}, max, 0, false},
		{"NaN", []string{"NaN"}, max, 0, false},
		{"Inf", []string{"Inf"}, max, 0, false},
		{"hex", []string{"0x10"}, max, 0, false},
		{"underscores", []string{"1_000"}, max, 0, false},
		{"unit suffix", []string{"120s"}, max, 0, false},
		{"two dots", []string{"1.2.3"}, max, 0, false},
		{"lone dot", []string{"."}, max, 0, false},
		{"non-ASCII digits", []string{"١٢٠"}, max, 0, false},
		{"date in another layout", []string{"2024-01-02T03:05:35Z"}, max, 0, false},
		{"broken date", []string{"Tue, 32 Jan 2024 03:05:35 GMT"}, max, 0, false},
		// several values: the largest usable one wins
		{"several values", []string{"5", "60", "30"}, max, 60 * time.Second, true},
		{"garbage beside a usable value", []string{"soon", "-3", "5"}, max, 5 * time.Second, true},
		{"only garbage", []string{"soon", "-3"}, max, 0, false},
		{"date against delta", []string{"Tue, 02 Jan 2024 03:05:35 GMT", "30"}, max, 90 * time.Second, true},
		{"past date against delta", []string{"Sun, 06 Nov 1994 08:49:37 GMT", "30"}, max, 30 * time.Second, true},
		{"several values, capped", []string{"5", "99999999999999999999"}, max, max, true},
		// a comma-joined list in one value
		{"comma list", []string{"5, 60"}, max, 60 * time.Second, true},
		{"comma list with garbage", []string{"soon, 7"}, max, 7 * time.Second, true},
		{"comma list, date first", []string{"Tue, 02 Jan 2024 03:05:35 GMT, 10"}, max, 90 * time.Second, true},
		{"comma list, date last", []string{"10, Tue, 02 Jan 2024 03:05:35 GMT"}, max, 90 * time.Second, true},
		{"comma list of garbage", []string{"a, b,,"}, max, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := RetryAfter(tt.values, fixedNow(), tt.max)
			if got != tt.want || ok != tt.wantOK {
				t.Fatalf("RetryAfter(%q, max %v) = %v, %v; want %v, %v", tt.values, tt.max, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

// fuzzMax turns a fuzzed number into a cap > 0.
func fuzzMax(n int64) time.Duration {
	if d := time.Duration(n & math.MaxInt64); d > 0 {
		return d
	}
	return time.Hour
}

func FuzzParseRetryAfter(f *testing.F) {
	now := fixedNow().Unix()
	for _, seed := range []struct {
		a, b string
		max  int64
	}{
		{"120", "", int64(time.Hour)},
		{"1.5", "", int64(time.Hour)},
		{"Tue, 02 Jan 2024 03:05:35 GMT", "", int64(time.Hour)},
		{"Tuesday, 02-Jan-24 03:05:35 GMT", "30", int64(time.Hour)},
		{"Tue Jan  2 03:05:35 2024", "", int64(time.Minute)},
		{"Sun, 06 Nov 1994 08:49:37 GMT", "", int64(time.Hour)},
		{"99999999999999999999", "", math.MaxInt64},
		{"-1", "NaN", int64(time.Hour)},
		{"5, Tue, 02 Jan 2024 03:05:35 GMT", " 7 ", int64(time.Second)},
	} {
		f.Add(seed.a, seed.b, now, seed.max)
	}
	f.Fuzz(func(t *testing.T, a, b string, nowUnix, maxNanos int64) {
		max := fuzzMax(maxNanos)
		wait, ok := RetryAfter([]string{a, b}, time.Unix(nowUnix, 0), max)
		if wait < 0 || wait > max {
			t.Fatalf("RetryAfter(%q, %q) = %v, outside [0, %v]", a, b, wait, max)
		}
		if !ok && wait != 0 {
			t.Fatalf("RetryAfter(%q, %q) = %v, false; want 0 when not ok", a, b, wait)
		}
	})
}

// FuzzParseReset reads one reset value in each unit.
func FuzzParseReset(f *testing.F) {
	f.Add("6m0s", uint8(UnitAuto), fixedNow().Unix(), int64(time.Hour))
	f.Fuzz(func(t *testing.T, v string, unit uint8, nowUnix, maxNanos int64) {
		max := fuzzMax(maxNanos)
		for _, u := range []Unit{Unit(unit), UnitAuto, Unit(unit % 7)} {
			d, ok := Reset(v, u, time.Unix(nowUnix, 0), max)
			if d < 0 || d > max || (!ok && d != 0) {
				t.Fatalf("Reset(%q, %v) = %v, %v; outside [0, %v]", v, u, d, ok, max)
			}
		}
		d, ok := LatestReset([]string{v, v + "," + v}, Unit(unit%7), time.Unix(nowUnix, 0), max)
		if d < 0 || d > max || (!ok && d != 0) {
			t.Fatalf("LatestReset(%q) = %v, %v; outside [0, %v]", v, d, ok, max)
		}
	})
}

// FuzzParseAmount reads counts and "used/capacity" pairs.
func FuzzParseAmount(f *testing.F) {
	f.Add("999.0")
	f.Fuzz(func(t *testing.T, v string) {
		if n, ok := Amount(v); ok {
			if n < 0 || math.IsNaN(n) || math.IsInf(n, 0) {
				t.Fatalf("Amount(%q) = %v", v, n)
			}
			if _, err := strconv.ParseFloat(v, 64); err != nil && digitsOnly(v) && v != "" {
				t.Fatalf("Amount(%q) read what strconv refuses: %v", v, err)
			}
		}
		if used, capacity, ok := Pair(v); ok {
			if used < 0 || capacity < 0 || math.IsInf(used+capacity, 0) {
				t.Fatalf("Pair(%q) = %v/%v", v, used, capacity)
			}
		}
		lo, okLo := Lowest([]string{v})
		hi, okHi := Highest([]string{v})
		if okLo != okHi || lo > hi {
			t.Fatalf("lowest %v (%v) above highest %v (%v) of %q", lo, okLo, hi, okHi, v)
		}
	})
}
