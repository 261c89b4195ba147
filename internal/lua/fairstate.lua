-- fairstate: a key's place in the fleet's priority order and tenants'
-- shares, kept in Redis for the reservation scripts (reserve.lua,
-- limits.lua), which follow it; the arithmetic is ask, shares_grant and
-- shares_prune (internal/fair's order.lua and shares.lua, which come
-- before). The order's state is four fields of the hash okey (o0c, o1c:
-- the credit of levels 0 and 1, us of work; o0u, o1u: until when each has
-- a request held back, us); the shares' are the hash skey, whole. Both
-- are read on first use and written back by save (of the shares, the
-- fields that changed), doubles at full precision. A request's decision
-- runs on a trial copy of the order's state, kept once the request is
-- held back or granted (a turn may still move after the decision: see
-- reserve.lua's spent budget).
local function fairState(okey, skey)
  local F = {}
  local ord, st, was, dirty = nil, nil, {}, false
  -- trial returns a copy of the order's state.
  function F.trial()
    if not ord then
      local f = redis.call('HMGET', okey, field.o0c, field.o1c, field.o0u, field.o1u)
      ord = {c = {tonumber(f[1]) or 0, tonumber(f[2]) or 0}, u = {tonumber(f[3]) or 0, tonumber(f[4]) or 0}}
    end
    return {c = {ord.c[1], ord.c[2]}, u = {ord.u[1], ord.u[2]}}
  end
  local function shares()
    if not st then
      st = {}
      local kv = redis.call('HGETALL', skey)
      for j = 1, #kv - 1, 2 do
        st[kv[j]] = tonumber(kv[j + 1])
        was[kv[j]] = st[kv[j]]
      end
    end
    return st
  end
  -- ask decides a request on trial (see ask); a request held back keeps
  -- it.
  function F.ask(trial, lv, tenant, work, at, horizon, share)
    local v, back = ask(trial, shares(), lv, tenant, work, at, now, horizon, share)
    if v == 2 then ord, dirty = trial, true end
    return v, back
  end
  -- grant keeps trial, the state of a request's decision, and grants it.
  function F.grant(trial, lv, tenant, weight, work)
    ord, dirty = trial, true
    shares_grant(shares(), lv, tenant, weight, work)
    shares_prune(st, now)
  end
  -- save writes the state back when a decision changed it.
  function F.save()
    if not dirty then return end
    redis.call('HSET', okey, field.o0c, string.format('%.17g', ord.c[1]), field.o1c, string.format('%.17g', ord.c[2]),
      field.o0u, string.format('%.17g', ord.u[1]), field.o1u, string.format('%.17g', ord.u[2]))
    if redis.call('PTTL', okey) < tune.ringLife / 1000 then redis.call('PEXPIRE', okey, tune.ringLife / 1000) end
    -- The fields changed, and those prune dropped: a call's writes are
    -- its own tenants', whatever the others.
    local kv, gone = {}, {}
    for f, x in pairs(st) do
      if was[f] ~= x then
        kv[#kv + 1] = f
        kv[#kv + 1] = string.format('%.17g', x)
      end
    end
    for f in pairs(was) do
      if st[f] == nil then gone[#gone + 1] = f end
    end
    for j = 1, #kv, 2 * tune.hsetFields do -- (unpack's stack is bounded)
      redis.call('HSET', skey, unpack(kv, j, math.min(j + 2 * tune.hsetFields - 1, #kv)))
    end
    for j = 1, #gone, tune.hsetFields do
      redis.call('HDEL', skey, unpack(gone, j, math.min(j + tune.hsetFields - 1, #gone)))
    end
    if #kv > 0 then redis.call('PEXPIRE', skey, tune.ringLife / 1000) end
  end
  return F
end
