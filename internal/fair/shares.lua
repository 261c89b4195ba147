-- shares: Shares of internal/fair/shares.go, restated: the tenants' fair
-- shares within each level of a key, across the fleet. st is the state's
-- fields as a table (the Redis hash: "v<level>", "f<level>:<tenant>",
-- "u<level>:<tenant>"), numbers as in the Go; each function is its Go
-- twin's, and the two agree exactly (TestSharesLuaMatchesGo).
local function shares_arrive(st, lv, tenant, now)
  local u, f = 'u' .. lv .. ':' .. tenant, 'f' .. lv .. ':' .. tenant
  if (st[u] or 0) <= now then
    st[u] = nil
    st[f] = math.max(st[f] or 0, st['v' .. lv] or 0)
  end
end

local function shares_behind(st, lv, tenant, now, quantum)
  local mine = st['f' .. lv .. ':' .. tenant] or 0
  local prefix = 'u' .. lv .. ':'
  for f, untl in pairs(st) do
    if string.sub(f, 1, #prefix) == prefix and untl > now then
      local other = string.sub(f, #prefix + 1)
      if other ~= tenant and (st['f' .. lv .. ':' .. other] or 0) + quantum < mine then
        return true
      end
    end
  end
  return false
end

local function shares_wait(st, lv, tenant, untl)
  local u = 'u' .. lv .. ':' .. tenant
  st[u] = math.max(st[u] or 0, untl)
end

local function shares_grant(st, lv, tenant, weight, work)
  local f = 'f' .. lv .. ':' .. tenant
  local tag = st[f] or 0
  st['v' .. lv] = math.max(st['v' .. lv] or 0, tag)
  st[f] = tag + work / weight
end

local function shares_prune(st, now)
  local drop = {}
  for f, tag in pairs(st) do
    if string.sub(f, 1, 1) == 'f' then
      local lv, tenant = string.match(f, '^f(%d+):(.*)$')
      if (st['u' .. lv .. ':' .. tenant] or 0) <= now then
        drop[#drop + 1] = 'u' .. lv .. ':' .. tenant
        if tag <= (st['v' .. lv] or 0) then drop[#drop + 1] = f end
      end
    end
  end
  for _, f in ipairs(drop) do st[f] = nil end
end

-- ask: Ask of shares.go, on the order's state ord (see order.lua) and the
-- shares' st.
local function ask(ord, st, lv, tenant, work, at, now, horizon, share)
  if share <= 0 then
    return order(ord, lv, work, at, now, horizon, share)
  end
  shares_arrive(st, lv, tenant, now)
  if shares_behind(st, lv, tenant, now, horizon) then
    shares_wait(st, lv, tenant, now + 2 * horizon)
    return 2, now + horizon
  end
  local v, back = order(ord, lv, work, at, now, horizon, share)
  if v == 2 then
    shares_wait(st, lv, tenant, back + horizon)
  else
    shares_wait(st, lv, tenant, at + horizon)
  end
  return v, back
end
