-- rate: the rate a key is held to now, in units per second; the prefix of
-- the reserve and control scripts. The key's learnt state lives in a hash
-- (controller.go's ctlState, field for field):
--   adv, advu   the advertised limit and until when it is believed (us)
--   wmax, w0, climb  discovery: the rate the climb back aims at, the rate
--               right after the last decrease, and when the climb starts
--               (us: the decrease, or the end of the hold it came with)
--   dec         when the last decrease was decided (us)
--   shape       what the key's reset means: 0 unknown, 1 window, 2 bucket
--   zat, zun    when a "remaining 0" was last seen, and its reset (us)
-- The rate is min(configured, advertised, the CUBIC climb since the last
-- decrease, never below floor): a function of the state and the time, so
-- successes need no write. The climb's constant c is relative to wmax.
-- cubic is the CUBIC rate t seconds after a decrease to w0, aiming at wmax
-- (controller.go's cubic, term for term).
local function cubic(t, w0, wmax, c)
  if wmax <= 0 then return w0 end
  local k = (math.max(wmax - w0, 0) / (c * wmax)) ^ (1 / 3)
  return wmax + c * wmax * (t - k) ^ 3
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
  local st = redis.call('HMGET', key, 'adv', 'advu', 'wmax', 'w0', 'climb')
  local adv, advu = tonumber(st[1]), tonumber(st[2])
  local wmax, w0, climb = tonumber(st[3]), tonumber(st[4]), tonumber(st[5])
  if adv and advu and now < advu then
    r = math.min(r, adv)
  end
  if discover > 0 and wmax and w0 and climb then
    r = math.min(r, math.max(cubic(math.max(0, (now - climb) / 1000000), w0, wmax, c), floor))
  end
  return r
end

if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
