package lua

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/egress-go/egress/internal/control"
	"github.com/stretchr/testify/assert"
)

// numberRE matches a Lua number literal that no name or other number
// touches: 12, 0.95, 1e6, .5.
var numberRE = regexp.MustCompile(`(^|[^A-Za-z0-9_.])((?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)`)

// code returns the code of a line of Lua: without its comment and with
// its string literals blanked (a format such as '%.0f' holds no number of
// the arithmetic).
func code(line string) string { return strip(line, true) }

// strip returns a line of Lua without its comment; blank leaves out what
// its string literals hold (their quotes stay).
func strip(line string, blank bool) string {
	var b strings.Builder
	var quote byte
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
				b.WriteByte(c)
				continue
			}
			if !blank {
				b.WriteByte(c)
			}
			if c == '\\' && i+1 < len(line) {
				i++
				if !blank {
					b.WriteByte(line[i])
				}
			}
			continue
		case c == '\'' || c == '"':
			quote = c
		case c == '-' && i+1 < len(line) && line[i+1] == '-':
			return b.String()
		}
		b.WriteByte(c)
	}
	return b.String()
}

// bareNumbers returns the tuning numbers written in a script's code:
// every fraction, and every integer of 100 or more but the conversions of
// units (1000 and 1000000: milliseconds and microseconds in a second).
// Integers under 100 are positions and small counts (ARGV[24], a step of
// 2). A tuning number is written once, in Go, and generated into
// tune.lua (see tune.lua's header).
func bareNumbers(src string) []string {
	var out []string
	for i, line := range strings.Split(src, "\n") {
		for _, m := range numberRE.FindAllStringSubmatch(code(line), -1) {
			lit := m[2]
			if !strings.ContainsAny(lit, ".eE") {
				if n, err := strconv.Atoi(lit); err == nil && (n < 100 || n == 1000 || n == 1000000) {
					continue
				}
			}
			out = append(out, strconv.Itoa(i+1)+": "+lit+"  in  "+strings.TrimSpace(line))
		}
	}
	return out
}

// TestNoBareTuningNumbers: the scripts (and the Lua twins of internal/fair)
// name their tuning numbers (tune.x),
// written once in the Go beside them; a number written in a script would
// drift from its Go twin unseen.
func TestNoBareTuningNumbers(t *testing.T) {
	for f, src := range scriptFiles(t) {
		if f == "tune.lua" {
			continue // generated: the numbers' one place in Lua
		}
		for _, b := range bareNumbers(src) {
			t.Errorf("%s:%s", f, b)
		}
	}
}

// scriptFiles returns the scripts of this package and their functions'
// twins in internal/fair, internal/control and internal/lease (which sit
// beside their Go twins there), by file.
func scriptFiles(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	var twins []string
	for _, dir := range []string{"../fair", "../control", "../lease"} {
		found, err := filepath.Glob(dir + "/*.lua")
		if err != nil || len(found) == 0 {
			t.Fatalf("no twins in %s: %v", dir, err)
		}
		twins = append(twins, found...)
	}
	out := map[string]string{}
	for _, f := range append(files, twins...) {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[f] = string(src)
	}
	return out
}

// TestBareNumbersAreFound: the scan sees numbers in code, and none in
// comments or strings.
func TestBareNumbersAreFound(t *testing.T) {
	for src, want := range map[string]int{
		"local x = 0.95 * y":                  1,
		"local w = math.min(16000000 / r, 1)": 1,
		"x = y * 1000000 + z / 1000":          0,
		"x = ARGV[24] + t[2]":                 0,
		"-- 0.95 under the rate":              0,
		"x = string.format('%.0f', y) -- 0.5": 0,
		"x = tune.aimUnder * y":               0,
		"x = 1e6":                             1,
		"x = a250000":                         0,
	} {
		if got := len(bareNumbers(src)); got != want {
			t.Errorf("%q: %d bare numbers, want %d", src, got, want)
		}
	}
}

// TestTuneNamesResolve: every tune.x a script reads is in tune.lua, and
// every number there is read (a misspelt name is nil in Lua, found only
// when its branch runs).
func TestTuneNamesResolve(t *testing.T) {
	checkRefs(t, "tune", func(src string) string { return src })
}

// checkRefs holds the scripts' references to table (tune or field), in
// the code that code leaves of each, to its entries: each one read is
// defined, each one defined is read, and the scripts it does not precede
// (see lua.go) read none.
func checkRefs(t *testing.T, table string, code func(string) string) {
	t.Helper()
	defined := tableValues[table]
	if len(defined) == 0 {
		t.Fatalf("%s's table defines nothing", table)
	}
	ref := regexp.MustCompile(`\b` + table + `\.(\w+)`)
	used := map[string]bool{}
	for name, src := range map[string]string{"rate.lua": rate, "reserve.lua": reserve, "control.lua": control.Lua, "limits.lua": limits, "fairstate.lua": fairstate} {
		for _, m := range ref.FindAllStringSubmatch(code(src), -1) {
			used[m[1]] = true
			if _, ok := defined[m[1]]; !ok {
				t.Errorf("%s reads %s.%s, which its table does not define", name, table, m[1])
			}
		}
	}
	for name := range defined {
		if !used[name] {
			t.Errorf("%s.%s is read by no script", table, name)
		}
	}
	for name, src := range map[string]string{"heartbeat.lua": heartbeat, "slots.lua": slots} {
		if strings.Contains(code(src), table+".") {
			t.Errorf("%s reads %s, which does not precede it (see lua.go)", name, table)
		}
	}
}

// TestScriptsAreInlined: the scripts a limiter runs hold no tune.<name>
// or field.<name> and no tables: each is written as its value, a number
// in parentheses.
func TestScriptsAreInlined(t *testing.T) {
	for name, s := range map[string]string{"Reserve": Reserve, "Control": Control, "Limits": Limits} {
		assert.Empty(t, tableRef.FindAllString(s, -1), "%s: a reference left", name)
		assert.NotContains(t, s, "local tune =", name)
		assert.NotContains(t, s, "local field =", name)
	}
	assert.Equal(t, "x -(0.95) .. 'wmax' .. tune.nameless", inline("x -tune.aimUnder .. field.wmax .. tune.nameless"))
	assert.Len(t, tableValues["tune"], strings.Count(tune, " = ")-1, "every entry of tune.lua read (and its table)")
	assert.Len(t, tableValues["field"], strings.Count(fields, " = ")-1, "every entry of fields.lua read")
}
