package control

import (
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestParseTold: the messages the scripts publish, as control.lua,
// rate.lua and limits.lua write them, and messages that say nothing.
func TestParseTold(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Told
		ok   bool
	}{
		{"k 250000", Told{Kind: ToldHold, Key: "k", Left: 250 * time.Millisecond}, true},
		{"k 250000 e1700000000250000 p3", Told{Kind: ToldHold, Key: "k", Left: 250 * time.Millisecond, End: 1700000000250000, Probes: 3}, true},
		{"k 250000 e-5 p99 q1", Told{Kind: ToldHold, Key: "k", Left: 250 * time.Millisecond}, true}, // unreadable parts ignored
		{"k x2 500000 7", Told{Kind: ToldRate, Key: "k", Factor: 2, From: 500 * time.Millisecond, Seq: 7}, true},
		{"k x0.5 0 1", Told{Kind: ToldRate, Key: "k", Factor: 0.5, Seq: 1}, true},
		{"k m 1700000000000000 3:1700000000100000", Told{Kind: ToldMoved, Key: "k", Moved: "1700000000000000 3:1700000000100000"}, true},
		{"", Told{}, false},
		{"k", Told{}, false},
		{" 250000", Told{}, false},
		{"k 0", Told{}, false},
		{"k -1", Told{}, false},
		{"k abc", Told{}, false},
		{"k " + strconv.FormatInt(math.MaxInt64, 10), Told{}, false}, // a Duration overflows
		{"k x2 -1 1", Told{}, false},
		{"k x2 " + strconv.FormatInt(int64(49*time.Hour/time.Microsecond), 10) + " 1", Told{}, false},
		{"k x2 0", Told{}, false},
		{"k xx 0 1", Told{}, false},
	} {
		got, ok := ParseTold(tc.in)
		assert.Equal(t, tc.ok, ok, "%q", tc.in)
		assert.Equal(t, tc.want, got, "%q", tc.in)
	}
}

// FuzzParseTold: a message heard on a channel never panics, and what is
// read of it is within its bounds.
func FuzzParseTold(f *testing.F) {
	for _, s := range []string{"k 250000", "k 250000 e1700000000250000 p3", "k x2 500000 7", "k x0.5 0 1",
		"k m 1700000000000000 3:1700000000100000", "k 9223372036854775807", "k x1e308 0 18446744073709551615", "k  p"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, ok := ParseTold(in)
		if !ok {
			if got != (Told{}) {
				t.Fatalf("%q: nothing read, yet %+v", in, got)
			}
			return
		}
		if got.Key == "" {
			t.Fatalf("%q: no key", in)
		}
		switch got.Kind {
		case ToldHold:
			if got.Left <= 0 || got.End < 0 || got.Probes < 0 || got.Probes > StormProbes {
				t.Fatalf("%q: a hold out of bounds: %+v", in, got)
			}
		case ToldRate:
			if got.From < 0 || got.From > maxFrom {
				t.Fatalf("%q: a change of rate out of bounds: %+v", in, got)
			}
		case ToldMoved:
		default:
			t.Fatalf("%q: kind %d", in, got.Kind)
		}
	})
}
