package fair

import (
	"fmt"
	"math/rand/v2"
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
