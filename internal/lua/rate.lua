-- rate: the rate a key is held to now, in units per second; the prefix of
-- the reserve and learn scripts. The key's learnt limit lives in a hash:
--   adv, advu   the advertised limit and until when it is believed (us)
--   wmax, w0, dec  in adaptive mode: the rate the climb back aims at, the
--               rate right after the last decrease, and when the climb
--               starts (us: the decrease, or the end of the pause it came
--               with)
-- The rate is min(configured, advertised, CUBIC since the last decrease,
-- never below floor): a function of the state and the time, so successes
-- need no write.
local function effective(key, now, configured, beta, c, floor)
  local r = configured
  local st = redis.call('HMGET', key, 'adv', 'advu', 'wmax', 'w0', 'dec')
  local adv, advu = tonumber(st[1]), tonumber(st[2])
  local wmax, w0, dec = tonumber(st[3]), tonumber(st[4]), tonumber(st[5])
  if adv and advu and now < advu then
    r = math.min(r, adv)
  end
  if beta > 0 and wmax and w0 and dec then
    local t = math.max(0, (now - dec) / 1000000) -- dec may be a pause's end
    local k = (math.max(wmax - w0, 0) / c) ^ (1 / 3)
    r = math.min(r, math.max(c * (t - k) ^ 3 + wmax, floor))
  end
  return r
end

if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
