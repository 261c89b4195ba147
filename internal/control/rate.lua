-- rate: the rate a key is held to now, in units per second; the prefix of
-- the reserve and control scripts. The key's learnt state lives in a hash
-- (internal/control's State, field for field; the scripts name each field
-- as field.<name>, of fields.lua, generated from sharedfields.go):
--   adv, advu   the advertised limit and until when it is believed (us)
--   wmax, w0, climb  discovery: the rate the climb back aims at, the rate
--               right after the last decrease, and when the climb starts
--               (us: the decrease, or the end of the hold it came with)
--   pl          the seconds the climb stays at its aim before it grows
--               beyond (internal/control's plateauFor; none: 0)
--   gd, bk, bn  a rate the fleet was accepted at for a second before a
--               throttle without counts, when the fleet tries it again
--               (us), and the tries refused since (internal/control's good,
--               back, backN; see aimBack)
--   dec         when the last decrease was decided (us)
--   shape       what the key's reset means: 0 unknown, 1 window, 2 bucket
--   zat, zun    when a "remaining 0" was last seen, and its reset (us)
--   zres        that reset's resolution (us): an acceptance read later
--               than zun less it tells no shape
--   f0 .. f3    the fleet's refusals in the last second, by quarter
--               second (see control.lua)
--   room, roomr  when a bucket's count last showed room, and the rate
--               then (see drain)
--   dra, drr    the first count of a bucket's stretch below full: when
--               (us), and its remaining (see drain)
--   drf         the refusals to requests sent since dra (control.lua):
--               turns the ring counts that the bucket did not take
--   rts         how many changes of the rate have moved the turns given
--               (see retime)
-- The rate is min(configured, advertised, the CUBIC climb since the last
-- decrease, never below floor): a function of the state and the time, so
-- successes need no write. The climb's constant c is relative to wmax.
-- cubic is the CUBIC rate t seconds after a decrease to w0, aiming at wmax,
-- staying there p seconds before it grows beyond (internal/control's Cubic,
-- term for term).
-- cubicK is K, the seconds the climb from w0 takes to reach wmax (above
-- 0; internal/control's cubicK).
local function cubicK(w0, wmax, c)
  return (math.max(wmax - w0, 0) / (c * wmax)) ^ (1 / 3)
end
local function cubic(t, w0, wmax, c, p)
  if wmax <= 0 then return w0 end
  local k = cubicK(w0, wmax, c)
  if t > k then t = math.max(k, t - p) end
  return wmax + c * wmax * (t - k) ^ 3
end

-- triesBack says whether the fleet tries the rate gd again at t: from bk
-- on, while gd is above the climb's aim wmax by a quarter or more
-- (internal/control's triesBack, backOver). The try climbs from a twentieth
-- under gd (aimUnder).
local function triesBack(gd, bk, wmax, t)
  return gd and bk and wmax and gd > tune.backOver * wmax and t >= bk
end

-- turn is the GCRA decision for a request of cost at start (>= now) on a
-- bucket full again at tat, with tolerance b units at interval us a unit:
-- the bucket's new tat, and the time of the request's turn.
local function turn(tat, start, cost, b, interval)
  local newtat = math.max(tat, start) + cost * interval
  return newtat, math.max(newtat - b * interval, start)
end

local function effective(key, now, configured, discover, c, floor)
  local r = configured
  local st = redis.call('HMGET', key, field.adv, field.advu, field.wmax, field.w0, field.climb, field.pl, field.gd,
    field.bk)
  local adv, advu = tonumber(st[1]), tonumber(st[2])
  local wmax, w0, climb, pl = tonumber(st[3]), tonumber(st[4]), tonumber(st[5]), tonumber(st[6]) or 0
  if adv and advu and now < advu then
    r = math.min(r, adv)
  end
  if discover > 0 and wmax and w0 and climb then
    local d = math.max(cubic(math.max(0, (now - climb) / 1000000), w0, wmax, c, pl), floor)
    local gd, bk = tonumber(st[7]), tonumber(st[8])
    if triesBack(gd, bk, wmax, now) then
      -- a climb of its own, from a twentieth under gd
      d = math.max(d, cubic((now - bk) / 1000000, tune.aimUnder * gd, gd, c, 0))
    end
    r = math.min(r, d)
  end
  return r
end

-- The key's budget (internal/control's State.report and spend), in the
-- same hash:
--   bud, budu, budn  the units the fleet may still be granted before budu
--               (us), and the reported reset over its limit (us; 0 when
--               none): set by a report of a window's quota (or one whose
--               shape is not known yet), spent by every grant
--   budr, budres  the provider's remaining that report stated, and its
--               reset's resolution (us)
--   hist        since when the grants are recorded (us)
--   hend        the latest turn given in the key's first second before
--               any refusal was heard (us; reserve.lua: see the start-up
--               collision in control.lua)
--   g0 .. g255  the grants of the last 2.56 s, a ring of 10 ms slots:
--               "<slot>:<units>", slot being the turn's time / 10 ms; kept
--               for every key, by the reservation script (a few hundred
--               bytes, for ten seconds after the last grant unless the
--               key has learnt state), so that the first report finds the
--               turns granted before it
-- A report's remaining counts every request the provider decided before
-- the reported one; the fleet's requests it has not counted yet are those
-- granted a turn after the reported request was sent (the ring, when it
-- covers that time), else the reporting instance's requests in flight
-- times the live instances (the first report, or a request older than
-- the ring).
local ringSlot, ringSize = tune.ringSlot, tune.ringSize

-- tally adds n at at (us) to a ring of size slots of width us each, kept
-- in key's hash as fields prefix .. i: "<slot>:<count>" (a field holding
-- an older slot starts again from 0).
local function tally(key, prefix, width, size, at, n)
  local slot = math.floor(at / width)
  local f = prefix .. (slot % size)
  local v = redis.call('HGET', key, f)
  local count = 0
  if v then
    local s, u = string.match(v, '^(%d+):([%d.]+)$')
    if tonumber(s) == slot then count = tonumber(u) end
  end
  redis.call('HSET', key, f, string.format('%.0f:%.17g', slot, count + n))
end

-- grant records cost units granted a turn at at (us) in key's ring.
local function grant(key, at, cost)
  tally(key, field.g, ringSlot, ringSize, at, cost)
end

-- tallied returns the units of key's ring in slots first to last (slot
-- numbers, last >= first), and of those the units up to slot split; nil
-- when the ring no longer holds them all. The ring's slots hold the
-- turns to come as well as those past: a turn given further ahead than
-- the ring reaches back takes the field of a slot it held, which is then
-- not known, not empty. (Counted as empty, at 256 instances whose turns
-- went 1.8 s ahead, the turns since a drain's mark 1.7 s back were 150
-- of 340, and the climb back levelled off at 80/s for a provider that
-- refilled 200/s: see drain.)
local function tallied(key, first, last, split)
  local fields = {}
  for slot = first, last do fields[#fields + 1] = field.g .. (slot % ringSize) end
  local n, m = 0, 0
  for i, v in ipairs(redis.call('HMGET', key, unpack(fields))) do
    if v then
      local s, u = string.match(v, '^(%d+):([%d.]+)$')
      local slot = first + i - 1
      s = tonumber(s)
      if s and s > slot then return nil end
      if s == slot then
        n = n + tonumber(u)
        if slot <= split then m = m + tonumber(u) end
      end
    end
  end
  return n, m
end

-- granted returns the units granted a turn at or after from (us), up to
-- upto (us), and of those the units up to mid (us; upto when nil), or nil
-- when the ring does not cover from (or no longer holds a slot since:
-- see tallied).
local function granted(key, from, upto, now, hist, mid)
  local first, last = math.floor(from / ringSlot), math.floor(math.max(now, upto) / ringSlot)
  if not hist or from + 2 * ringSlot < hist or last - first >= ringSize then
    return nil
  end
  local split = last
  if mid then split = math.floor(math.max(now, mid) / ringSlot) end
  return tallied(key, first, last, split)
end

-- between returns the units granted a turn after from and up to to (us),
-- or nil when the ring does not cover from (see granted).
local function between(key, from, to, hist)
  local first, last = math.floor(from / ringSlot) + 1, math.floor(to / ringSlot)
  if not hist or from + 2 * ringSlot < hist or last - first >= ringSize then return nil end
  if last < first then return 0 end
  return (tallied(key, first, last, last))
end

-- regrant moves key's ring of grants as a change of the rate moves the
-- turns due after from (see retime): by f from from, slot by slot, up to
-- upto (us, the last turn given), so that the ring still counts the turns
-- when they go out.
local function regrant(key, from, upto, f)
  local first, last = math.floor(from / ringSlot) + 1, math.floor(upto / ringSlot)
  if last < first then return end
  last = math.min(last, first + ringSize - 1)
  local fields = {}
  for slot = first, last do fields[#fields + 1] = field.g .. (slot % ringSize) end
  local moved = {}
  for i, v in ipairs(redis.call('HMGET', key, unpack(fields))) do
    if v then
      local s, u = string.match(v, '^(%d+):([%d.]+)$')
      local slot = first + i - 1
      if tonumber(s) == slot then
        moved[#moved + 1] = {from + (slot * ringSlot + ringSlot / 2 - from) * f, tonumber(u)} -- (the slot's middle)
        redis.call('HDEL', key, fields[i])
      end
    end
  end
  for _, m in ipairs(moved) do tally(key, field.g, ringSlot, ringSize, m[1], m[2]) end
end

-- resolution returns the resolution a reset of d us was read to, as
-- ResetResolution in refill.go: 1 ms for a reset in milliseconds, 1 s for
-- whole seconds (and anything else).
local function resolution(d)
  if d % 1000 == 0 and d % 1000000 ~= 0 then return 1000 end
  return 1000000
end

-- The fleet's refusals, by the time their request was sent, in four slots
-- of a quarter second ("f0" .. "f3", see tally): with the ring of grants,
-- the share of the fleet's requests the provider accepted (the meter of
-- internal/control, fleet-wide).
local meterSlot = tune.meterSlot
local function refused(key, sent)
  tally(key, field.f, meterSlot, 4, sent, 1)
end
local function refusedLastSecond(key, now)
  local n, last = 0, math.floor(now / meterSlot)
  for _, v in ipairs(redis.call('HMGET', key, field.f .. 0, field.f .. 1, field.f .. 2, field.f .. 3)) do
    if v then
      local slot, count = string.match(v, '^(%d+):([%d.]+)$')
      slot = tonumber(slot)
      if slot and slot > last - 4 and slot <= last then n = n + tonumber(count) end
    end
  end
  return n
end

-- report sets key's budget from a report at now: remaining rem (the
-- provider's count, as of the reported request), the reset in us, unit in
-- us (the reset over the limit; 0 for none), sent the reported request's
-- send time (us; -1 unknown), inflight the fallback estimate of the
-- fleet's requests in flight, tat the bucket's, kind what the reset
-- means as the provider's dialect says (0 when it does not), res the
-- resolution the reset was read to (us; see resolution), read when the
-- response was read (us; now when nil). A bucket has
-- no budget: for one, report returns the units its count leaves the fleet
-- once every turn given is spent (its remaining less the fleet's requests
-- it has not counted yet, and the turns still to come; below 0 when they
-- are more) and what it leaves now (less the requests sent, not the turns
-- to come), else nil: see drain.
local function report(key, now, rem, reset, unit, sent, inflight, tat, kind, res, read)
  local st = redis.call('HMGET', key, field.shape, field.hist)
  if kind > 0 then
    redis.call('HSET', key, field.shape, kind)
    st[1] = kind
  end
  if (tonumber(st[1]) or 0) == 0 and unit > 0 and tonumber(st[2]) then
    -- More than twice the limit (the reset over the unit) accepted by the
    -- fleet in the last second (since the ring began, when later): no
    -- window admits that many, even across its end, unless it is shorter
    -- than a second, and then it is as good as a bucket.
    local hist = tonumber(st[2])
    local g = granted(key, math.max(now - 1000000, hist), now, now, hist)
    if g and g - refusedLastSecond(key, now) > 2 * reset / unit then
      redis.call('HSET', key, field.shape, 2)
      st[1] = 2
    end
  end
  local bucket = tonumber(st[1]) == 2
  if bucket then redis.call('HDEL', key, field.bud, field.budu, field.budn) end
  local hist = tonumber(st[2])
  -- owed counts the fleet's turns given after the reported request was
  -- sent, up to upto, and of those up to mid (see granted): from early
  -- slots before the one it was sent in (a window's budget: two, so that
  -- the reported request's own turn is surely among them, and the turns
  -- of requests sent a little after their turn too), one unit less for
  -- its own; when the ring does not reach back that far, the estimate of
  -- the requests in flight.
  local function owed(upto, early, mid)
    local n, m = nil, nil
    if sent >= 0 then n, m = granted(key, sent - early * ringSlot, upto, now, hist, mid) end
    if n then return math.max(n - 1, 0), math.max(m - 1, 0) end
    return inflight, inflight
  end
  if bucket then
    -- every turn given, as the fleet's own bucket counts them; and those
    -- come already. From the reported request's own slot: the requests
    -- sent before it were counted before it, and a bucket counted short
    -- costs a refusal that holds one unit, not a window's rest (two slots
    -- early held the fleet's bucket a unit or two behind the provider's
    -- at 100/s: 2 points of the storm scenario's successes).
    -- What it leaves: less the requests in flight when its answer was
    -- read, as the Go controller counts them (the turns given since then,
    -- until the report reached the script, were sent while the provider
    -- refilled: counting them took a bucket with room for one without, 0.1
    -- to 0.2 s of turns at the rate); by whole slots between the two, as
    -- the slots they fall in hold turns sent before and after them (at 2 ms
    -- from send to answer, one slot each: a unit too many as often as not).
    local all = owed(tat, 0, now)
    local come = inflight
    if sent >= 0 then come = between(key, sent, math.min(read or now, now) - ringSlot, hist) or inflight end
    return rem - all, rem - come
  end
  -- (a window's: the turns given up to the reset, those after it spend
  -- the next window's quota; a shape not known yet: the turns given up to
  -- now, the requests in flight, as the Go controller counts them —
  -- counting the waiters' turns to come as well holds a bucket provider's
  -- fleet again and again before its shape is learnt)
  local upto = math.min(tat, now + reset)
  if (tonumber(st[1]) or 0) == 0 then upto = math.min(upto, now) end
  local left = rem - owed(upto, 2)
  -- The same window (its count has not come back): it ends the earliest
  -- any of its reports said (a reset rounded up ends later than the real
  -- one; a window's implied reset is narrowed only by the instance whose
  -- answers dated its start: see Quota.impliedReset).
  local budu = now + reset
  local prev = redis.call('HMGET', key, field.budu, field.budr)
  local pu, pr = tonumber(prev[1]), tonumber(prev[2])
  if pu and pr and pu > now and rem <= pr and pu < budu then budu = pu end
  redis.call('HSET', key, field.bud, string.format('%.17g', left), field.budu, string.format('%.0f', budu),
    field.budn, string.format('%.0f', unit), field.budr, string.format('%.17g', rem), field.budres, res)
end

-- drain applies what a bucket provider's count leaves (report's keep and
-- left) to the fleet's, and returns the fleet's bucket's new tat (b units
-- of tolerance at interval us a unit; it never adds any): it holds at most
-- keep units as of read, when the response was read (us; now when nil),
-- as the provider's does once the turns the fleet was given are spent
-- (internal/control's Decision.drain; owing, below 0), and it has refilled
-- at the key's rate since, as a local limiter drained when the response is
-- read. (Drained as of now, a count that reached the script with this
-- instance's next reservation, a tenth of a second later at 40/s over 4
-- instances, owed the turns given meanwhile without the refill: the fleet
-- sent 34/s at a rate of 38.) rem is
-- the count itself (the provider's remaining), sent when its request was
-- sent (us; -1 unknown), lim the provider's limit (-1 for none); rate is
-- the key's, configured, discover and floor the limiter's. The rest is
-- internal/control's counted, with the fleet's turns for the requests it
-- accepted: while the key's rate climbs back after a decrease, a count
-- with nothing left levels the climb off at the rate the counts show the
-- bucket refills at (dra and drr: the first count of a stretch below full,
-- by its request's send time, taken again two seconds on or when a count
-- rises two or more above it, see drainMark; the turns granted since, less
-- what the count fell, plus one, over the time), else at the rate of the
-- last count that showed room, within 2 s, when lower (and at least half
-- the rate); counts that fell by 2 or more with room left level it off at
-- the refill rate too, when lower. A count that shows room (all but one
-- unit of the limit left) runs the climb's clock 4 times as fast, while
-- the fleet's turns keep up with its rate (internal/control's roomy). A
-- bucket of one unit (a limit under 2) shows 0 after every request it
-- accepts: its counts neither level nor speed it.
local function drain(key, tat, now, sent, keep, left, rem, b, interval, rate, configured, discover, floor, lim, read)
  local st = redis.call('HMGET', key, field.climb, field.room, field.roomr, field.dra, field.drr, field.hist, field.drf)
  local climb, room, roomr = tonumber(st[1] or ''), tonumber(st[2] or ''), tonumber(st[3] or '')
  local dra, drr, hist = tonumber(st[4] or ''), tonumber(st[5] or ''), tonumber(st[6] or '')
  local drf = tonumber(st[7] or '') or 0 -- the refusals heard since the mark (control.lua)
  local oneUnit = lim and lim >= 0 and lim < 2
  local climbing = discover > 0 and climb and now > climb and rate < configured and not oneUnit
  -- (by the reported request's send time: the turns up to it are those
  -- the provider had counted, whenever the report reaches the script)
  local at = sent
  if at < 0 then at = now end
  local est = nil
  if dra and drr and at - dra >= tune.drainMin and rem <= drr then
    local n = between(key, dra, at, hist)
    if n then
      local e = (n - drf - (drr - rem) + 1) * 1000000 / (at - dra)
      if e > 0 then est = e end
    end
  end
  local lvl = nil
  if climbing then
    if left <= 0 and est then
      lvl = math.min(rate, math.max(est * tune.nearAim, tune.drainLow * rate, floor))
    elseif left <= 0 then
      lvl = rate
      if room and roomr and now - room < tune.roomMemory and roomr < rate and roomr >= tune.drainLow * rate then
        lvl = math.max(roomr, floor)
      end
    elseif est and drr - rem >= 2 and est < rate then
      lvl = math.max(est * tune.nearAim, tune.drainLow * rate, floor)
    end
  end
  if lvl then
    local r = string.format('%.17g', lvl)
    redis.call('HSET', key, field.wmax, r, field.w0, r, field.climb, string.format('%.0f', now))
    redis.call('HDEL', key, field.pl)
  end
  -- The mark is taken again after a level-off below the rate, and as
  -- internal/control's Count says; levelled where it was, the
  -- stretch goes on measuring (see counted).
  if lvl and lvl < rate then
    redis.call('HSET', key, field.dra, string.format('%.0f', at), field.drr, string.format('%.17g', rem))
    redis.call('HDEL', key, field.drf)
  elseif lim and lim >= 2 and rem >= lim - 1 then
    redis.call('HDEL', key, field.dra, field.drr, field.drf)
  elseif not dra or at - dra >= tune.drainSpan or rem >= drr + tune.drainFall then
    redis.call('HSET', key, field.dra, string.format('%.0f', at), field.drr, string.format('%.17g', rem))
    redis.call('HDEL', key, field.drf)
  end
  if left > 0 and lim and lim >= 2 and left >= lim - 1 then
    -- (Room speeds the climb only while the fleet's turns keep up with its
    -- rate: those granted in the time of 16 units at the rate, at least a
    -- quarter second and at most two, at 0.75 of it or more; see
    -- internal/control's roomy and sendPace. The rate remembered is the
    -- key's while they keep up, the turns' when they do not: this count,
    -- by the ring's slots, reads a little under the rate the fleet goes
    -- at, and remembered as it was it levelled the fleet off 10 to 15%
    -- under a limit of 20/s with a burst of 2, in scenario B of the fleet
    -- benchmark at that ratio.)
    local went = rate
    local w = math.min(math.max(tune.paceUnits * 1000000 / rate, tune.paceMin), tune.paceMax)
    local n = between(key, now - w, now, hist)
    -- (between counts whole slots of the ring: those from the one after
    -- now - w's, whose start is the time counted from)
    local since = (math.floor((now - w) / ringSlot) + 1) * ringSlot
    if n and now > since then went = math.min(rate, n * 1000000 / (now - since)) end
    local kept = went >= tune.keepUp * rate
    if climbing and room and kept then
      local ahead = math.min(math.min(now - room, tune.roomGap) * (tune.roomBoost - 1), now - climb)
      redis.call('HSET', key, field.climb, string.format('%.0f', climb - ahead))
    end
    if kept then went = rate end
    redis.call('HSET', key, field.room, string.format('%.0f', now), field.roomr, string.format('%.17g', went))
  end
  return math.max(tat, math.min(read or now, now) + (b - keep) * interval)
end

-- retime applies a change of the key's rate from old to new to the turns
-- given before it (internal/control's lowerings, shared.go's retimings): the
-- bucket's last turn (tat less burst units at the old rate; tat itself for
-- a pacer, burst 0) moves by old/new from from (the end of the key's hold,
-- or now: the turns inside a hold are taken again after it), with a
-- pacer's queue (queue: its sorted set of turns, see reserve.lua; nil for
-- a token bucket), so that its units count as waiting until their turns
-- come, and the ring of grants in state (see regrant). Every instance is
-- told on channel, "<id> x<old/new> <us until it starts> <seq>", so that
-- its waiters take their turns as moved: seq numbers the key's changes
-- (rts in state), and a reservation's reply says how many came before its
-- turns, so that a waiter applies exactly the later ones, whichever of
-- the reply and the message comes first.
-- A lowering spreads the turns: otherwise those given at the old rate (32
-- waiters are 0.3 to 0.7 s of them) go out at it, and meet a refusal of
-- their own. A raise brings them in, so that the queue goes at the rate
-- of the moment, as a local LeakyBucket's does; otherwise a climb's counts
-- tell of a rate 0.3 to 0.7 s old, and it climbs that much past the limit
-- before they show it (a cluster of refusals 0.1 s apart, in scenario B
-- of the fleet benchmark).
-- It returns the new tat (the turns given after the change queue behind
-- the last one) and the time of that last turn, moved.
local function retime(state, tat, from, old, new, burst, now, channel, id, queue)
  local last = tat - burst * 1000000 / old
  if not (new > 0 and old > 0 and new ~= old) or last <= from then return tat, last end
  local f = old / new
  local moved = from + (last - from) * f
  regrant(state, from, tat, f)
  if queue then
    local turns = redis.call('ZRANGEBYSCORE', queue, '(' .. string.format('%.3f', from), '+inf', 'WITHSCORES')
    for i = 1, #turns, 2 do
      redis.call('ZADD', queue, string.format('%.3f', from + (tonumber(turns[i + 1]) - from) * f), turns[i])
    end
  end
  local seq = redis.call('HINCRBY', state, field.rts, 1)
  publish(channel, id .. ' x' .. string.format('%.17g', f) .. ' ' .. string.format('%.0f', from - now) ..
    ' ' .. seq)
  return moved + burst * 1000000 / new, moved
end

-- spend takes cost units of key's budget for a turn at at (us), at now:
-- it returns 0 when they were there (or there is no budget, or it has
-- expired), else the time (us) the key is held until: the budget's reset
-- for a window (shape 1); for a shape not known yet, a brief hold from
-- now (probe us, or until the reset if sooner), after which the budget is
-- forgotten until the next report, as after a "remaining 0". (The Go controller
-- lets one request go after the hold and holds the key again until its
-- answer tells the shape; the fleet's turns are given ahead of time, to
-- waiters that would each be held a probe's time behind the other.)
local function spend(key, at, cost, probe, now)
  local st = redis.call('HMGET', key, field.bud, field.budu, field.shape)
  local bud, budu, shape = tonumber(st[1]), tonumber(st[2]), tonumber(st[3]) or 0
  if not bud or not budu or at >= budu or shape == 2 then return 0 end
  if bud >= cost then
    redis.call('HSET', key, field.bud, string.format('%.17g', bud - cost))
    return 0
  end
  -- Spent: a "remaining 0" as of at, whose answer tells the shape.
  local z = redis.call('HMGET', key, field.zun, field.budn, field.budres)
  if not (tonumber(z[1]) and tonumber(z[1]) > now) then
    redis.call('HSET', key, field.zat, string.format('%.0f', now), field.zun, string.format('%.0f', budu),
      field.zunit, z[2] or '0', field.zres, z[3] or '1000000')
    redis.call('HDEL', key, field.sag, field.sar)
  end
  if shape == 1 then return budu end
  redis.call('HDEL', key, field.bud, field.budu)
  -- (from now, as the Go controller holds: from the turn, each report
  -- heard during a hold, of requests sent before it, armed a budget that
  -- its next grant found spent, and moved the hold's end a probe further)
  return math.min(budu, now + probe)
end

