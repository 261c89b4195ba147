-- reserve: one atomic decision for a batch of requests on one key, on the
-- Redis server's clock (follows rate.lua). It is a token bucket kept as a
-- theoretical arrival time (GCRA): the bucket is full again at tat.
--
-- KEYS[1]  the bucket's tat, in microseconds of server time
-- KEYS[2]  the key's pause: no admission before this server time (us)
-- KEYS[3]  the key's learnt limit (see rate.lua)
-- KEYS[4]  the pacer's queue: a sorted set of the turns given and not yet
--          come, one member a grant ("<turn>:<cost>"), scored by its
--          turn's time (us); unused by the token bucket
-- KEYS[5]  the tenants' shares (see shares, in internal/fair/shares.lua):
--          a hash of its fields; given only with a horizon (ARGV[19])
-- ARGV[1]  the configured rate, units per second
-- ARGV[2]  the usable burst in cost units (the burst less the jitter
--          margin; a larger cost waits for the rest); 0 makes a pacer (each request's own cost is
--          its burst: releases spaced cost/rate apart, never a burst)
-- ARGV[3]  queue depth in cost units: a request that would wait for its
--          turn, behind depth units whose turns come after the end of the
--          key's hold (now, when it has none), is refused as "queue full";
--          -1 for none
-- ARGV[4], ARGV[5], ARGV[6]  discovery: on (1) or off (0), C and floor
--          (units per second)
-- ARGV[7]  a report to apply first (see report in rate.lua; a bucket's
--          drains the fleet's, see drain): the provider's remaining;
--          -1 for none
-- ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12]  its reset (us), its
--          reset over its limit (us; 0 for none), how long ago its request
--          was sent (us; -1 when unknown), the fleet's requests in flight as
--          estimated without the ring, what its reset means (the dialect's
--          word: 0 unknown, 1 a window, 2 a bucket)
-- ARGV[13], ARGV[14]  its limit (-1 when it states none), and the
--          resolution its reset was read to (us; see resolution)
-- ARGV[15] how long a spent budget holds a key of unknown shape (us)
-- ARGV[16], ARGV[17]  the key's channel (publish.lua), on which holds
--          and lowerings are told, and the key's id (a spent budget's
--          hold is not told, see below;
--          a change that moves the turns given is, see retime in rate.lua)
-- ARGV[18] how long ago the report's response was read (us; -1 for none)
-- ARGV[19] the horizon of the fleet's priority order (us; see order, in
--          internal/fair/order.lua); 0 when no request of the call is
--          ordered, and each request's group is then its first two values
-- ARGV[20] the most the bucket holds as of this call, in cost units:
--          ARGV[2], less a process's start margin in its first second (see
--          startMargin in sharedbatch.go). The units it keeps back are not
--          a smaller burst but room the bucket does not have: they come
--          back as it refills, never as turns among those already given
--          (below)
-- ARGV[21], ARGV[22], ARGV[23], ARGV[24], ARGV[25], ARGV[26], ...  one
--          group a request, served in order: its cost, its max wait in us
--          (-1 for none), its priority level (0 low, 1 normal, 2 high; -1
--          for none), the share of a level held back (0: no order, no
--          shares), its tenant and the tenant's weight
--
-- Returns a flat array: the pause left in us (0 when none), the key's rate
-- in units per second (a string, at full precision), how many changes of
-- the rate have moved the turns given (see retime in rate.lua: the turns
-- given now move with the later ones only), then a pair a request: (code, wait in
-- us), code 0 = admitted after wait, 1 = refused because wait exceeds its
-- max wait, 2 = refused because the queue is full, 3 = admitted after wait,
-- a probe (see above), 4 = held back by the fleet's priority order: not
-- admitted, to come back after wait. A refused or held request takes
-- nothing.
--
-- The order's state is the key's learnt-limit hash's fields o0c, o1c (the
-- credit of levels 0 and 1, us of work) and o0u, o1u (until when each has
-- a request held back, us), doubles at full precision.
local rate = effective(KEYS[3], now, tonumber(ARGV[1]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]))
local interval = 1000000 / rate
local burst = tonumber(ARGV[2])
-- The units a start margin keeps back: the bucket holds at most burst
-- less them as of a request's earliest turn. (Taken as a smaller burst,
-- they came back at the end of a process's first second as six turns
-- among those given before, 1.2 s ahead, at 256 instances: a burst the
-- provider, behind the fleet by its first requests' late arrival, had
-- not the units for.)
local kept = math.max(burst - tonumber(ARGV[20]), 0)
local tat = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local pause = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
-- The probes after a hold that a throttle without counts set (storm in
-- internal/control; ph, pk and pg in its control.lua): the first pk turns
-- granted from the hold's end (pc counts them) are told as probes, and each
-- but the last puts the next a gap (pg) after it (pn). Not a hold: nothing
-- is told on the channel, and the reply's pause leaves it out.
local pst = redis.call('HMGET', KEYS[3], field.ph, field.pk, field.pc, field.pg, field.pn)
local ph, pk, pc, pg = tonumber(pst[1]), tonumber(pst[2]), tonumber(pst[3]) or 0, tonumber(pst[4])
local pn = tonumber(pst[5]) or 0
local start = math.max(now, pause, pn)
-- The pacer's queue counts the units waiting, not the time their turns
-- span: turns given at a lower rate than today's, or spread out by holds,
-- are as many requests as they were when given. The units whose turns
-- fall inside a hold are not counted: their waiters take new turns after
-- it (see shared.Wait), and a hold alone never makes the queue full.
local depth = tonumber(ARGV[3])
local function waiting(from)
  local n = 0
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. string.format('%.3f', from), '+inf')) do
    n = n + (tonumber(string.match(m, ':([%d.]+)$')) or 0)
  end
  return n
end
local queued = 0
if depth >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', string.format('%.3f', now))
  queued = waiting(start)
end
local changed = false
local reported = tonumber(ARGV[7]) >= 0
if reported then
  local sent = -1
  if tonumber(ARGV[10]) >= 0 then sent = now - tonumber(ARGV[10]) end
  local read = now
  if tonumber(ARGV[18]) >= 0 then read = now - tonumber(ARGV[18]) end
  local keep, left = report(KEYS[3], now, tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]), sent,
    tonumber(ARGV[11]), tat, tonumber(ARGV[12]), tonumber(ARGV[14]), read)
  if keep then
    -- A bucket's count: the fleet's bucket holds no more than it leaves.
    local drained = drain(KEYS[3], tat, now, sent, keep, left, tonumber(ARGV[7]), math.max(burst, 1),
      interval, rate, tonumber(ARGV[1]), tonumber(ARGV[4]), tonumber(ARGV[6]), tonumber(ARGV[13]), read)
    if drained > tat then tat, changed = drained, true end
    -- The climb levelled off below the key's rate, or a count with room
    -- sped it up: the turns given before move (see retime in rate.lua),
    -- and this batch's turns are given at the new rate.
    local after = effective(KEYS[3], now, tonumber(ARGV[1]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]))
    if after ~= rate then
      local queue = nil
      if depth >= 0 then queue = KEYS[4] end
      tat = retime(KEYS[3], tat, start, rate, after, burst, now, ARGV[16], ARGV[17], queue)
      rate, interval, changed = after, 1000000 / after, true
    end
  end
end
local recorded, last = false, 0 -- a grant was recorded; the latest turn given
local probe = tonumber(ARGV[15])
local horizon = tonumber(ARGV[19])
local group, fair = 2, nil
if horizon > 0 then group, fair = 6, fairState(KEYS[3], KEYS[5]) end
local out = {0, string.format('%.17g', rate), tonumber(redis.call('HGET', KEYS[3], field.rts) or '0') or 0}
for i = 21, #ARGV - group, group do
  local cost = tonumber(ARGV[i])
  local maxwait = tonumber(ARGV[i + 1])
  local level, share, tenant, weight = -1, 0, '', 1
  if fair then
    level, share = tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
    tenant, weight = ARGV[i + 4], tonumber(ARGV[i + 5])
  end
  local trial = nil
  local b = burst
  if b == 0 then b = cost end
  local code, newtat, at, wait
  -- (twice at most: a spent budget holds the key, and the turn moves to
  -- the hold's end, where the budget has expired or is forgotten)
  for _ = 1, 2 do
    newtat, at = turn(math.max(tat, start + kept * interval), start, cost, b, interval)
    wait = math.ceil(at - now)
    code = 0
    -- A turn at the start goes at once; a later one waits in the queue.
    if depth >= 0 and at > start and queued + cost > depth then
      code = 2
    elseif maxwait >= 0 and wait > maxwait then
      code = 1
    end
    if code ~= 0 then break end
    if share > 0 then
      -- The fleet's order and shares (see fairstate.lua): the trial is
      -- kept when the request is held back, or once its turn is final
      -- (a spent budget may move it below).
      trial = fair.trial()
      local v, back = fair.ask(trial, level, tenant, cost * interval, at, horizon, share)
      if v == 2 then
        code, wait = 4, math.ceil(back - now)
        break
      end
    end
    local held = spend(KEYS[3], at, cost, probe, now)
    if held <= pause then break end
    -- The budget is spent: the fleet is held until then, and resumes at
    -- the rate (its bucket emptied as of the hold's end but for a unit).
    -- The turns given before this one were within the budget: the hold
    -- is not told on the channel, which would make their waiters reserve
    -- again after it.
    pause = held
    start = math.max(now, pause, pn)
    if depth >= 0 then queued = waiting(start) end
    redis.call('SET', KEYS[2], string.format('%.0f', pause), 'PX', math.ceil((pause - now) / 1000) + 1)
    if burst > 0 then tat = math.max(tat, pause + (burst - 1) * interval) end
    changed = true
  end
  if code == 0 then
    if trial then fair.grant(trial, level, tenant, weight, cost * interval) end
    tat = newtat
    changed = true
    grant(KEYS[3], at, cost)
    recorded, last = true, math.max(last, at)
    if depth >= 0 and at > now then
      redis.call('ZADD', KEYS[4], string.format('%.3f', at), string.format('%.3f:%d', at, cost))
      if at > start then queued = queued + cost end
    end
    if ph and pk and pg and at >= ph and pc < pk then
      -- A probe: the next turn a gap after it, with one unit then.
      pc = pc + 1
      code = 3
      redis.call('HSET', KEYS[3], field.pc, pc)
      if pc < pk then
        pn = at + pg
        redis.call('HSET', KEYS[3], field.pn, string.format('%.0f', pn))
        start = math.max(start, pn)
        if depth >= 0 then queued = waiting(start) end
        if burst > 0 then tat = math.max(tat, pn + (burst - 1) * interval) end
      end
    end
  end
  out[#out + 1] = code
  out[#out + 1] = wait
end
out[1] = math.max(0, math.ceil(pause - now))
if fair then fair.save() end
if recorded or reported then
  -- The ring is kept for every key (a report may come for any), and
  -- lives at least as long as it reaches back; a budget until its reset.
  if recorded then
    local hist = tonumber(redis.call('HGET', KEYS[3], field.hist) or '')
    if not hist then
      hist = now
      redis.call('HSET', KEYS[3], field.hist, string.format('%.0f', now))
    end
    -- The latest turn given in the key's first second before any refusal
    -- was heard (given blind): a refusal sent before it is the start's
    -- (see the collision in control.lua).
    if now < hist + tune.collisionSpan and last > (tonumber(redis.call('HGET', KEYS[3], field.hend) or '') or 0) and
        refusedLastSecond(KEYS[3], now) == 0 then
      redis.call('HSET', KEYS[3], field.hend, string.format('%.0f', last))
    end
  end
  local keep = tune.ringLife / 1000
  if reported then keep = math.max(keep, math.ceil(tonumber(ARGV[8]) / 1000) + 1000) end
  if redis.call('PTTL', KEYS[3]) < keep then redis.call('PEXPIRE', KEYS[3], keep) end
end
if changed then
  -- The state matters until the bucket is full again.
  local ttl = math.ceil((tat - now) / 1000) + 1
  redis.call('SET', KEYS[1], string.format('%.3f', tat), 'PX', ttl)
  if depth >= 0 then redis.call('PEXPIRE', KEYS[4], ttl) end
end
return out
