package lua

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// hashCall is a call of a hash command (HGET, HSET, ...) in a script: the
// line it begins on, the command, and the arguments after the key, as
// written.
type hashCall struct {
	line int
	cmd  string
	args []string
}

// callRE matches the start of a call of a Redis command from a script.
var callRE = regexp.MustCompile(`\bredis\.p?call\s*\(`)

// hashCalls returns the calls of hash commands in a script's code,
// leaving out its comments and any call written inside a string literal.
func hashCalls(src string) []hashCall {
	lines := strings.Split(src, "\n")
	for i := range lines {
		lines[i] = strip(lines[i], false)
	}
	text := strings.Join(lines, "\n")
	quoted := inString(text)
	var out []hashCall
	for _, m := range callRE.FindAllStringIndex(text, -1) {
		if quoted[m[0]] {
			continue
		}
		args := callArgs(text, m[1])
		if len(args) < 2 || !isString(args[0]) {
			continue // (a command not written as a string is not seen)
		}
		cmd := strings.ToUpper(args[0][1 : len(args[0])-1])
		if !strings.HasPrefix(cmd, "H") {
			continue
		}
		out = append(out, hashCall{line: strings.Count(text[:m[0]], "\n") + 1, cmd: cmd, args: args[2:]})
	}
	return out
}

// inString marks each byte of code (without comments) that lies inside a
// string literal, its quotes included.
func inString(text string) []bool {
	in := make([]bool, len(text))
	var quote byte
	for i := 0; i < len(text); i++ {
		c := text[i]
		switch {
		case quote != 0:
			in[i] = true
			if c == '\\' && i+1 < len(text) {
				i++
				in[i] = true
			} else if c == quote || c == '\n' {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
			in[i] = true
		}
	}
	return in
}

// callArgs returns the arguments of the call whose parenthesis opened
// just before text[from], each trimmed: split at the commas outside any
// bracket or string.
func callArgs(text string, from int) []string {
	var args []string
	depth, start := 0, from
	var quote byte
	for i := from; i < len(text); i++ {
		c := text[i]
		switch {
		case quote != 0:
			if c == '\\' {
				i++
			} else if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '(' || c == '{' || c == '[':
			depth++
		case c == ')' && depth == 0:
			return append(args, strings.TrimSpace(text[start:i]))
		case c == ')' || c == '}' || c == ']':
			depth--
		case c == ',' && depth == 0:
			args = append(args, strings.TrimSpace(text[start:i]))
			start = i + 1
		}
	}
	return args // (unclosed: what there is)
}

func isString(arg string) bool {
	return len(arg) >= 2 && (arg[0] == '\'' || arg[0] == '"') && arg[len(arg)-1] == arg[0]
}

// fieldArgs returns the arguments of a hash command's call (after the
// key) that name fields: every other one, from the first, for the
// commands that take pairs of a field and a value (HSET, HINCRBY, ...),
// else all of them (HGET, HMGET, HDEL, HEXISTS, ...).
func fieldArgs(cmd string, args []string) []string {
	switch cmd {
	case "HSET", "HMSET", "HSETNX", "HINCRBY", "HINCRBYFLOAT":
		var out []string
		for i := 0; i < len(args); i += 2 {
			out = append(out, args[i])
		}
		return out
	}
	return args
}

// bareFields returns the field names written in a script's code: a hash
// command's field argument that holds a string literal ('shape', or
// 'g' .. slot) rather than a name of fields.lua (field.shape,
// field.g .. slot). A field name is written once, in Go, and generated
// into fields.lua (see fields.lua's header). (A name a script builds
// before the call, as the rings' fields are, is seen where it is
// written: it uses field.x too.)
func bareFields(src string) []string {
	var out []string
	for _, c := range hashCalls(src) {
		for _, a := range fieldArgs(c.cmd, c.args) {
			if strings.ContainsAny(a, `'"`) {
				out = append(out, strconv.Itoa(c.line)+": "+a+"  in  "+c.cmd)
			}
		}
	}
	return out
}

// codeOf returns a script's code: each line's, without its comment and
// with its string literals blanked (see code).
func codeOf(src string) string {
	lines := strings.Split(src, "\n")
	for i := range lines {
		lines[i] = code(lines[i])
	}
	return strings.Join(lines, "\n")
}

// TestNoBareFieldNames: the scripts (and the Lua twins of internal/fair)
// name the fields of their hashes (field.x), written once in the Go
// (sharedfields.go at the module's root); a name written in a script
// would drift from the Go's unseen, and a misspelt one would read a field
// no script writes.
func TestNoBareFieldNames(t *testing.T) {
	calls := 0
	for f, src := range scriptFiles(t) {
		calls += len(hashCalls(src))
		for _, b := range bareFields(src) {
			t.Errorf("%s:%s", f, b)
		}
	}
	if calls == 0 {
		t.Error("no hash command found in the scripts: the scan sees nothing")
	}
}

// TestBareFieldsAreFound: the scan sees a string literal in a hash
// command's field arguments, over several lines too, and none in its
// values, in other commands, in comments or in strings.
func TestBareFieldsAreFound(t *testing.T) {
	for src, want := range map[string]int{
		"local x = redis.call('HGET', k, 'shape')":                                 1,
		"local x = redis.call(\"HGET\", k, \"shape\")":                             1,
		"redis.call('HMGET', k, field.shape, 'zat', \"zun\")":                      2,
		"redis.call('HSET', k, field.bud, string.format('%.17g', x), 'budu', '0')": 1,
		"redis.call('HSET', KEYS[1], field.zat, x,\n  'pn', y)":                    1,
		"redis.call('HGET', k, 'g' .. (slot % n))":                                 1,
		"redis.call('HGET', k, field.g .. (slot % n))":                             0,
		"redis.call('HINCRBY', k, 'rts', 1)":                                       1,
		"redis.call('HINCRBY', k, field.rts, 1)":                                   0,
		"redis.call('HDEL', k, unpack(gone, j, math.min(j + 9, #gone)))":           0,
		"redis.pcall('hexists', k, 'hist')":                                        1,
		"redis.call('HGETALL', k)":                                                 0,
		"redis.call('SET', k, 'a', 'PX', 5)":                                       0,
		"redis.call('ZADD', k, 'NX', 'CH', 1, 'm')":                                0,
		"-- redis.call('HGET', k, 'shape')":                                        0,
		"x = 1 -- redis.call('HGET', k, 'shape')":                                  0,
		"x = \"redis.call('HGET', k, 'shape')\"":                                   0,
		"x = tonumber(redis.call('HGET', k, field.hist) or '')":                    0,
	} {
		if got := len(bareFields(src)); got != want {
			t.Errorf("%q: %d bare field names %v, want %d", src, got, bareFields(src), want)
		}
	}
}

// TestFieldNamesResolve: every field.x a script reads is in fields.lua,
// as the name stored (x = 'x'), and every name there is read by some
// script: a misspelt name is nil in Lua, and a hash command given nil
// fails only when its branch runs; a name no script reads is dead.
func TestFieldNamesResolve(t *testing.T) {
	for name, value := range tableValues["field"] {
		if value != "'"+name+"'" {
			t.Errorf("fields.lua names %s as %s: a field's name in the scripts is its name in Redis", name, value)
		}
	}
	checkRefs(t, "field", codeOf)
}
