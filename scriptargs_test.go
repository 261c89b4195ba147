package egress

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/egress-go/egress/internal/argv"
	"github.com/egress-go/egress/internal/lease"
	"github.com/egress-go/egress/internal/member"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// headerSpec is the ARGV a script's header describes for one operation:
// the indices that begin a header line ("-- ARGV[8], ARGV[9]  ..."), in
// order, as written (see argvIndex), and whether the operation's
// arguments end in a group repeated to the end: its last line goes on
// with "...", or counts from r, the index before each group.
type headerSpec struct {
	idx     []string
	repeats bool
}

// headerArgv returns the ARGV a script's header describes, by operation.
// A line "-- acquire:" or "-- adopt, renew:" begins the arguments of
// those operations, which follow the lines before the first such line;
// a script without operations has its ARGV under "".
func headerArgv(t *testing.T, script string) map[string]headerSpec {
	t.Helper()
	lead := regexp.MustCompile(`^-- ((?:ARGV\[[0-9A-Za-z+-]+\](?:, )?)+)(\.\.\.)?`)
	opLine := regexp.MustCompile(`^-- ([a-z]+(?:, [a-z]+)*):$`)
	one := regexp.MustCompile(`ARGV\[([0-9A-Za-z+-]+)\]`)
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
				h.idx = append(h.idx, n[1])
			}
			h.repeats = m[2] != "" || strings.Contains(m[1], "[r+")
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

// headerDefs returns the names a script's header defines for its indices,
// "where o = 2+4L", by name: the index that name stands for.
func headerDefs(script string) map[string]string {
	out := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^--.*\bwhere ([a-z]) = ([0-9A-Za-z+-]+)`).FindAllStringSubmatch(script, -1) {
		out[m[1]] = m[2]
	}
	return out
}

// argvTerm is a term of an index: a number, a name or a number times a
// name ("4i"), with its sign.
var argvTerm = regexp.MustCompile(`^(-?)(\d*)([A-Za-z]?)$`)

// argvIndex returns the value of an index as a header or a tag writes it:
// a sum of terms (argvTerm), such as "3", "4i-1" or "o+2L+2", whose names
// take their values from env (L the number of limits, i a limit's, and
// whatever the header defines, see headerDefs).
func argvIndex(expr string, env map[string]int) (int, error) {
	sum := 0
	for _, term := range strings.Split(strings.ReplaceAll(expr, "-", "+-"), "+") {
		m := argvTerm.FindStringSubmatch(term)
		if m == nil || m[2] == "" && m[3] == "" {
			return 0, fmt.Errorf("%q: a term %q", expr, term)
		}
		v := 1
		if m[2] != "" {
			v, _ = strconv.Atoi(m[2])
		}
		if m[3] != "" {
			x, ok := env[m[3]]
			if !ok {
				return 0, fmt.Errorf("%q: %s is not defined", expr, m[3])
			}
			v *= x
		}
		if m[1] == "-" {
			v = -v
		}
		sum += v
	}
	return sum, nil
}

// argvSlot is a value that argv encodes: its field's tag, and the limit
// (i, 1-based) of the slice element it belongs to; 0 outside a slice.
type argvSlot struct {
	tag string
	i   int
}

// tagArgv returns the values that argv encodes of a value of type typ,
// in order, each slice holding L elements; i is the limit of the element
// that holds them.
func tagArgv(t *testing.T, typ reflect.Type, L, i int) []argvSlot {
	t.Helper()
	var out []argvSlot
	for k := range typ.NumField() {
		f := typ.Field(k)
		elem, n := f.Type, 1
		if elem.Kind() == reflect.Slice {
			elem, n = elem.Elem(), L
		}
		for j := range n {
			at := i
			if f.Type.Kind() == reflect.Slice {
				at = j + 1
			}
			if elem.Kind() == reflect.Struct {
				out = append(out, tagArgv(t, elem, L, at)...)
				continue
			}
			tag := f.Tag.Get("argv")
			require.NotEmpty(t, tag, "%s.%s: its argv tag", typ.Name(), f.Name)
			out = append(out, argvSlot{tag: tag, i: at})
		}
	}
	return out
}

// tags returns the tags of slots.
func tags(slots []argvSlot) []string {
	out := make([]string, len(slots))
	for k, s := range slots {
		out[k] = s.tag
	}
	return out
}

// argvCase is one operation's types of a script's ARGV, for
// TestScriptArgsMatchHeaders.
type argvCase struct {
	script string // its file in internal/lua, or a path from the root
	op     string // the operation, for a script of several; "" for none
	fixed  []any  // pointers to the types of the fixed arguments, in order
	each   any    // a pointer to the type of each repeated group; nil for none
	// encode returns the operation's arguments for L limits, with one
	// group; nil when argv of the types' zero values gives them (no slice).
	encode func(L int) []any
}

// TestScriptArgsMatchHeaders: each script's argument types have a field
// an ARGV of the script's header, in the header's order, and encode as
// many values, each at the index that its tag and the header write: a
// field added to one and not the other fails here, not in Redis.
func TestScriptArgsMatchHeaders(t *testing.T) {
	covered := map[string][]string{}
	for _, tc := range argvCases() {
		name := tc.script + " " + tc.op
		src, err := os.ReadFile(scriptPath(tc.script))
		require.NoError(t, err)
		header, ok := headerArgv(t, string(src))[tc.op]
		require.True(t, ok, "%s: the header describes the operation", name)
		covered[tc.script] = append(covered[tc.script], tc.op)
		assert.Equal(t, header.idx, tags(argvWalk(t, tc, 1)), "%s: its fields' ARGV, against the script's header", name)
		assert.Equal(t, tc.each != nil, header.repeats, "%s: a repeated group, as the header says", name)
		for L := 1; L <= 3; L++ {
			checkArgvIndices(t, name, tc, headerDefs(string(src)), L)
		}
	}
	for script, ops := range covered {
		src, err := os.ReadFile(scriptPath(script))
		require.NoError(t, err)
		assert.Len(t, headerArgv(t, string(src)), len(ops), "%s: a type for each operation of its header", script)
	}
}

// scriptPath is the path of a script named as argvCase.script names it.
func scriptPath(script string) string {
	if filepath.Base(script) == script {
		return filepath.Join("internal", "lua", script)
	}
	return script
}

// argvWalk returns the values of tc's types for L limits, in order: the
// fixed arguments, then one repeated group.
func argvWalk(t *testing.T, tc argvCase, L int) []argvSlot {
	var out []argvSlot
	for _, v := range tc.fixed {
		out = append(out, tagArgv(t, reflect.TypeOf(v).Elem(), L, 0)...)
	}
	if tc.each != nil {
		out = append(out, tagArgv(t, reflect.TypeOf(tc.each).Elem(), L, 0)...)
	}
	return out
}

// checkArgvIndices checks that tc's arguments for L limits encode as many
// values as its types hold, each at the index its tag says: r is the
// index before the repeated group, and defs' names are the header's.
func checkArgvIndices(t *testing.T, name string, tc argvCase, defs map[string]string, L int) {
	t.Helper()
	slots := argvWalk(t, tc, L)
	var got []any
	if tc.encode != nil {
		got = tc.encode(L)
		require.NotEmpty(t, got, name)
		assert.Equal(t, tc.op, got[0], "%s: its encoder's operation", name)
	} else {
		for _, v := range tc.fixed {
			got = argv.Append(got, v)
		}
		if tc.each != nil {
			got = argv.Append(got, tc.each)
		}
	}
	assert.Len(t, got, len(slots), "%s, L=%d: a value a field", name, L)
	env := map[string]int{"L": L}
	if tc.each != nil {
		env["r"] = len(slots) - len(tagArgv(t, reflect.TypeOf(tc.each).Elem(), L, 0))
	}
	for n, expr := range defs {
		v, err := argvIndex(expr, env)
		require.NoError(t, err, "%s: its header's %s", name, n)
		env[n] = v
	}
	for k, s := range slots {
		env["i"] = s.i
		v, err := argvIndex(s.tag, env)
		if assert.NoError(t, err, "%s", name) {
			assert.Equal(t, k+1, v, "%s, L=%d, i=%d: ARGV[%s] is the %d-th value", name, L, s.i, s.tag, k+1)
		}
	}
}

// argvCases returns the types of each script's ARGV, by operation.
func argvCases() []argvCase {
	return []argvCase{
		{script: "internal/control/control.lua", fixed: []any{&controlArgv{}}},
		{script: "reserve.lua", fixed: []any{&reserveArgv{}}, each: &reserveRequest{}},
		{script: "internal/member/heartbeat.lua", fixed: []any{&member.Args{}}},
		{script: "internal/lease/slots.lua", op: "acquire", fixed: []any{&lease.Op{}, &lease.Acquiring{}}},
		{script: "internal/lease/slots.lua", op: "adopt", fixed: []any{&lease.Op{}}, each: &lease.Lease{}},
		{script: "internal/lease/slots.lua", op: "renew", fixed: []any{&lease.Op{}}, each: &lease.Lease{}},
		{script: "internal/lease/slots.lua", op: "release", fixed: []any{&lease.Op{}, &lease.Releasing{}}, each: &lease.Released{}},
		{script: "limits.lua", op: "reserve", fixed: []any{&limitsHead{}, &limitsReserve{}}, each: &limitsRequest{},
			encode: func(L int) []any {
				req := limitsRequest{limitsCosts: limitsCosts{costs: make([]int, L)}}
				return limitsReserveArgs(make([]limitsLimit, L), 1, []limitsRequest{req})
			}},
		{script: "limits.lua", op: "settle", fixed: []any{&limitsHead{}, &limitsSettle{}},
			encode: func(L int) []any {
				return limitsSettleArgs(make([]limitsLimit, L), &limitsSettle{costs: make([]limitsSettled, L)})
			}},
		{script: "limits.lua", op: "learn", fixed: []any{&limitsHead{}, &limitsLearn{}},
			encode: func(L int) []any {
				return limitsLearnArgs(make([]limitsLimit, L), &limitsLearn{caps: make([]limitsCap, L)})
			}},
		{script: "limits.lua", op: "window", fixed: []any{&limitsHead{}, &limitsWindow{}},
			encode: func(L int) []any { return limitsWindowArgs(make([]limitsLimit, L), 1, 1) }},
	}
}
