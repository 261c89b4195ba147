-- order: Order.Decide of internal/fair/order.go, restated. Its state is a
-- table {c = {credit of level 0, of level 1}, u = {until of level 0, of
-- level 1}}, which order updates; levels count from 0 as in the Go, the
-- tables from 1. Returns the verdict (0 go, 1 by credit, 2 later) and, for
-- later, when to come back. Every number is a double, as in the Go, and
-- the two agree exactly (TestOrderLuaMatchesGo).
local function order(st, lv, work, at, now, horizon, share)
  for l = 1, 2 do
    if st.u[l] <= now then
      st.c[l], st.u[l] = 0, 0
    end
  end
  if share <= 0 then return 0, 0 end
  local v = 0
  local i = lv + 1
  if lv >= 0 and lv < 2 and at > now + horizon then
    if st.u[i] == 0 or st.c[i] + 1 < work then
      st.u[i] = math.max(st.u[i], at + horizon)
      return 2, at - horizon
    end
    v = 1
    st.c[i] = math.max(st.c[i] - work, 0)
    st.u[i] = math.max(st.u[i], at + horizon)
  end
  for l = 1, 2 do
    if st.u[l] ~= 0 and (l ~= i or v == 1) then
      st.c[l] = st.c[l] + share * work
    end
  end
  return v, 0
end
