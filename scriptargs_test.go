package egress

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// headerArgv returns the ARGV indices a script's header describes: those
// that begin a header line ("-- ARGV[8], ARGV[9]  ..."), in order, and
// whether the last line goes on with "...", repeating.
func headerArgv(t *testing.T, script string) (idx []int, repeats bool) {
	t.Helper()
	lead := regexp.MustCompile(`^-- ((?:ARGV\[\d+\](?:, )?)+)(\.\.\.)?`)
	one := regexp.MustCompile(`ARGV\[(\d+)\]`)
	for _, line := range strings.Split(script, "\n") {
		if !strings.HasPrefix(line, "--") {
			break // the header ends with the first line of code
		}
		m := lead.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		for _, n := range one.FindAllStringSubmatch(m[1], -1) {
			i, err := strconv.Atoi(n[1])
			require.NoError(t, err)
			idx = append(idx, i)
		}
		repeats = m[2] != ""
	}
	return idx, repeats
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
	for _, tc := range []struct {
		script string // its file in internal/lua
		fixed  any    // a pointer to the type of the fixed arguments
		each   any    // a pointer to the type of each repeated group; nil for none
	}{
		{"control.lua", &controlArgv{}, nil},
		{"reserve.lua", &reserveArgv{}, &reserveRequest{}},
		{"heartbeat.lua", &heartbeatArgv{}, nil},
	} {
		name := reflect.TypeOf(tc.fixed).Elem().Name()
		src, err := os.ReadFile(filepath.Join("internal", "lua", tc.script))
		require.NoError(t, err)
		header, repeats := headerArgv(t, string(src))
		want := tagArgv(t, reflect.TypeOf(tc.fixed).Elem())
		if tc.each != nil {
			want = append(want, tagArgv(t, reflect.TypeOf(tc.each).Elem())...)
		}
		assert.Equal(t, header, want, "%s: its fields' ARGV, against the script's header", name)
		assert.Equal(t, tc.each != nil, repeats, "%s: a repeated group, as the header says", name)
		for i, n := range want {
			assert.Equal(t, i+1, n, "%s: ARGV in order, from 1", name)
		}
		got := argv(nil, tc.fixed)
		if tc.each != nil {
			got = argv(got, tc.each)
		}
		assert.Len(t, got, len(want), "%s: a value a field", name)
	}
}
