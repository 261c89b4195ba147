package control

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// Told is what a key's script told the fleet on the key's channel
// (internal/lua/publish.lua), as an instance heard it:
//
//   - a hold, "<key id> <us left>", with " e<its end on the server's
//     clock, us>" and " p<probes after it>" from control.lua (limits.lua
//     sends the first part alone);
//   - a change of the key's rate that moves the turns given after a point,
//     "<key id> x<old over new> <us until that point> <sequence>"
//     (rate.lua's retime);
//   - a SharedLimits' moved turns, "<key id> m <...>", whose rest its
//     owner reads (limits.lua).
//
// Every message is read as hostile: a field that cannot be read, or out
// of its bounds, makes the message one that says nothing (ParseTold's
// false), never a panic.
type Told struct {
	Kind ToldKind
	Key  string // the key's id

	Left   time.Duration // a hold: how long it lasts from when it was heard; > 0
	End    int64         // a hold: its end on the server's clock (us); 0 unknown
	Probes int           // a hold: the probes after it, 0 to StormProbes

	Factor float64       // a change of rate: the old rate over the new
	From   time.Duration // a change of rate: how long from when it was heard the turns after move; 0 to 48 h
	Seq    uint64        // a change of rate: its sequence number on the key

	Moved string // a SharedLimits' moved turns: the message after "m "
}

// ToldKind says what a message told.
type ToldKind uint8

// The messages on a key's channel.
const (
	ToldHold ToldKind = iota + 1
	ToldRate
	ToldMoved
)

// maxFrom bounds a change of rate's point: a message that puts it further
// away is not believed.
const maxFrom = 48 * time.Hour

// ParseTold reads a message heard on a key's channel; ok is false when it
// says nothing that can be read.
func ParseTold(payload string) (t Told, ok bool) {
	id, rest, ok := strings.Cut(payload, " ")
	if !ok || id == "" {
		return Told{}, false
	}
	t.Key = id
	if moved, ok := strings.CutPrefix(rest, "m "); ok {
		t.Kind, t.Moved = ToldMoved, moved
		return t, true
	}
	if rate, ok := strings.CutPrefix(rest, "x"); ok {
		return parseRate(t, rate)
	}
	return parseHold(t, rest)
}

// parseRate reads a change of rate's "<factor> <us> <seq>".
func parseRate(t Told, rest string) (Told, bool) {
	f, rest, _ := strings.Cut(rest, " ")
	from, n, _ := strings.Cut(rest, " ")
	factor, err1 := strconv.ParseFloat(f, 64)
	us, err2 := strconv.ParseInt(from, 10, 64)
	seq, err3 := strconv.ParseUint(n, 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || us < 0 || us > int64(maxFrom/time.Microsecond) {
		return Told{}, false
	}
	t.Kind, t.Factor, t.From, t.Seq = ToldRate, factor, time.Duration(us)*time.Microsecond, seq
	return t, true
}

// parseHold reads a hold's "<us left>[ e<end>][ p<probes>]".
func parseHold(t Told, rest string) (Told, bool) {
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return Told{}, false
	}
	us, err := strconv.ParseInt(fields[0], 10, 64)
	if err != nil || us <= 0 || us > math.MaxInt64/int64(time.Microsecond) {
		return Told{}, false // (beyond, the hold's length overflows a Duration)
	}
	t.Kind, t.Left = ToldHold, time.Duration(us)*time.Microsecond
	for _, f := range fields[1:] {
		switch {
		case strings.HasPrefix(f, "e"):
			if end, err := strconv.ParseInt(f[1:], 10, 64); err == nil && end > 0 {
				t.End = end
			}
		case strings.HasPrefix(f, "p"):
			if k, err := strconv.Atoi(f[1:]); err == nil && k >= 0 && k <= StormProbes {
				t.Probes = k
			}
		}
	}
	return t, true
}
