package egress

import (
	"errors"
	"net/http"
	"testing"
	"time"
)

func TestDialectResetUnit(t *testing.T) {
	tr, err := New(nil,
		WithResetUnit("api.prisjakt.nu", "x-rate-limit-reset", ResetDeltaMillis),
		WithResetUnit("diffcord.example:8443", "X-Rate-Limit-Reset", ResetEpochMillis),
		WithResetUnit("api.example.com", "X-RateLimit-Reset", ResetEpochSeconds),
		WithResetUnit("api.example.com", "X-RateLimit-Reset", ResetAuto), // the later setting wins
		WithResetUnit("azure.example", "x-ratelimit-reset-tokens", ResetDeltaSeconds),
	)
	if err != nil {
		t.Fatal(err)
	}
	now := raNow()
	reset := func(host string, headers ...string) Quota {
		t.Helper()
		s := tr.signals.readSignal(sigResponse(200, headers, ""), host, now, now, time.Hour)
		checkSignal(t, &s)
		if len(s.Quotas) == 0 {
			return Quota{}
		}
		if len(s.Quotas) != 1 {
			t.Fatalf("%s %q: %s", host, headers, fmtSignal(s))
		}
		return s.Quotas[0]
	}
	for _, tt := range []struct {
		host    string
		headers []string
		want    time.Duration
		has     bool
	}{
		{"api.prisjakt.nu", []string{"X-Rate-Limit-Reset", "600000"}, 10 * time.Minute, true},
		{"API.Prisjakt.nu:443", []string{"X-Rate-Limit-Reset", "600000"}, 10 * time.Minute, true},
		{"other.example", []string{"X-Rate-Limit-Reset", "600000"}, time.Hour, true}, // the shape rule: seconds, capped
		{"api.prisjakt.nu", []string{"X-Rate-Limit-Reset", "2024-01-02T03:05:05Z"}, 0, false},
		{"diffcord.example:8443", []string{"X-Rate-Limit-Reset", "1704164675000"}, 30 * time.Second, true},
		{"diffcord.example", []string{"X-Rate-Limit-Reset", "1704164675000"}, 30 * time.Second, true}, // the shape rule reads it too
		{"api.example.com", []string{"X-RateLimit-Reset", "30"}, 30 * time.Second, true},
		{"azure.example", []string{"X-Ratelimit-Reset-Tokens", "6m0s"}, 0, false},
		{"azure.example", []string{"X-Ratelimit-Reset-Tokens", "17"}, 17 * time.Second, true},
	} {
		q := reset(tt.host, tt.headers...)
		if q.Reset != tt.want || q.HasReset != tt.has {
			t.Errorf("%s %q: reset %v (%v); want %v (%v)", tt.host, tt.headers, q.Reset, q.HasReset, tt.want, tt.has)
		}
	}
}

func TestDialectOptionErrors(t *testing.T) {
	for _, tt := range []struct {
		name string
		opt  Option
	}{
		{"empty host", WithResetUnit("", "X-Rate-Limit-Reset", ResetDeltaMillis)},
		{"URL for a host", WithResetUnit("https://api.x.com/", "X-Rate-Limit-Reset", ResetDeltaMillis)},
		{"unknown header", WithResetUnit("api.x.com", "X-Rate-Limit-Resets", ResetDeltaMillis)},
		{"unknown unit", WithResetUnit("api.x.com", "X-Rate-Limit-Reset", ResetUnit(99))},
		{"nil reader", WithSignalReader(nil)},
		{"nil func reader", WithSignalReader(SignalReaderFunc(nil))},
	} {
		if _, err := New(nil, tt.opt); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: err = %v; want ErrInvalidConfig", tt.name, err)
		}
	}
}

// A user's dialect, added without forking: Trakt's JSON in a header.
func TestDialectSignalReader(t *testing.T) {
	var seen []string
	trakt := SignalReaderFunc(func(resp *http.Response, s *Signal) {
		seen = append(seen, s.Host)
		if resp.Header.Get("X-Ratelimit") == "" {
			return
		}
		s.AddQuota(Quota{Dimension: Requests, Name: "AUTHED_API_POST_LIMIT", Limit: 1, HasLimit: true,
			Remaining: -3, HasRemaining: true, Window: time.Second, HasWindow: true, Reset: 2 * time.Hour, HasReset: true})
		s.AddRetryAfter(90 * time.Second)
		s.SetRetry(RetryYes)
		s.SetScope(ScopeQuota)
	})
	tr, err := New(nil, WithSignalReader(trakt))
	if err != nil {
		t.Fatal(err)
	}
	s := tr.signals.readSignal(sigResponse(429, []string{"X-Ratelimit", `{"name":"AUTHED_API_POST_LIMIT","period":1,"limit":1,"remaining":0}`, "Retry-After", "30"}, ""),
		"api.trakt.tv", raNow(), raNow(), time.Minute)
	checkSignal(t, &s)
	want := Quota{Dimension: Requests, Name: "AUTHED_API_POST_LIMIT", Limit: 1, HasLimit: true, Window: time.Second, HasWindow: true, Reset: time.Minute, HasReset: true}
	if len(s.Quotas) != 1 || s.Quotas[0] != want || s.RetryAfter != time.Minute || !s.RetryAfterTooLong || s.Retry != RetryYes || s.Scope != ScopeQuota {
		t.Fatalf("got %s", fmtSignal(s))
	}
	if len(seen) != 1 || seen[0] != "api.trakt.tv" {
		t.Fatalf("the reader saw hosts %q", seen)
	}
}

func TestDialectMerge(t *testing.T) {
	s := Signal{MaxWait: time.Minute}
	s.SetRetry(RetryYes)
	s.SetRetry(RetryNo)
	s.SetRetry(RetryYes)
	s.SetScope(ScopeOther)
	s.SetScope(ScopeQuota)
	s.SetScope(ScopeOther)
	if s.Retry != RetryNo || s.Scope != ScopeQuota {
		t.Fatalf("Retry %v, Scope %v; want RetryNo, ScopeQuota", s.Retry, s.Scope)
	}
	s.AddRetryAfter(-time.Second)
	s.AddRetryAfter(5 * time.Second)
	s.AddRetryAfter(2 * time.Second)
	if s.RetryAfter != 5*time.Second || !s.HasRetryAfter || s.RetryAfterTooLong {
		t.Fatalf("RetryAfter %v", s.RetryAfter)
	}
	s.AddQuota(Quota{Dimension: Tokens, Limit: 100, HasLimit: true, Remaining: 50, HasRemaining: true})
	s.AddQuota(Quota{Dimension: Tokens, Limit: 80, HasLimit: true, Reset: time.Second, HasReset: true, Kind: ResetKindBucket})
	s.AddQuota(Quota{Dimension: Tokens, Remaining: 60, HasRemaining: true, Reset: 2 * time.Second, HasReset: true})
	s.AddQuota(Quota{Dimension: Tokens, Window: time.Minute, HasWindow: true, Remaining: 1, HasRemaining: true})
	s.AddQuota(Quota{Dimension: Dimension(9), Remaining: 1, HasRemaining: true})
	s.AddQuota(Quota{Dimension: Requests, Limit: -1, HasLimit: true, Remaining: 7}) // nothing usable
	want := []Quota{
		{Dimension: Tokens, Limit: 80, HasLimit: true, Remaining: 50, HasRemaining: true, Reset: 2 * time.Second, HasReset: true, Kind: ResetKindBucket},
		{Dimension: Tokens, Window: time.Minute, HasWindow: true, Remaining: 1, HasRemaining: true},
	}
	if len(s.Quotas) != len(want) || s.Quotas[0] != want[0] || s.Quotas[1] != want[1] {
		t.Fatalf("got %s", fmtSignal(s))
	}
}

func TestDialectHostName(t *testing.T) {
	for in, want := range map[string]string{
		"api.x.com": "api.x.com", "api.x.com:443": "api.x.com", "[::1]:80": "[::1]", "[::1]": "[::1]", "::1": "::1", "": "",
	} {
		if got := hostName(in); got != want {
			t.Errorf("hostName(%q) = %q; want %q", in, got, want)
		}
	}
}

func TestDialectNoAllocations(t *testing.T) {
	resp := &http.Response{StatusCode: 200, Body: http.NoBody, Header: http.Header{
		"Content-Type": {"application/json"}, "Date": {"Tue, 02 Jan 2024 03:04:05 GMT"}, "Server": {"nginx"},
		"X-Request-Id": {"req_123"}, "Cache-Control": {"no-store"}, "Content-Length": {"2"},
	}}
	cfg := &signalConfig{units: []resetOverride{{host: "api.x.com", header: "X-Rate-Limit-Reset", unit: ResetDeltaMillis}}}
	now := raNow()
	for name, c := range map[string]*signalConfig{"built-in": nil, "with settings": cfg} {
		allocs := testing.AllocsPerRun(200, func() {
			s := c.readSignal(resp, "api.x.com", now, now, time.Minute)
			if len(s.Quotas) != 0 {
				t.Fatal("quotas")
			}
		})
		if allocs != 0 {
			t.Errorf("%s: readSignal of a response without rate-limit headers made %v allocations; want 0", name, allocs)
		}
	}
}

func BenchmarkReadSignal(b *testing.B) {
	for _, bb := range []struct {
		name    string
		headers []string
	}{
		{"plain", []string{"Content-Type", "application/json", "Date", "Tue, 02 Jan 2024 03:04:05 GMT", "X-Request-Id", "req_123"}},
		{"openai", []string{"x-ratelimit-limit-requests", "60", "x-ratelimit-limit-tokens", "150000",
			"x-ratelimit-remaining-requests", "59", "x-ratelimit-remaining-tokens", "149984",
			"x-ratelimit-reset-requests", "1s", "x-ratelimit-reset-tokens", "6m0s"}},
		{"github", []string{"x-ratelimit-limit", "60", "x-ratelimit-remaining", "42", "x-ratelimit-used", "18",
			"x-ratelimit-reset", "1704164705", "x-ratelimit-resource", "core"}},
	} {
		b.Run(bb.name, func(b *testing.B) {
			resp := sigResponse(200, bb.headers, "")
			now := raNow()
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				readSignal(resp, now, now, time.Minute)
			}
		})
	}
}
