package egress

import (
	"math"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// raNow is the fixed "now" of these tests: Tuesday, 2024-01-02 03:04:05 UTC.
func raNow() time.Time { return time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC) }

func TestParseRetryAfter(t *testing.T) {
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
			got, ok := parseRetryAfter(tt.values, raNow(), tt.max)
			if got != tt.want || ok != tt.wantOK {
				t.Fatalf("parseRetryAfter(%q, max %v) = %v, %v; want %v, %v", tt.values, tt.max, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestParseRateLimit(t *testing.T) {
	const max = 2 * time.Hour
	now := raNow()
	epoch := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).Unix(), 10) }
	epochMs := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).UnixMilli(), 10) }
	type hdr struct{ name, value string }
	tests := []struct {
		name    string
		headers []hdr
		max     time.Duration
		want    rateLimitHint
	}{
		{"no headers", nil, max, rateLimitHint{}},
		{"unrelated headers", []hdr{{"Content-Type", "text/plain"}}, max, rateLimitHint{}},

		// X-RateLimit-*
		{"X- headers", []hdr{{"X-RateLimit-Limit", "50"}, {"X-RateLimit-Remaining", "3"}, {"X-RateLimit-Reset", "30"}}, max,
			rateLimitHint{Remaining: 3, HasRemaining: true, Reset: 30 * time.Second, HasReset: true, Limit: 50, HasLimit: true}},
		{"X- headers in lower case", []hdr{{"x-ratelimit-remaining", "4"}}, max,
			rateLimitHint{Remaining: 4, HasRemaining: true}},
		{"remaining zero", []hdr{{"X-RateLimit-Remaining", "0"}}, max, rateLimitHint{HasRemaining: true}},
		{"remaining with whitespace", []hdr{{"X-RateLimit-Remaining", " 7 "}}, max, rateLimitHint{Remaining: 7, HasRemaining: true}},
		{"remaining negative is ignored", []hdr{{"X-RateLimit-Remaining", "-1"}}, max, rateLimitHint{}},
		{"remaining overflow is ignored", []hdr{{"X-RateLimit-Remaining", "9223372036854775808"}}, max, rateLimitHint{}},
		{"remaining max int64", []hdr{{"X-RateLimit-Remaining", "9223372036854775807"}}, max, rateLimitHint{Remaining: math.MaxInt64, HasRemaining: true}},
		{"remaining fractional is ignored", []hdr{{"X-RateLimit-Remaining", "1.5"}}, max, rateLimitHint{}},
		{"remaining garbage is ignored", []hdr{{"X-RateLimit-Remaining", "lots"}}, max, rateLimitHint{}},
		{"remaining, several values: lowest", []hdr{{"X-RateLimit-Remaining", "5"}, {"X-RateLimit-Remaining", "2"}}, max, rateLimitHint{Remaining: 2, HasRemaining: true}},
		{"remaining, comma list: lowest", []hdr{{"X-RateLimit-Remaining", "5, 3, -1"}}, max, rateLimitHint{Remaining: 3, HasRemaining: true}},

		// the epoch-or-delay rule of Reset
		{"reset delta", []hdr{{"X-RateLimit-Reset", "30"}}, max, rateLimitHint{Reset: 30 * time.Second, HasReset: true}},
		{"reset delta decimal", []hdr{{"X-RateLimit-Reset", "2.5"}}, max, rateLimitHint{Reset: 2500 * time.Millisecond, HasReset: true}},
		{"reset zero", []hdr{{"X-RateLimit-Reset", "0"}}, max, rateLimitHint{HasReset: true}},
		{"reset delta above the cap", []hdr{{"X-RateLimit-Reset", "86400"}}, max, rateLimitHint{Reset: max, HasReset: true}},
		{"reset largest delta (1e9-1) is capped", []hdr{{"X-RateLimit-Reset", "999999999"}}, max, rateLimitHint{Reset: max, HasReset: true}},
		{"reset epoch seconds", []hdr{{"X-RateLimit-Reset", epoch(45 * time.Second)}}, max, rateLimitHint{Reset: 45 * time.Second, HasReset: true}},
		{"reset epoch seconds with fraction", []hdr{{"X-RateLimit-Reset", epoch(45*time.Second) + ".5"}}, max, rateLimitHint{Reset: 45500 * time.Millisecond, HasReset: true}},
		{"reset epoch seconds in the past", []hdr{{"X-RateLimit-Reset", epoch(-time.Minute)}}, max, rateLimitHint{HasReset: true}},
		{"reset epoch seconds beyond the cap", []hdr{{"X-RateLimit-Reset", epoch(3 * time.Hour)}}, max, rateLimitHint{Reset: max, HasReset: true}},
		{"reset 1e9 is epoch seconds (2001, past)", []hdr{{"X-RateLimit-Reset", "1000000000"}}, max, rateLimitHint{HasReset: true}},
		{"reset 1e12-1 is epoch seconds (far future)", []hdr{{"X-RateLimit-Reset", "999999999999"}}, max, rateLimitHint{Reset: max, HasReset: true}},
		{"reset epoch milliseconds", []hdr{{"X-RateLimit-Reset", epochMs(1500 * time.Millisecond)}}, max, rateLimitHint{Reset: 1500 * time.Millisecond, HasReset: true}},
		{"reset epoch milliseconds in the past", []hdr{{"X-RateLimit-Reset", epochMs(-time.Second)}}, max, rateLimitHint{HasReset: true}},
		{"reset 1e12 is epoch milliseconds (2001, past)", []hdr{{"X-RateLimit-Reset", "1000000000000"}}, max, rateLimitHint{HasReset: true}},
		{"reset huge epoch milliseconds is capped", []hdr{{"X-RateLimit-Reset", "18446744073709551615"}}, max, rateLimitHint{Reset: max, HasReset: true}},
		{"reset overflow is ignored", []hdr{{"X-RateLimit-Reset", "99999999999999999999"}}, max, rateLimitHint{}},
		{"reset negative is ignored", []hdr{{"X-RateLimit-Reset", "-5"}}, max, rateLimitHint{}},
		{"reset garbage is ignored", []hdr{{"X-RateLimit-Reset", "Tue, 02 Jan 2024 03:05:35 GMT"}}, max, rateLimitHint{}},
		{"reset, several values: latest", []hdr{{"X-RateLimit-Reset", "5"}, {"X-RateLimit-Reset", "50"}}, max, rateLimitHint{Reset: 50 * time.Second, HasReset: true}},
		{"reset-after", []hdr{{"X-RateLimit-Reset-After", "12.5"}}, max, rateLimitHint{Reset: 12500 * time.Millisecond, HasReset: true}},
		{"reset-after is never an epoch", []hdr{{"X-RateLimit-Reset-After", "1000000000"}}, max, rateLimitHint{Reset: max, HasReset: true}},
		{"reset-after before reset", []hdr{{"X-RateLimit-Reset-After", "3"}, {"X-RateLimit-Reset", "60"}}, max, rateLimitHint{Reset: 3 * time.Second, HasReset: true}},
		{"garbage reset-after falls back to reset", []hdr{{"X-RateLimit-Reset-After", "x"}, {"X-RateLimit-Reset", "60"}}, max, rateLimitHint{Reset: time.Minute, HasReset: true}},
		{"zero cap", []hdr{{"X-RateLimit-Reset", "60"}}, 0, rateLimitHint{HasReset: true}},

		// X-RateLimit-Limit, with and without a window
		{"limit without window", []hdr{{"X-RateLimit-Limit", "50"}}, max, rateLimitHint{Limit: 50, HasLimit: true}},
		{"limit with window list", []hdr{{"X-RateLimit-Limit", "50, 50;w=1"}}, max, rateLimitHint{Limit: 50, HasLimit: true, Window: time.Second, HasWindow: true}},
		{"limit with window", []hdr{{"X-RateLimit-Limit", "50;w=60"}}, max, rateLimitHint{Limit: 50, HasLimit: true, Window: time.Minute, HasWindow: true}},
		{"limit with decimal window", []hdr{{"X-RateLimit-Limit", "5;w=0.5"}}, max, rateLimitHint{Limit: 5, HasLimit: true, Window: 500 * time.Millisecond, HasWindow: true}},
		{"limit, lowest rate wins", []hdr{{"X-RateLimit-Limit", "10, 10;w=1, 50;w=60"}}, max, rateLimitHint{Limit: 50, HasLimit: true, Window: time.Minute, HasWindow: true}},
		{"limit, lowest bare value", []hdr{{"X-RateLimit-Limit", "100, 5"}}, max, rateLimitHint{Limit: 5, HasLimit: true}},
		{"limit, zero window is no window", []hdr{{"X-RateLimit-Limit", "50;w=0"}}, max, rateLimitHint{Limit: 50, HasLimit: true}},
		{"limit, overflowing window is no window", []hdr{{"X-RateLimit-Limit", "50;w=99999999999"}}, max, rateLimitHint{Limit: 50, HasLimit: true}},
		{"limit, negative window is no window", []hdr{{"X-RateLimit-Limit", "50;w=-1"}}, max, rateLimitHint{Limit: 50, HasLimit: true}},
		{"limit negative is ignored", []hdr{{"X-RateLimit-Limit", "-5"}}, max, rateLimitHint{}},
		{"limit overflow is ignored", []hdr{{"X-RateLimit-Limit", "99999999999999999999;w=1"}}, max, rateLimitHint{}},
		{"limit garbage is ignored", []hdr{{"X-RateLimit-Limit", "many"}}, max, rateLimitHint{}},

		// the older IETF draft
		{"older draft", []hdr{{"RateLimit-Limit", "100"}, {"RateLimit-Remaining", "0"}, {"RateLimit-Reset", "30"}}, max,
			rateLimitHint{HasRemaining: true, Reset: 30 * time.Second, HasReset: true, Limit: 100, HasLimit: true}},
		{"older draft with windows", []hdr{{"RateLimit-Limit", "10, 10;w=1, 1000;w=3600"}}, max,
			rateLimitHint{Limit: 1000, HasLimit: true, Window: time.Hour, HasWindow: true}},
		{"older draft reset as epoch", []hdr{{"RateLimit-Reset", epoch(20 * time.Second)}}, max, rateLimitHint{Reset: 20 * time.Second, HasReset: true}},

		// the structured RateLimit field
		{"structured", []hdr{{"RateLimit", `"default";r=0;t=30`}}, max, rateLimitHint{HasRemaining: true, Reset: 30 * time.Second, HasReset: true}},
		{"structured, token name", []hdr{{"RateLimit", `default;r=5;t=10`}}, max, rateLimitHint{Remaining: 5, HasRemaining: true, Reset: 10 * time.Second, HasReset: true}},
		{"structured, params in any order", []hdr{{"RateLimit", `"default";t=30;r=2`}}, max, rateLimitHint{Remaining: 2, HasRemaining: true, Reset: 30 * time.Second, HasReset: true}},
		{"structured, whitespace", []hdr{{"RateLimit", ` "default" ; r = 3 ; t = 4 `}}, max, rateLimitHint{Remaining: 3, HasRemaining: true, Reset: 4 * time.Second, HasReset: true}},
		{"structured, unknown params", []hdr{{"RateLimit", `"default";pk=:YWJj=:;r=1;foo="a;b,c";t=2;flag`}}, max, rateLimitHint{Remaining: 1, HasRemaining: true, Reset: 2 * time.Second, HasReset: true}},
		{"structured, upper-case params", []hdr{{"RateLimit", `"default";R=1;T=2`}}, max, rateLimitHint{Remaining: 1, HasRemaining: true, Reset: 2 * time.Second, HasReset: true}},
		{"structured, quoted name with delimiters", []hdr{{"RateLimit", `"a,b;r=0";r=7;t=8`}}, max, rateLimitHint{Remaining: 7, HasRemaining: true, Reset: 8 * time.Second, HasReset: true}},
		{"structured, escaped quote in name", []hdr{{"RateLimit", `"a\",r=0;t=1";r=7;t=8`}}, max, rateLimitHint{Remaining: 7, HasRemaining: true, Reset: 8 * time.Second, HasReset: true}},
		{"structured, lowest remaining wins with its reset", []hdr{{"RateLimit", `"burst";r=5;t=1, "daily";r=0;t=3600`}}, max, rateLimitHint{HasRemaining: true, Reset: time.Hour, HasReset: true}},
		{"structured, lowest remaining wins across lines", []hdr{{"RateLimit", `"daily";r=9;t=3600`}, {"RateLimit", `"burst";r=2;t=1`}}, max, rateLimitHint{Remaining: 2, HasRemaining: true, Reset: time.Second, HasReset: true}},
		{"structured, tie on remaining: later reset", []hdr{{"RateLimit", `"a";r=0;t=5, "b";r=0;t=50, "c";r=0`}}, max, rateLimitHint{HasRemaining: true, Reset: 50 * time.Second, HasReset: true}},
		{"structured, reset capped", []hdr{{"RateLimit", `"default";r=0;t=100000`}}, max, rateLimitHint{HasRemaining: true, Reset: max, HasReset: true}},
		{"structured, negative remaining ignored", []hdr{{"RateLimit", `"default";r=-1;t=5`}}, max, rateLimitHint{Reset: 5 * time.Second, HasReset: true}},
		{"structured, overflowing remaining ignored", []hdr{{"RateLimit", `"default";r=99999999999999999999;t=5`}}, max, rateLimitHint{Reset: 5 * time.Second, HasReset: true}},
		{"structured, negative reset ignored", []hdr{{"RateLimit", `"default";r=4;t=-5`}}, max, rateLimitHint{Remaining: 4, HasRemaining: true}},
		{"structured, unterminated string", []hdr{{"RateLimit", `"default;r=1;t=2`}}, max, rateLimitHint{}},
		{"structured, empty members", []hdr{{"RateLimit", ` , ,"d";r=1, `}}, max, rateLimitHint{Remaining: 1, HasRemaining: true}},
		{"structured, dictionary form", []hdr{{"RateLimit", `limit=10, remaining=1, reset=7`}}, max,
			rateLimitHint{Remaining: 1, HasRemaining: true, Reset: 7 * time.Second, HasReset: true, Limit: 10, HasLimit: true}},

		// RateLimit-Policy
		{"policy", []hdr{{"RateLimit-Policy", `"default";q=50;w=1`}}, max, rateLimitHint{Limit: 50, HasLimit: true, Window: time.Second, HasWindow: true}},
		{"policy, params in any order", []hdr{{"RateLimit-Policy", `"default";w=60;qu="requests";q=100`}}, max, rateLimitHint{Limit: 100, HasLimit: true, Window: time.Minute, HasWindow: true}},
		{"policy, lowest rate wins", []hdr{{"RateLimit-Policy", `"burst";q=100;w=1, "daily";q=1000;w=86400`}}, max, rateLimitHint{Limit: 1000, HasLimit: true, Window: 24 * time.Hour, HasWindow: true}},
		{"policy, lowest rate wins across lines", []hdr{{"RateLimit-Policy", `"daily";q=1000;w=86400`}, {"RateLimit-Policy", `"burst";q=1;w=1`}}, max, rateLimitHint{Limit: 1000, HasLimit: true, Window: 24 * time.Hour, HasWindow: true}},
		{"policy, older integer form", []hdr{{"RateLimit-Policy", `10;w=1, 50;w=60`}}, max, rateLimitHint{Limit: 50, HasLimit: true, Window: time.Minute, HasWindow: true}},
		{"policy without window", []hdr{{"RateLimit-Policy", `"default";q=50`}}, max, rateLimitHint{Limit: 50, HasLimit: true}},
		{"policy, windowed beats bare", []hdr{{"RateLimit-Policy", `"a";q=1, "b";q=500;w=1`}}, max, rateLimitHint{Limit: 500, HasLimit: true, Window: time.Second, HasWindow: true}},
		{"policy, huge quota and window compared exactly", []hdr{{"RateLimit-Policy", `"a";q=9223372036854775807;w=9223372035, "b";q=9223372036854775806;w=9223372035`}}, max,
			rateLimitHint{Limit: 9223372036854775806, HasLimit: true, Window: 9223372035 * time.Second, HasWindow: true}},
		{"policy, negative quota ignored", []hdr{{"RateLimit-Policy", `"default";q=-5;w=1`}}, max, rateLimitHint{}},
		{"policy, name only", []hdr{{"RateLimit-Policy", `"default"`}}, max, rateLimitHint{}},

		// which source wins
		{"structured remaining before X-", []hdr{{"RateLimit", `"d";r=0;t=9`}, {"X-RateLimit-Remaining", "10"}, {"X-RateLimit-Reset", "60"}}, max,
			rateLimitHint{HasRemaining: true, Reset: 9 * time.Second, HasReset: true}},
		{"structured remaining without reset takes X- reset", []hdr{{"RateLimit", `"d";r=0`}, {"X-RateLimit-Reset", "60"}}, max,
			rateLimitHint{HasRemaining: true, Reset: time.Minute, HasReset: true}},
		{"older draft before X-", []hdr{{"RateLimit-Remaining", "1"}, {"X-RateLimit-Remaining", "0"}}, max, rateLimitHint{Remaining: 1, HasRemaining: true}},
		{"policy before X- limit", []hdr{{"RateLimit-Policy", `"d";q=50;w=1`}, {"X-RateLimit-Limit", "100;w=1"}}, max,
			rateLimitHint{Limit: 50, HasLimit: true, Window: time.Second, HasWindow: true}},
		{"limit and window come from one source", []hdr{{"RateLimit-Policy", `"d";q=50`}, {"X-RateLimit-Limit", "100;w=1"}}, max,
			rateLimitHint{Limit: 50, HasLimit: true}},
		{"garbage policy falls back to X- limit", []hdr{{"RateLimit-Policy", `"d";q=lots`}, {"X-RateLimit-Limit", "100;w=1"}}, max,
			rateLimitHint{Limit: 100, HasLimit: true, Window: time.Second, HasWindow: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for _, kv := range tt.headers {
				h.Add(kv.name, kv.value)
			}
			if got := parseRateLimit(h, now, tt.max); got != tt.want {
				t.Fatalf("parseRateLimit(%v, max %v) =\n\t%+v\nwant\n\t%+v", h, tt.max, got, tt.want)
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
	now := raNow().Unix()
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
		wait, ok := parseRetryAfter([]string{a, b}, time.Unix(nowUnix, 0), max)
		if wait < 0 || wait > max {
			t.Fatalf("parseRetryAfter(%q, %q) = %v, outside [0, %v]", a, b, wait, max)
		}
		if !ok && wait != 0 {
			t.Fatalf("parseRetryAfter(%q, %q) = %v, false; want 0 when not ok", a, b, wait)
		}
	})
}

func FuzzParseRateLimit(f *testing.F) {
	now := raNow().Unix()
	for _, seed := range []struct {
		rateLimit, policy, limit, remaining, reset, resetAfter string
	}{
		{`"default";r=0;t=30`, `"default";q=50;w=1`, "", "", "", ""},
		{`"burst";r=5;t=1, "daily";r=0;t=3600`, `"burst";q=100;w=1, "daily";q=1000;w=86400`, "", "", "", ""},
		{`limit=10, remaining=1, reset=7`, `10;w=1, 50;w=60`, "", "", "", ""},
		{"", "", "50, 50;w=1", "3", "30", ""},
		{"", "", "50;w=60", "0", strconv.FormatInt(now+45, 10), "2.5"},
		{"", "", "10", "-1", strconv.FormatInt((now+2)*1000, 10), ""},
		{`"a\";r=0";r=7;pk=:YWJj=:`, `"d";q=-1;w=0`, "99999999999999999999", "9223372036854775808", "99999999999999999999", "x"},
	} {
		f.Add(seed.rateLimit, seed.policy, seed.limit, seed.remaining, seed.reset, seed.resetAfter, now, int64(time.Hour))
	}
	f.Fuzz(func(t *testing.T, rateLimit, policy, limit, remaining, reset, resetAfter string, nowUnix, maxNanos int64) {
		max := fuzzMax(maxNanos)
		h := http.Header{}
		h.Set("RateLimit", rateLimit)
		h.Set("RateLimit-Policy", policy)
		h.Set("RateLimit-Limit", limit)
		h.Set("RateLimit-Remaining", remaining)
		h.Set("RateLimit-Reset", reset)
		h.Set("X-RateLimit-Limit", limit)
		h.Set("X-RateLimit-Remaining", remaining)
		h.Set("X-RateLimit-Reset", reset)
		h.Set("X-RateLimit-Reset-After", resetAfter)
		got := parseRateLimit(h, time.Unix(nowUnix, 0), max)
		switch {
		case got.Reset < 0 || got.Reset > max:
			t.Fatalf("Reset %v outside [0, %v] in %+v", got.Reset, max, got)
		case got.Remaining < 0 || got.Limit < 0 || got.Window < 0:
			t.Fatalf("negative field in %+v", got)
		case got.HasWindow && (got.Window == 0 || !got.HasLimit):
			t.Fatalf("window without a limit, or zero, in %+v", got)
		case !got.HasRemaining && got.Remaining != 0, !got.HasReset && got.Reset != 0,
			!got.HasLimit && got.Limit != 0, !got.HasWindow && got.Window != 0:
			t.Fatalf("a field that was not sent is not zero in %+v", got)
		}
	})
}
