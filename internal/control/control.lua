-- control: a key's controller, for the whole fleet, on the Redis server's
-- clock (follows rate.lua). The same rules as State.Learn in
-- control.go, applied to what one response said.
--
-- KEYS[1]  the key's learnt state (see rate.lua)
-- KEYS[2]  the key's hold: no admission before this server time (us)
-- KEYS[3]  the key's bucket (its tat, see reserve.lua)
-- KEYS[4]  the pacer's queue (see reserve.lua)
-- ARGV[1]  the configured rate, units per second
-- ARGV[2], ARGV[3], ARGV[4], ARGV[5]  discovery: on (1) or off (0), C,
--          floor, beta
-- ARGV[6]  the advertised limit, units per second; 0 when none
-- ARGV[7]  how long an advertised limit is believed, in us; also the TTL
-- ARGV[8]  1 when the response says the key's quota is exhausted, else 0
-- ARGV[9]  1 when the response is a throttle (429, ...), else 0
-- ARGV[10] 1 when the response is an acceptance (2xx), else 0
-- ARGV[11] how long ago the request was sent, in us; -1 when unknown
-- ARGV[12] the quota's reset, in us; -1 when the response has none
-- ARGV[13] 1 when the quota's remaining, less the requests in flight, is 0
--          or below, else 0
-- ARGV[14] the response's Retry-After, in us; -1 when none
-- ARGV[15] the limit the instance's recent outcomes show, units per
--          second; 0 when too few
-- ARGV[16] the usable burst; 0 for a pacer
-- ARGV[17] how long a "remaining 0" holds a key of unknown shape, in us
-- ARGV[18] the key's channel (publish.lua), on which every instance hears of a hold
-- ARGV[19] the key's id, sent on the channel as "<id> <hold left in us>",
--          or as "<id> x<old rate over new> <us until the spread starts>"
--          when the rate is lowered
-- ARGV[20] what the quota's reset means, as the provider's dialect says:
--          0 unknown, 1 a window, 2 a bucket (the shape's own values)
-- ARGV[21] 1 when throttles without counts turned out not to be about the
--          quota (a storm): the decreases they caused are undone, and for
--          ARGV[23] us such throttles hold nothing, fleet-wide
-- ARGV[22] 1 when the response carries no count at all, else 0
-- ARGV[23] how long a storm is believed, in us
-- ARGV[24] the quota's remaining; -1 when the response has none
-- ARGV[25] the quota's limit; -1 when it states none
-- ARGV[26] the quota's reset over its limit, in us; 0 when either is missing
-- ARGV[27] the fleet's requests in flight as estimated without the ring
--          of grants (see report in rate.lua)
-- ARGV[28] 1 when the response's count sets the key's budget (a requests
--          quota with a reset), or drains its bucket (a success from a
--          provider that refills continuously), else 0
-- ARGV[29], ARGV[30]  the probes after a hold that a throttle without
--          counts sets (Storm in control.go): the gap between them
--          (us), and how many after a sign or a long hold (0 for none;
--          one, the first request after the hold, otherwise; a hold that
--          extends one not yet ended keeps its probes); the fleet's first
--          grants from the hold's end (or a gap after the turns given
--          before it, when they fall after its end) are the probes,
--          parted by the gap (reserve.lua)
-- ARGV[31] 1 when the response is a sign of a storm (a refusal among the
--          first requests after such a hold), which arms the probes of the
--          holds for ARGV[23] us, fleet-wide; else 0
-- ARGV[32] 1 when the hold is long (LongHold in control.go): all its
--          probes follow it, sign or not; else 0
--
-- Returns {old rate, new rate (strings, full precision), hold left in us
-- (0 when the response holds nothing), shape, 1 while a storm is believed
-- (else 0), how many probes follow the hold, its end (us of server time;
-- 0 when none)}. A hold is told on the channel as "<id> <us left> e<end>",
-- followed by " p<probes>" when probes follow it.
local configured, discover, c, floor, beta = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
  tonumber(ARGV[4]), tonumber(ARGV[5])
local old = effective(KEYS[1], now, configured, discover, c, floor)
local adv, ttl = tonumber(ARGV[6]), tonumber(ARGV[7])
local exhausted, throttled, accepted = ARGV[8] == '1', ARGV[9] == '1', ARGV[10] == '1'
local sent = -1
if tonumber(ARGV[11]) >= 0 then sent = now - tonumber(ARGV[11]) end
local reset, rem0, ra = tonumber(ARGV[12]), ARGV[13] == '1', tonumber(ARGV[14])
local est, burst, probe = tonumber(ARGV[15]), tonumber(ARGV[16]), tonumber(ARGV[17])

local rem, lim, unit = tonumber(ARGV[24]), tonumber(ARGV[25]), tonumber(ARGV[26])

-- The bounds the response's count puts on a bucket's refill rate, units
-- per second (BucketBounds in refill.go): (L-r-1)/(t+e) and (L-r)/(t-e),
-- the upper one math.huge when t is not above e; nil when the count is not
-- a bucket's report (no limit, no remaining, no reset, the bucket full, a
-- count too large to bound anything).
local function boundsOf()
  if lim < 1 or rem < 0 or rem >= lim or reset <= 0 then return nil end
  local t, e = reset / 1000000, resolution(reset) / 1000000
  local lo, hi = math.max(lim - rem - 1, 0) / (t + e), math.huge
  if t > e then hi = (lim - rem) / (t - e) end
  if lo ~= lo or lo == math.huge or hi ~= hi then return nil end
  return lo, hi
end

local st = redis.call('HMGET', KEYS[1], field.shape, field.zat, field.zun, field.dec, field.wmax, field.advu,
  field.storm, field.zunit, field.zres, field.w0, field.dra, field.gd, field.bk, field.bn, field.bwt)
local shape = tonumber(st[1]) or 0
local zat, zun, dec, prev = tonumber(st[2]), tonumber(st[3]), tonumber(st[4]), tonumber(st[5])
local advu, storm, zunit = tonumber(st[6]), tonumber(st[7]) or 0, tonumber(st[8]) or 0
local zres = tonumber(st[9]) or 1000000
local pw0 = tonumber(st[10]) -- the rate right after the last decrease (with prev, its aim)
local dra = tonumber(st[11]) -- the drain's mark (rate.lua's drain; only a success's count moves it)
-- the rate accepted before the limit fell, when it is tried again, the tries refused (see aimBack)
local gd, bk, bn = tonumber(st[12]), tonumber(st[13]), tonumber(st[14]) or 0
-- the end of the latest Retry-After a refusal from a bucket stated (bucketHold)
local bwt = tonumber(st[15])
if ARGV[21] == '1' then
  -- A storm: the decreases it caused were mistaken.
  redis.call('HDEL', KEYS[1], field.wmax, field.w0, field.climb, field.pl, field.ph, field.pk, field.pc, field.pg,
    field.pn, field.parm, field.gd, field.bk, field.bn)
  storm = now + tonumber(ARGV[23])
  redis.call('HSET', KEYS[1], field.storm, string.format('%.0f', storm))
  prev, pw0, gd, bk, bn = nil, nil, nil, nil, 0
end
if exhausted and ARGV[22] == '1' and storm > now then
  -- In a storm, a throttle without counts delays only its own request.
  exhausted = false
end
if ARGV[31] == '1' then
  redis.call('HSET', KEYS[1], field.parm, string.format('%.0f', now + tonumber(ARGV[23])))
end

-- A start-up collision (collides in control.go, its twin): a refusal
-- to a request whose turn was given in the key's first second (hist, its
-- first grant): sent in it, or before the latest turn it gave before any
-- refusal was heard (hend, at most collisionQueue past it: a fleet's
-- instances queue their first turns up to a second ahead), at the
-- configured rate, that asks a wait of a second at most, while the
-- fleet's refusals in the last second are few: no more than the burst (two
-- for a pacer), or a tenth of the units granted. It lowers nothing and
-- tells no shape, and while the shape is not known and the refusal carries
-- a count, it holds the key a unit at the rate (from the end of the hold,
-- when one is on) rather than for the Retry-After.
local collision = false
if exhausted and throttled and sent >= 0 and old >= configured and ra <= tune.collisionSpan then
  local st = redis.call('HMGET', KEYS[1], field.hist, field.hend)
  local hist, hend = tonumber(st[1]), tonumber(st[2]) or 0
  if hist and sent < math.max(hist + tune.collisionSpan, math.min(hend, hist + tune.collisionSpan + tune.collisionQueue)) then
    local r = refusedLastSecond(KEYS[1], now) + 1 -- (this one is counted below)
    collision = r <= math.max(tune.collisionMin, burst) or r <= tune.collisionShare * (granted(KEYS[1], math.max(now - 1000000, hist), now, now, hist) or 0)
  end
end
-- The shape, as the dialect says, or from a request sent after a
-- "remaining 0" and before its reset.
if tonumber(ARGV[20]) > 0 then
  shape = tonumber(ARGV[20])
elseif shape == 0 and zat and zun and sent > zat and sent < zun then
  if accepted and now >= zun - zres then
    -- read a resolution or less before the reset: a window whose reset
    -- was rounded up, or whose report was read late, may have reset
    -- before this request arrived; nothing is learnt from one such
    -- answer, but two that each say none is left, and one that said some
    -- was left short of the whole limit, are a bucket's (see learnShape)
    local ag = redis.call('HMGET', KEYS[1], field.sag, field.sar)
    local sag, sar = tonumber(ag[1] or '0') or 0, ag[2] == '1'
    if rem == 0 then
      sag = sag + 1
    elseif rem >= 1 and lim >= 0 and rem < lim - 1 then
      sar = true
    end
    if sag >= 2 and sar then
      shape = 2
      redis.call('HDEL', KEYS[1], field.zat, field.zun, field.amb, field.sag, field.sar)
      zat, zun = nil, nil
    else
      redis.call('HSET', KEYS[1], field.sag, sag, field.sar, sar and 1 or 0)
    end
  elseif accepted then
    -- accepted before the reset: a bucket, unless the whole limit came
    -- back (a window that reset early, or a small bucket full again),
    -- which is a bucket's only twice in a row; the first answer tells
    redis.call('HDEL', KEYS[1], field.zat, field.zun)
    zat, zun = nil, nil
    local amb = 0
    if lim >= 0 and rem >= lim - 1 then
      amb = (tonumber(redis.call('HGET', KEYS[1], field.amb) or '0') or 0) + 1
    end
    if amb == 1 then
      redis.call('HSET', KEYS[1], field.amb, 1)
    else
      shape = 2
      redis.call('HDEL', KEYS[1], field.amb)
    end
  elseif exhausted and throttled and not collision and rem == 0 and zunit > 0 and sent - zat >= zunit then
    -- refused a unit's refill or more after the zero: no bucket, a window
    shape = 1
    redis.call('HDEL', KEYS[1], field.amb)
  end
end
if ARGV[28] == '1' then
  local tat = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
  redis.call('HSET', KEYS[1], field.shape, shape)
  local keep, left = report(KEYS[1], now, rem, reset, unit, sent, tonumber(ARGV[27]), tat, 0, resolution(reset))
  -- (report learns a bucket from how many the fleet was granted: the
  -- shape written back below is the one it leaves)
  shape = tonumber(redis.call('HGET', KEYS[1], field.shape)) or shape
  if keep and accepted then
    -- A bucket's count on a success: the fleet's bucket holds no more
    -- than it leaves (as in reserve.lua).
    local drained = drain(KEYS[1], tat, now, sent, keep, left, rem, math.max(burst, 1), 1000000 / old, old, configured,
      discover, floor, lim)
    if drained > tat then
      redis.call('SET', KEYS[3], string.format('%.3f', drained), 'PX', math.ceil((drained - now) / 1000) + 1)
    end
  end
elseif shape == 2 then
  redis.call('HDEL', KEYS[1], field.bud, field.budu, field.budn)
end
if adv > 0 then
  redis.call('HSET', KEYS[1], field.adv, string.format('%.17g', adv), field.advu, string.format('%.0f', now + ttl))
  advu = now + ttl
  if adv < old then
    -- Throttles to requests sent before this lowering belong to the old
    -- rate: they lower nothing further.
    redis.call('HSET', KEYS[1], field.dec, string.format('%.0f', now))
    dec = now
  end
end

local held = 0
local heldEnd = 0
local emptied = nil -- the bucket was emptied as of then (emptyAsOf, below)
local probes = 0
local decreased = false
if exhausted and throttled then
  if sent >= 0 then refused(KEYS[1], sent) else refused(KEYS[1], now) end
  -- A refusal sent after the drain's mark: its turn is among those the
  -- mark's measure counts, and the provider did not take it (see drain).
  if dra and sent >= dra then redis.call('HINCRBY', KEYS[1], field.drf, 1) end
end
if exhausted then
  local rateUnit = 1000000 / old
  local untilus
  if collision and shape == 0 and ARGV[22] ~= '1' then
    -- a unit more for each such refusal: the provider had one unit less
    -- than the fleet's bucket counted
    untilus = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') or 0, now) + rateUnit
  elseif reset < 0 then
    if ra >= 0 then
      untilus = now + ra
    elseif ARGV[22] == '1' then
      -- a throttle that says nothing at all: a unit at the floor rate
      -- (the probes' gap) at least, so that the first request after the
      -- hold is a probe (unsaid in control.go)
      untilus = now + math.max(rateUnit, tonumber(ARGV[29]))
    else
      untilus = now + rateUnit
    end
  else
    if rem0 and not (zun and zun > now) then
      -- (the first zero counts until its reset; from the last turn the
      -- fleet was given, so that the requests sent at turns given before
      -- it tell nothing)
      local tat = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
      local z = math.max(now, tat - math.max(burst, 1) * rateUnit)
      redis.call('HSET', KEYS[1], field.zat, string.format('%.0f', z), field.zun, string.format('%.0f', now + reset),
        field.zunit, string.format('%.0f', unit), field.zres, resolution(reset))
      redis.call('HDEL', KEYS[1], field.sag, field.sar)
    end
    if shape == 1 then
      -- until the reset, or the earliest end a report of the same window
      -- stated (the budget's, see report in rate.lua: an instance whose
      -- answers dated the window's start narrowed it)
      local e = now + reset
      local bu = tonumber(redis.call('HGET', KEYS[1], field.budu) or '')
      if bu and bu > now and bu < e then e = bu end
      untilus = math.max(e, now + ra)
    elseif shape == 2 then
      -- a success says the bucket is empty: the rate is the wait; a
      -- refusal holds one unit, or until its Retry-After (at most the
      -- reset less its resolution) when the key went faster than the count
      -- says the bucket refills (and no limit is believed), or the request
      -- was sent before an earlier refusal's Retry-After ended (bucketHold
      -- in control.go)
      if throttled then
        untilus = now + math.min(reset, rateUnit)
        local s = sent
        if s < 0 then s = now end
        if ra >= 0 and not (bwt and bwt >= now + ra) then
          redis.call('HSET', KEYS[1], field.bwt, string.format('%.0f', now + ra))
        end
        local _, hi = boundsOf()
        if (bwt and s < bwt) or (hi and not (advu and now < advu) and old > hi) then
          untilus = math.max(untilus, now + math.min(math.max(ra, 0), reset - resolution(reset)))
        end
      else
        untilus = now
      end
    else
      untilus = now + math.max(ra, math.min(reset, math.max(probe, rateUnit)))
      -- after the hold the budget is forgotten until the next report, as
      -- in spend (rate.lua): the answers to the requests sent then tell
      -- the shape
      redis.call('HDEL', KEYS[1], field.bud, field.budu)
    end
  end
  local cur = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
  if untilus > cur and untilus > now then
    redis.call('SET', KEYS[2], string.format('%.0f', untilus), 'PX', math.ceil((untilus - now) / 1000) + 1)
    -- The last turn given before the hold (turn in rate.lua; a pacer's
    -- tolerance is a unit).
    local tat = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
    local given = tat - math.max(burst, 1) * rateUnit
    -- emptyAsOf empties the bucket as of t but for one unit, so that the
    -- fleet resumes at the rate rather than in a burst: as of the hold's
    -- end, and as of its first probe (below); at the rate a decrease
    -- sets, again, below.
    local function emptyAsOf(t)
      emptied = t
      local drained = t + (burst - 1) * rateUnit
      if burst > 0 and drained > tat then
        tat = drained
        redis.call('SET', KEYS[3], string.format('%.3f', drained), 'PX', math.ceil((drained - now) / 1000) + 1)
      end
    end
    emptyAsOf(untilus)
    local told = ARGV[19] .. ' ' .. string.format('%.0f', untilus - now) .. ' e' .. string.format('%.0f', untilus)
    local pg, pk = tonumber(ARGV[29]), tonumber(ARGV[30])
    if ARGV[22] == '1' and pk > 0 then
      -- A throttle without counts: probes follow, a gap apart (see storm
      -- in control.go), the first at the hold's end; more than one
      -- after a sign, or a long hold, only.
      local pst = redis.call('HMGET', KEYS[1], field.parm, field.ph, field.pk)
      local armed, last, lastk = tonumber(pst[1]), tonumber(pst[2]), tonumber(pst[3])
      -- A hold that extends one not yet ended keeps its probes: those
      -- granted already (turns are reserved ahead of the hold's end)
      -- count, and the next, if any, still follows a gap after them.
      -- (Counted afresh, a second probe was granted a few ms after the
      -- first, and a provider with a burst of one refused it: a storm told
      -- by its own probes.)
      local extends = cur > now and last and last > now and lastk
      if extends then
        pk = math.min(pk, math.max(lastk, 1))
      elseif ARGV[32] ~= '1' and not (armed and armed > now) then
        pk = 1
      end
      redis.call('HSET', KEYS[1], field.ph, string.format('%.0f', untilus), field.pk, pk,
        field.pg, string.format('%.0f', pg))
      if not extends then
        redis.call('HSET', KEYS[1], field.pc, 0)
        if given >= untilus then
          -- Turns given before the hold fall after its end, and go first:
          -- the first probe goes a gap after the last of them, alone.
          -- (Told as one, the first turn given after a pacer's queue
          -- went right after its last, and a provider with a burst of
          -- one refused it: a storm told by the fleet's own queue, after
          -- a hold of a tenth of a second, shorter than the queue.)
          -- (And the bucket is emptied as of then but for a unit, as it
          -- is as of the hold's end: the burst it refilled meanwhile went
          -- with the probe, at the same instant, and a provider with a
          -- burst of one refused them all.)
          redis.call('HSET', KEYS[1], field.pn, string.format('%.0f', given + pg))
          emptyAsOf(given + pg)
        else
          redis.call('HDEL', KEYS[1], field.pn)
        end
      end
      told = told .. ' p' .. pk
      probes = pk
    end
    publish(ARGV[18], told)
    held = math.ceil(untilus - now)
    heldEnd = untilus
    cur = untilus
  end
  -- Discovery: a throttle to a request sent after the last decrease, when
  -- no advertised limit is believed (a throttle at one lowers nothing).
  if throttled and discover > 0 and not collision and not (advu and now < advu) and (not dec or sent > dec) then
    if sent >= 0 and triesBack(gd, bk, prev, sent) and sent < bk + tune.sustained then
      -- A try of the rate the fleet was accepted at before its limit fell,
      -- refused: no decrease; the next try waits twice as long after the
      -- hold, or none follows past a minute (internal/control's backOff).
      -- The throttles to the turns given before lower nothing further.
      bn = bn + 1
      local wait = tune.backHolds * 2 ^ bn * (cur - now)
      if cur <= now or wait > tune.maxPlateau then
        redis.call('HDEL', KEYS[1], field.gd, field.bk, field.bn)
      else
        redis.call('HSET', KEYS[1], field.bk, string.format('%.0f', cur + wait), field.bn, bn)
      end
      local tat = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
      redis.call('HSET', KEYS[1], field.dec, string.format('%.0f', math.max(now, tat - math.max(burst, 1) * rateUnit)))
      decreased = true
    else
      local wmax, w0 = old, beta * old
      -- The fleet's estimate of the limit: the share of the units granted
      -- turns in the last second that were not refused, times the rate
      -- (an instance sees a share of the outcomes: too few, alone, for an
      -- estimate of its own). The lower of the two counts.
      -- (Since the ring began, when that is less than a second ago.)
      local hist = tonumber(redis.call('HGET', KEYS[1], field.hist) or '')
      local g = nil
      if hist then g = granted(KEYS[1], math.max(now - 1000000, hist), now, now, hist) end
      local r = refusedLastSecond(KEYS[1], now)
      if g and g >= 10 and r >= 3 and r < g then
        local fleet = old * (g - r) / g
        if est <= 0 or fleet < est then est = fleet end
      end
      local deepest = beta * beta * old -- the lowest one decrease goes (internal/control's decrease)
      if est > 0 and est < old then
        wmax = math.max(est, deepest / tune.estimateMargin)
        w0 = wmax * tune.estimateMargin
      elseif ARGV[22] == '1' and ra > tonumber(ARGV[29]) and pw0 and prev and pw0 > 0 and prev > pw0 and
          old <= (pw0 + prev) / 2 then
        -- a throttle without counts that asks for a wait longer than the
        -- probes' gap, early in the climb back (the lower half of it): by
        -- beta twice, aiming at beta of the rate, a twentieth under it
        -- unless the key is a bucket (early)
        wmax, w0 = beta * old, deepest
        if shape ~= 2 then wmax = wmax * tune.aimUnder end
      else
        if prev and old < prev then wmax = old * (1 + beta) / 2 end
        if shape ~= 2 then
          wmax = wmax * tune.aimUnder -- under the rate refused
        elseif prev and old > tune.nearLow * prev and old < tune.nearLimit * prev then
          -- near a bucket's limit found before, gently, aiming just under
          -- the rate refused (nearBeta, nearAim)
          w0 = math.max(w0, tune.nearBeta * old)
          wmax = math.max(tune.nearAim * old, w0)
        end
      end
      if shape == 2 then
        -- The refused report says the bucket refills no faster than hi,
        -- under the aim: the climb starts again from the least it surely
        -- refills, lo (decrease in control.go).
        local lo, hi = boundsOf()
        if lo and hi < wmax then
          wmax = hi
          if lo > 0 then wmax = lo end
          w0 = math.min(w0, wmax)
        end
      end
      -- The throttles that the turns given before the decrease meet belong
      -- to this episode too (until the last of them, as spread below).
      local tat = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
      local last = tat - math.max(burst, 1) * rateUnit
      w0 = math.max(w0, floor)
      redis.call('HSET', KEYS[1], field.wmax, string.format('%.17g', wmax), field.w0, string.format('%.17g', w0),
        field.climb, string.format('%.0f', math.max(now, cur)), field.dec, string.format('%.0f', math.max(now, last)))
      -- Without counts, the climb stays at its aim until eight holds after
      -- it began, a minute at most (plateauFor, probeHolds, maxPlateau).
      local pl = 0
      if ARGV[22] == '1' and wmax > 0 and cur > now then
        pl = math.max(math.min(8 * (cur - now) / 1000000, 60) - cubicK(w0, wmax, c), 0)
      end
      if pl > 0 then
        redis.call('HSET', KEYS[1], field.pl, string.format('%.17g', pl))
      else
        redis.call('HDEL', KEYS[1], field.pl)
      end
      decreased = true
      if ARGV[22] == '1' then
        -- A throttle without counts after a second in which the fleet was
        -- accepted at half the rate or more, and refused nothing else: the
        -- limit fell from the rate, tried again two holds after this one
        -- ends, or later if a try is due later (internal/control's aimBack).
        if hist and hist <= now - 1000000 and g and r <= 1 and g - r >= old / 2 and (not gd or old >= gd) then
          gd, bn, bk = old, 0, nil
        end
        if gd and cur > now then
          redis.call('HSET', KEYS[1], field.gd, string.format('%.17g', gd), field.bn, bn,
            field.bk, string.format('%.0f', math.max(bk or 0, cur + 2 * (cur - now))))
        else
          redis.call('HDEL', KEYS[1], field.gd, field.bk, field.bn)
        end
      end
    end
  end
end
redis.call('HSET', KEYS[1], field.shape, shape)
redis.call('PEXPIRE', KEYS[1], math.ceil(ttl / 1000))
local new = effective(KEYS[1], now, configured, discover, c, floor)
if new ~= old then
  -- The turns given before a change move (see retime in rate.lua). The
  -- throttles met by turns spread belong to this episode: a decrease
  -- dates itself from the last of them.
  local tat = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
  local from = math.max(now, tonumber(redis.call('GET', KEYS[2]) or '0') or 0)
  local queue = nil
  if burst == 0 then queue = KEYS[4] end
  local moved, last = retime(KEYS[1], tat, from, old, new, burst, now, ARGV[18], ARGV[19], queue)
  if moved ~= tat then
    redis.call('SET', KEYS[3], string.format('%.3f', moved), 'PX', math.max(math.ceil((moved - now) / 1000) + 1, 1))
    if decreased and last > now then redis.call('HSET', KEYS[1], field.dec, string.format('%.0f', last)) end
  end
  if emptied and burst > 0 and new < old then
    -- Emptied as of a hold's end at the old rate, the bucket would let a
    -- burst go then at the new: the units of the old rate's (burst - 1)
    -- left over. (At a decrease by beta twice, 70/s to 34/s, five
    -- requests went at once at the end of the hold, and a provider with a
    -- burst of five refused the sixth.)
    local drained = emptied + (burst - 1) * 1000000 / new
    local tatNow = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
    if drained > tatNow then
      redis.call('SET', KEYS[3], string.format('%.3f', drained), 'PX', math.ceil((drained - now) / 1000) + 1)
    end
  end
end
local stormy = 0
if storm > now then stormy = 1 end
return {string.format('%.17g', old), string.format('%.17g', new), held, shape, stormy, probes,
  string.format('%.0f', heldEnd)}
