-- rate: the rate a key is held to now, in units per second; the prefix of
-- the reserve and learn scripts. The key's learnt limit lives in a hash:
--   adv, advu   the advertised limit and until when it is believed (us)
--   wmax, dec   the rate at the last decrease and when it was (us), in
--               adaptive mode
-- The rate is min(configured, advertised, CUBIC since the last decrease,
-- never below floor): a function of the state and the time, so successes
-- need no write.
local function effective(key, now, configured, beta, c, floor)
  local r = configured
  local st = redis.call('HMGET', key, 'adv', 'advu', 'wmax', 'dec')
  local adv, advu = tonumber(st[1]), tonumber(st[2])
  local wmax, dec = tonumber(st[3]), tonumber(st[4])
  if adv and advu and now < advu then
    r = math.min(r, adv)
  end
  if beta > 0 and wmax and dec then
    local t = (now - dec) / 1000000
    local k = (wmax * (1 - beta) / c) ^ (1 / 3)
    r = math.min(r, math.max(c * (t - k) ^ 3 + wmax, floor))
  end
  return r
end

if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
