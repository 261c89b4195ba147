package fair

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/egress-go/egress/internal/redistest"
)

// TestOrderLuaMatchesGo: order.lua and Order.Decide, run on a real
// redis-server through EVAL on the same random schedules (levels, works,
// turns, times, horizons and shares), give the same verdicts, times and
// state, to the last bit of every double.
func TestOrderLuaMatchesGo(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	rng := rand.New(rand.NewPCG(5, 6))
	for run := range 40 {
		horizon := float64(rng.IntN(50_000))
		share := []float64{0, 0.1, 0.25, 0.5, 1.0 / 3}[rng.IntN(5)]
		var o Order
		var calls, want []string
		now := 1.7e15 + float64(rng.IntN(1e6))
		for range 60 {
			now += float64(rng.IntN(30_000))
			lv := rng.IntN(4) - 1 // -1 to 2
			work := float64(rng.IntN(40_000)) + rng.Float64()
			at := now + float64(rng.IntN(200_000))
			calls = append(calls, fmt.Sprintf("{%d, %.17g, %.17g, %.17g}", lv, work, at, now))
			v, back := o.Decide(lv, work, at, now, horizon, share)
			for _, x := range []float64{float64(v), back, o.Credit[0], o.Credit[1], o.Until[0], o.Until[1]} {
				want = append(want, strconv.FormatFloat(x, 'g', 17, 64))
			}
		}
		script := OrderLua + fmt.Sprintf(`
local st = {c = {0, 0}, u = {0, 0}}
local out = {}
for _, c in ipairs({%s}) do
  local v, back = order(st, c[1], c[2], c[3], c[4], %.17g, %.17g)
  for _, x in ipairs({v, back, st.c[1], st.c[2], st.u[1], st.u[2]}) do
    out[#out + 1] = string.format('%%.17g', x)
  end
end
return out`, strings.Join(calls, ", "), horizon, share)
		reply, err := rdb.Eval(t.Context(), script, nil).StringSlice()
		require.NoError(t, err)
		require.Len(t, reply, len(want))
		for i := range want {
			// %.17g in Lua and 'g' 17 in Go spell a double alike but for
			// the exponent's form; parse both to compare the bits.
			g, err := strconv.ParseFloat(reply[i], 64)
			require.NoError(t, err)
			w, _ := strconv.ParseFloat(want[i], 64)
			require.Equal(t, w, g, "run %d, step %d, value %d (verdict, back, credits, untils)", run, i/6, i%6)
		}
	}
}

// TestSharesLuaMatchesGo: shares.lua's ask, grant and prune, with the
// order's state, run on a real redis-server as the reservation script
// runs them, and Ask, Shares.Grant and Shares.Prune on the same random
// schedules of tenants, levels, works and times: the same verdicts and the
// same state, field by field, to the last bit.
func TestSharesLuaMatchesGo(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	rng := rand.New(rand.NewPCG(7, 8))
	tenants := []string{"", "a", "b:c", "d", "é"}
	for run := range 30 {
		horizon := float64(1 + rng.IntN(30_000))
		share := []float64{0, 0.1, 0.5}[rng.IntN(3)]
		var o Order
		s := Shares{}
		var calls []string
		var want [][]string
		now := 1.7e15 + float64(rng.IntN(1e6))
		for range 80 {
			now += float64(rng.IntN(15_000))
			lv := rng.IntN(3)
			tenant := tenants[rng.IntN(len(tenants))]
			weight := []float64{1, 2, 0.5}[rng.IntN(3)]
			work := float64(1+rng.IntN(20_000)) + rng.Float64()
			at := now + float64(rng.IntN(100_000))
			calls = append(calls, fmt.Sprintf("{%d, %q, %.17g, %.17g, %.17g, %.17g}", lv, tenant, weight, work, at, now))
			trial := o
			v, back := Ask(&trial, s, lv, tenant, work, at, now, horizon, share)
			o = trial
			if v != Later {
				s.Grant(lv, tenant, weight, work)
				s.Prune(now)
			}
			step := []string{fmt.Sprintf("%d", v), strconv.FormatFloat(back, 'g', 17, 64)}
			for _, x := range []float64{o.Credit[0], o.Credit[1], o.Until[0], o.Until[1]} {
				step = append(step, strconv.FormatFloat(x, 'g', 17, 64))
			}
			keys := slices.Sorted(maps.Keys(s))
			for _, k := range keys {
				step = append(step, k+"="+strconv.FormatFloat(s[k], 'g', 17, 64))
			}
			want = append(want, step)
		}
		script := OrderLua + SharesLua + fmt.Sprintf(`
local ord = {c = {0, 0}, u = {0, 0}}
local st = {}
local out = {}
for _, c in ipairs({%s}) do
  local v, back = ask(ord, st, c[1], c[2], c[4], c[5], c[6], %.17g, %.17g)
  if v ~= 2 then
    shares_grant(st, c[1], c[2], c[3], c[4])
    shares_prune(st, c[6])
  end
  local step = {tostring(v), string.format('%%.17g', back)}
  for _, x in ipairs({ord.c[1], ord.c[2], ord.u[1], ord.u[2]}) do
    step[#step + 1] = string.format('%%.17g', x)
  end
  local keys = {}
  for k in pairs(st) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do step[#step + 1] = k .. '=' .. string.format('%%.17g', st[k]) end
  out[#out + 1] = table.concat(step, ' ')
end
return out`, strings.Join(calls, ", "), horizon, share)
		reply, err := rdb.Eval(t.Context(), script, nil).StringSlice()
		require.NoError(t, err)
		require.Len(t, reply, len(want))
		for i, step := range want {
			got := strings.Split(reply[i], " ")
			require.Len(t, got, len(step), "run %d, step %d: %v against %v", run, i, got, step)
			for j := range step {
				require.Equal(t, parseField(t, step[j]), parseField(t, got[j]), "run %d, step %d, value %d", run, i, j)
			}
		}
	}
}

// parseField parses "name=number" or "number" to its name and the number.
func parseField(t *testing.T, s string) string {
	t.Helper()
	name, num, ok := strings.Cut(s, "=")
	if !ok {
		name, num = "", s
	}
	x, err := strconv.ParseFloat(num, 64)
	require.NoError(t, err, "%q", s)
	return name + "=" + strconv.FormatFloat(x, 'b', -1, 64)
}
