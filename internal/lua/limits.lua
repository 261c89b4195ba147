-- limits: one atomic decision across every limit of a SharedLimits for one
-- request key, on the Redis server's clock (follows now.lua and
-- publish.lua): a batch of reservations, a settlement, or what a response
-- taught (a hold and caps).
-- The arithmetic is Limits' (limits.go, window.go): a bucket is a
-- theoretical arrival time (GCRA), a window an exact log of grants.
--
-- KEYS[1]        the request key's hold: no turn before this server time (us)
-- KEYS[2i], KEYS[2i+1]  limit i's state: a hash (a bucket's tat and last
--                turn given, a window's sum and sequence), and a window's
--                grants: a sorted set, one member a grant, scored by its
--                turn (us): "<grant id>:<cost>" for a reservation (the same
--                id in every window it takes from), "k<seq>:<cost>" for a
--                charge or a cap; unused by a bucket
-- KEYS[2L+2]     the grant ids' counter of the key's hash tag
-- KEYS[2L+3], KEYS[2L+4]  the request key's place in the fleet's priority
--                order and its tenants' shares (see fairstate.lua); given
--                only to a reservation with a horizon
-- ARGV[1]  the operation: reserve, settle, learn or window
-- ARGV[2]  L, the number of limits
-- ARGV[4i-1], ARGV[4i], ARGV[4i+1], ARGV[4i+2]  limit i's four values (i
--          from 1 to L): its kind (0 a bucket, 1 a window), n (a bucket's
--          burst, a window's quota), a bucket's interval per unit or a
--          window's length with its margin (us), and a bucket's margin
--          (us: the refill it keeps in reserve; 0 for a window)
-- then the operation's own arguments, from ARGV[o+1], where o = 2+4L:
-- reserve:
-- ARGV[o+1]  the horizon of the fleet's priority order (us; 0 when no
--          request of the call is ordered)
--          then a request after another, served in order, r being the
--          index before the request's first value:
-- ARGV[r+i]  its cost in limit i
-- ARGV[r+L+1]  its max wait (us; -1 for none)
-- ARGV[r+L+2], ARGV[r+L+3], ARGV[r+L+4], ARGV[r+L+5], ARGV[r+L+6]  only
--          with a horizon: its priority level (0 low, 1 normal, 2 high;
--          -1 for none), the share of a level held back (0: no order, no
--          shares), its tenant, the tenant's weight and its work (us of
--          the limit that it takes the most of)
--          Returns now (us), then four values a request: code (0 =
--          admitted after wait, 1 = refused: wait exceeds its max wait,
--          2 = held back by the fleet's order or shares: to come back
--          after wait), wait (us), its turn (us of server time) or,
--          refused, the limit that bound (1-based, 0 for the hold), and
--          its grant id (0 when refused or held). A refused or held
--          request takes nothing.
-- settle:
-- ARGV[o+1]  the grant's turn (us)
-- ARGV[o+2i], ARGV[o+2i+1]  limit i's pair: the cost granted, and the
--          actual cost, at most n
-- ARGV[o+2L+2]  whether to replan (1 or 0: every limit a window, none a
--          parent's)
-- ARGV[o+2L+3], ARGV[o+2L+4]  the key's channel (publish.lua) and its id to tell moved
--          turns on
--          When a window gives room back and replan is 1, the grants
--          whose turns are still to come are given their turns again, in
--          order (never later), and the moves are told: "<key id> m <now>
--          <grant id>:<turn> ...". Returns 0.
-- learn:
-- ARGV[o+1]  the hold's length from now (us; 0 for none)
-- ARGV[o+2], ARGV[o+3]  the key's channel and its id to tell a hold on
-- ARGV[o+3i+1], ARGV[o+3i+2], ARGV[o+3i+3]  limit i's triple: the units
--          the provider said remain, -1 when it said nothing of the
--          limit's dimension; its reset in us, -1 for none; 1 when its
--          reset means "until the bucket is full", else 0
--          Returns 0.
-- window:
-- ARGV[o+1]  a window limit i (1-based)
-- ARGV[o+2]  the most grants to return
--          Returns now (us), then its grants still in the window as
--          (turn, cost) pairs in the order of their turns (none when
--          there are more than the most). Changes nothing.
local L = tonumber(ARGV[2])
local kind, n, span, margin = {}, {}, {}, {}
for i = 1, L do
  kind[i] = tonumber(ARGV[4 * i - 1])
  n[i] = tonumber(ARGV[4 * i])
  span[i] = tonumber(ARGV[4 * i + 1])
  margin[i] = tonumber(ARGV[4 * i + 2])
end
local o = 2 + 4 * L -- the last of the limits' values: the operation's arguments follow

-- The state of each limit, loaded on first use and written back at the end.
local st = {}
local function state(i)
  if st[i] then return st[i] end
  local h = redis.call('HMGET', KEYS[2 * i], field.a, field.b)
  local s = {a = tonumber(h[1] or '0') or 0, b = tonumber(h[2] or '0') or 0, dirty = false}
  -- a bucket: a = tat, b = the last turn given; a window: a = sum, b = seq
  if kind[i] == 1 then
    -- Drop the grants that left the window (turn + w ≤ now).
    local gone = redis.call('ZRANGEBYSCORE', KEYS[2 * i + 1], '-inf', now - span[i])
    if #gone > 0 then
      for _, m in ipairs(gone) do
        s.a = s.a - (tonumber(string.match(m, ':(%d+)$')) or 0)
      end
      redis.call('ZREMRANGEBYSCORE', KEYS[2 * i + 1], '-inf', now - span[i])
      s.dirty = true
    end
    if s.a < 0 or redis.call('ZCARD', KEYS[2 * i + 1]) == 0 then s.a = 0 end
  end
  st[i] = s
  return s
end

local function costOf(m) return tonumber(string.match(m, ':(%d+)$')) or 0 end

-- earliest returns the first turn at or after from at which limit i can
-- grant c (≤ n): a bucket when max(tat, t) + c·I − t ≤ n·I less its margin
-- (as far as n − c allows: limitState.earliest); a window at or after
-- every turn given before, when the grants in (t − w, t] and c are at
-- most n.
local function earliest(i, c, from)
  local s = state(i)
  if kind[i] == 0 then
    return math.max(from, s.a - math.max((n[i] - c) * span[i] - margin[i], 0))
  end
  local z, w = KEYS[2 * i + 1], span[i]
  local at = from
  local last = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
  if #last > 0 then at = math.max(at, tonumber(last[2])) end
  local sum = s.a
  if sum + c <= n[i] then return at end
  -- Walk the grants from the oldest: those out of (at − w, at] do not
  -- count; then drop the oldest until c fits, and go when the last one
  -- dropped leaves the window.
  local off, page, leave = 0, 64, nil
  while true do
    local ms = redis.call('ZRANGE', z, off, off + page - 1, 'WITHSCORES')
    if #ms == 0 then break end
    for j = 1, #ms, 2 do
      local score = tonumber(ms[j + 1])
      if score + w <= at then
        sum = sum - costOf(ms[j])
      elseif sum + c > n[i] then
        sum = sum - costOf(ms[j])
        leave = score + w
      end
      if score + w > at and sum + c <= n[i] then
        if leave then return math.max(at, leave) end
        return at
      end
    end
    off = off + page
  end
  if leave then return math.max(at, leave) end
  return at
end

-- take grants c at turn at of limit i, as grant gid (nil: a charge or a
-- cap, named by the window's sequence).
local function take(i, c, at, gid)
  local s = state(i)
  s.dirty = true
  if kind[i] == 0 then
    s.a = math.max(s.a, at) + c * span[i]
    s.b = math.max(s.b, at)
    return
  end
  s.b = s.b + 1
  s.a = s.a + c
  redis.call('ZADD', KEYS[2 * i + 1], at, (gid or ('k' .. s.b)) .. ':' .. c)
end

-- insert records a grant of c at turn at of window i (a charge after the
-- fact, at a turn that may come before later ones).
local function insert(i, c, at)
  if c <= 0 then return end
  take(i, c, at)
end

-- save writes back each state changed, with a TTL that outlives it.
local function save()
  for i, s in pairs(st) do
    if s.dirty then
      if kind[i] == 0 then
        local ttl = math.ceil((s.a - now) / 1000) + 1000
        -- tat rounded up to the microsecond: never a turn early
        redis.call('HSET', KEYS[2 * i], field.a, string.format('%.0f', math.ceil(s.a)),
          field.b, string.format('%.0f', s.b))
        redis.call('PEXPIRE', KEYS[2 * i], math.max(ttl, 1000))
      else
        local last = redis.call('ZRANGE', KEYS[2 * i + 1], -1, -1, 'WITHSCORES')
        local ttl = 1000
        if #last > 0 then ttl = math.max(ttl, math.ceil((tonumber(last[2]) + span[i] - now) / 1000) + 1000) end
        redis.call('HSET', KEYS[2 * i], field.a, s.a, field.b, s.b)
        redis.call('PEXPIRE', KEYS[2 * i], ttl)
        redis.call('PEXPIRE', KEYS[2 * i + 1], ttl)
      end
    end
  end
end

local op = ARGV[1]
local hold = tonumber(redis.call('GET', KEYS[1]) or '0') or 0

if op == 'window' then
  -- Window i's grants still in it, read for a plan (sharedlimits_expect.go):
  -- now, then a (turn, cost) pair a grant, in the order of their turns;
  -- now alone when there are more than the most asked for.
  local i, most = tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2])
  local z, from = KEYS[2 * i + 1], '(' .. string.format('%.0f', now - span[i])
  local out = {now}
  if redis.call('ZCOUNT', z, from, '+inf') > most then return out end
  local ms = redis.call('ZRANGEBYSCORE', z, from, '+inf', 'WITHSCORES')
  for j = 1, #ms, 2 do
    out[#out + 1] = math.ceil(tonumber(ms[j + 1]))
    out[#out + 1] = costOf(ms[j])
  end
  return out
end

if op == 'reserve' then
  local out = {now}
  local horizon = tonumber(ARGV[o + 1])
  local r, extra, fair = o + 1, 0, nil -- r: the index before a request's first value
  if horizon > 0 then extra, fair = 5, fairState(KEYS[2 * L + 3], KEYS[2 * L + 4]) end
  local GID = KEYS[2 * L + 2]
  while r + L + 1 + extra <= #ARGV - 1 do
    local at, binding = math.max(now, hold), 0
    for i = 1, L do
      local c = tonumber(ARGV[r + i])
      if c > 0 then
        local e = earliest(i, c, now)
        if e > at then at, binding = e, i end
      end
    end
    at = math.ceil(at) -- whole microseconds: a settlement finds the turn by it
    local maxWait = tonumber(ARGV[r + L + 1])
    local level, share, tenant, weight, work = -1, 0, '', 1, 0
    if fair then
      level, share, tenant = tonumber(ARGV[r + L + 2]), tonumber(ARGV[r + L + 3]), ARGV[r + L + 4]
      weight, work = tonumber(ARGV[r + L + 5]), tonumber(ARGV[r + L + 6])
    end
    local wait = math.ceil(at - now)
    local trial, v, back = nil, 0, 0
    if not (maxWait >= 0 and wait > maxWait) and share > 0 then
      trial = fair.trial()
      v, back = fair.ask(trial, level, tenant, work, at, horizon, share)
    end
    if maxWait >= 0 and wait > maxWait then
      table.insert(out, 1)
      table.insert(out, wait)
      table.insert(out, binding)
      table.insert(out, 0)
    elseif v == 2 then
      table.insert(out, 2)
      table.insert(out, math.ceil(back - now))
      table.insert(out, 0)
      table.insert(out, 0)
    else
      if trial then fair.grant(trial, level, tenant, weight, work) end
      local gid = redis.call('INCR', GID)
      for i = 1, L do
        local c = tonumber(ARGV[r + i])
        if c > 0 then take(i, c, at, gid) end
      end
      table.insert(out, 0)
      table.insert(out, wait)
      table.insert(out, at)
      table.insert(out, gid)
    end
    r = r + L + 1 + extra
  end
  redis.call('PEXPIRE', GID, tune.grantIDLife / 1000) -- a day after the last grant
  save()
  if fair then fair.save() end
  return out
end

-- replan gives the grants of the windows whose turns are still to come
-- their turns again, in the order of their turns (then of their ids), and
-- returns the moves: Limits.replan's arithmetic. Turns given back (cost 0)
-- are dropped.
local function replan()
  local grants, byId = {}, {}
  for i = 1, L do
    local z = KEYS[2 * i + 1]
    local ms = redis.call('ZRANGEBYSCORE', z, '(' .. string.format('%.0f', now), '+inf', 'WITHSCORES')
    for j = 1, #ms, 2 do
      local id, c = string.match(ms[j], '^(%d+):(%d+)$')
      if id then
        local g = byId[id]
        if not g then
          g = {id = tonumber(id), turn = tonumber(ms[j + 1]), costs = {}}
          byId[id] = g
          table.insert(grants, g)
        end
        g.costs[i] = tonumber(c)
        redis.call('ZREM', z, ms[j])
        local s = state(i)
        s.a, s.dirty = s.a - tonumber(c), true
      end
    end
  end
  table.sort(grants, function(a, b)
    if a.turn ~= b.turn then return a.turn < b.turn end
    return a.id < b.id
  end)
  local moved = {}
  for _, g in ipairs(grants) do
    local any = false
    for i = 1, L do
      if (g.costs[i] or 0) > 0 then any = true end
    end
    if any then
      local at = math.max(now, hold)
      for i = 1, L do
        local c = g.costs[i] or 0
        if c > 0 then at = math.max(at, earliest(i, c, now)) end
      end
      at = math.min(math.ceil(at), g.turn) -- never later than its turn
      for i = 1, L do
        local c = g.costs[i] or 0
        if c > 0 then
          local s = state(i)
          s.a, s.dirty = s.a + c, true
          redis.call('ZADD', KEYS[2 * i + 1], at, g.id .. ':' .. c)
        end
      end
      if at ~= g.turn then
        table.insert(moved, string.format('%d:%.0f', g.id, at))
      end
    end
  end
  return moved
end

if op == 'settle' then
  local turn = tonumber(ARGV[o + 1])
  local refunded = false
  for i = 1, L do
    local from, to = tonumber(ARGV[o + 2 * i]), tonumber(ARGV[o + 2 * i + 1])
    if from ~= to then
      local s = state(i)
      if kind[i] == 0 then
        if to > from then
          -- Charged as a grant of the difference now.
          take(i, to - from, now)
        elseif s.b >= turn then
          -- A refund, less what the turns given after the grant took.
          local back = math.floor((from - to) * span[i] - (s.b - turn))
          if back > 0 then
            s.a = math.max(s.a - back, now)
            s.dirty = true
          end
        end
      else
        local z, found = KEYS[2 * i + 1], false
        if from > 0 then
          for _, m in ipairs(redis.call('ZRANGEBYSCORE', z, turn, turn)) do
            if costOf(m) == from then
              -- Kept in place, even at 0 once its turn has come: the turns
              -- after it were given after it, and each turn comes after
              -- every turn before it. A turn still to come given back to 0
              -- goes (replan gives the turns after it again).
              redis.call('ZREM', z, m)
              if to > 0 or turn <= now then
                redis.call('ZADD', z, turn, string.match(m, '^([^:]+):') .. ':' .. to)
              end
              s.a = s.a + to - from
              s.dirty, found = true, true
              if to < from then refunded = true end
              break
            end
          end
        end
        if not found and to > from then
          if turn + span[i] > now and from == 0 then
            insert(i, to, turn)
          else
            -- Its turn has left the window: the difference counts from now.
            insert(i, to - from, now)
          end
        end
      end
    end
  end
  if refunded and tonumber(ARGV[o + 2 * L + 2]) == 1 then
    local moved = replan()
    if #moved > 0 then
      publish(ARGV[o + 2 * L + 3], ARGV[o + 2 * L + 4] .. ' m ' .. string.format('%.0f', now) .. ' ' .. table.concat(moved, ' '))
    end
  end
  save()
  return 0
end

if op == 'learn' then
  local holdFor = tonumber(ARGV[o + 1])
  if holdFor > 0 and now + holdFor > hold then
    redis.call('SET', KEYS[1], string.format('%.0f', now + holdFor), 'PX', math.ceil(holdFor / 1000) + 1000)
    publish(ARGV[o + 2], ARGV[o + 3] .. ' ' .. string.format('%.0f', holdFor))
  end
  for i = 1, L do
    local keep = tonumber(ARGV[o + 3 * i + 1])
    local reset = tonumber(ARGV[o + 3 * i + 2])
    local bucketProvider = tonumber(ARGV[o + 3 * i + 3]) == 1
    if keep >= 0 and keep < n[i] then
      local s = state(i)
      if kind[i] == 0 then
        s.a = math.max(s.a, now + (n[i] - math.floor(keep)) * span[i])
        s.dirty = true
      else
        local w = span[i]
        if reset < 0 or reset > w then reset = w end
        local held = s.a
        if not bucketProvider then
          held = 0
          for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2 * i + 1], '(' .. string.format('%.0f', now + reset - w), '+inf')) do
            held = held + costOf(m)
          end
        end
        local excess = n[i] - held - math.ceil(keep)
        if excess > 0 then
          local parts = 1
          if bucketProvider then parts = math.min(8, excess) end
          for p = 1, parts do
            local c = math.floor(excess * p / parts) - math.floor(excess * (p - 1) / parts)
            insert(i, c, now + math.floor(reset * p / parts) - w)
          end
        end
      end
    end
  end
  save()
  return 0
end

return redis.error_reply('egress: limits: unknown operation ' .. tostring(op))
