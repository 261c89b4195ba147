package egress

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// headerSpec is the ARGV a script's header describes for one operation:
// the indices that begin a header line ("-- ARGV[8], ARGV[9]  ..."), in
// order, and whether the last line goes on with "...", repeating.
type headerSpec struct {
	idx     []int
	repeats bool
}

// headerArgv returns the ARGV a script's header describes, by operation.
// A line "-- acquire:" or "-- adopt, renew:" begins the arguments of
// those operations, which follow the lines before the first such line;
// a script without operations has its ARGV under "".
func headerArgv(t *testing.T, script string) map[string]headerSpec {
	t.Helper()
	lead := regexp.MustCompile(`^-- ((?:ARGV\[\d+\](?:, )?)+)(\.\.\.)?`)
	opLine := regexp.MustCompile(`^-- ([a-z]+(?:, [a-z]+)*):$`)
	one := regexp.MustCompile(`ARGV\[(\d+)\]`)
	var common headerSpec
	out := map[string]headerSpec{}
	ops := []string{""}
	for _, line := range strings.Split(script, "\n") {
		if !strings.HasPrefix(line, "--") {
			break // the header ends with the first line of code
		}
		if m := opLine.FindStringSubmatch(line); m != nil {
			ops = strings.Split(m[1], ", ")
			for _, op := range ops {
				out[op] = headerSpec{idx: slices.Clone(common.idx)}
			}
			continue
		}
		m := lead.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		for _, op := range ops {
			h := out[op]
			for _, n := range one.FindAllStringSubmatch(m[1], -1) {
				i, err := strconv.Atoi(n[1])
				require.NoError(t, err)
				h.idx = append(h.idx, i)
			}
			h.repeats = m[2] != ""
			out[op] = h
		}
		if ops[0] == "" {
			common = out[""]
		}
	}
	if len(out) > 1 {
		delete(out, "") // the common lines, in every operation's
	}
	return out
}

// tagArgv returns the argv tags of the fields of a value of type typ, in
// the order argv encodes them.
func tagArgv(t *testing.T, typ reflect.Type) []int {
	t.Helper()
	var out []int
	for i := range typ.NumField() {
		f := typ.Field(i)
		if f.Type.Kind() == reflect.Struct {
			out = append(out, tagArgv(t, f.Type)...)
			continue
		}
		n, err := strconv.Atoi(f.Tag.Get("argv"))
		require.NoError(t, err, "%s.%s: its argv tag", typ.Name(), f.Name)
		out = append(out, n)
	}
	return out
}

// TestScriptArgsMatchHeaders: each script's argument type has a field an
// ARGV of the script's header, in the header's order, and encodes as
// many values: a field added to one and not the other fails here, not in
// Redis.
func TestScriptArgsMatchHeaders(t *testing.T) {
	covered := map[string][]string{}
	for _, tc := range []struct {
		script string // its file in internal/lua
		op     string // the operation, for a script of several; "" for none
		fixed  []any  // pointers to the types of the fixed arguments, in order
		each   any    // a pointer to the type of each repeated group; nil for none
	}{
		{"control.lua", "", []any{&controlArgv{}}, nil},
		{"reserve.lua", "", []any{&reserveArgv{}}, &reserveRequest{}},
		{"heartbeat.lua", "", []any{&heartbeatArgv{}}, nil},
		{"slots.lua", "acquire", []any{&slotsOp{}, &slotsAcquire{}}, nil},
		{"slots.lua", "adopt", []any{&slotsOp{}}, &slotsLease{}},
		{"slots.lua", "renew", []any{&slotsOp{}}, &slotsLease{}},
		{"slots.lua", "release", []any{&slotsOp{}, &slotsRelease{}}, &slotsReleased{}},
	} {
		name := tc.script + " " + tc.op
		src, err := os.ReadFile(filepath.Join("internal", "lua", tc.script))
		require.NoError(t, err)
		header, ok := headerArgv(t, string(src))[tc.op]
		require.True(t, ok, "%s: the header describes the operation", name)
		covered[tc.script] = append(covered[tc.script], tc.op)
		var want []int
		var got []any
		for _, v := range tc.fixed {
			want = append(want, tagArgv(t, reflect.TypeOf(v).Elem())...)
			got = argv(got, v)
		}
		if tc.each != nil {
			want = append(want, tagArgv(t, reflect.TypeOf(tc.each).Elem())...)
			got = argv(got, tc.each)
		}
		assert.Equal(t, header.idx, want, "%s: its fields' ARGV, against the script's header", name)
		assert.Equal(t, tc.each != nil, header.repeats, "%s: a repeated group, as the header says", name)
		for i, n := range want {
			assert.Equal(t, i+1, n, "%s: ARGV in order, from 1", name)
		}
		assert.Len(t, got, len(want), "%s: a value a field", name)
	}
	for script, ops := range covered {
		src, err := os.ReadFile(filepath.Join("internal", "lua", script))
		require.NoError(t, err)
		assert.Len(t, headerArgv(t, string(src)), len(ops), "%s: a type for each operation of its header", script)
	}
}

// TestSlotsReply: slots.lua's reply is read by one decoder, which takes a
// count and a wait and refuses anything else.
func TestSlotsReply(t *testing.T) {
	r, err := parseSlots([]int64{0, 1500})
	require.NoError(t, err)
	assert.Equal(t, slotsReply{n: 0, wait: 1500 * time.Microsecond}, r)
	for _, bad := range [][]int64{nil, {1}, {1, 0, 0}, {-1, 0}, {0, -1}} {
		_, err := parseSlots(bad)
		assert.Error(t, err, "%v", bad)
	}
}
