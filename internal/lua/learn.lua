-- learn: apply what a response taught about a key's limit, for the whole
-- fleet, on the Redis server's clock (follows rate.lua).
--
-- KEYS[1]  the key's learnt limit (see rate.lua)
-- ARGV[1]  the configured rate, units per second
-- ARGV[2], ARGV[3], ARGV[4]  adaptive mode's beta, C and floor; beta 0 when
--          adaptive mode is off
-- ARGV[5]  the advertised limit, units per second; 0 when none
-- ARGV[6]  how long an advertised limit is believed, in us; also the TTL
-- ARGV[7]  1 for a throttling response (adaptive mode), else 0
-- ARGV[8]  how long ago the request that got it was sent, in us: a
--          throttling response to a request sent before the last decrease
--          belongs to the episode that decrease answered and counts once
-- ARGV[9]  the pause the response asked for, in us: the climb back starts
--          when it ends, not while nothing can be sent
--
-- Returns the key's rate before and after, in units per second (strings,
-- at full precision).
local configured, beta, c, floor = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local old = effective(KEYS[1], now, configured, beta, c, floor)
local adv, ttl = tonumber(ARGV[5]), tonumber(ARGV[6])
if adv > 0 then
  redis.call('HSET', KEYS[1], 'adv', string.format('%.6f', adv), 'advu', string.format('%.0f', now + ttl))
end
if ARGV[7] == '1' and beta > 0 then
  local st = redis.call('HMGET', KEYS[1], 'wmax', 'dec')
  local prev, dec = tonumber(st[1]), tonumber(st[2])
  if not dec or now - tonumber(ARGV[8]) > dec then
    -- CUBIC's fast convergence: a decrease below the previous aim lowers
    -- the aim further.
    local wmax = old
    if prev and old < prev then wmax = old * (1 + beta) / 2 end
    redis.call('HSET', KEYS[1], 'wmax', string.format('%.9g', wmax), 'w0', string.format('%.9g', beta * old),
      'dec', string.format('%.0f', now + tonumber(ARGV[9])))
  end
end
redis.call('PEXPIRE', KEYS[1], math.ceil(ttl / 1000))
local new = effective(KEYS[1], now, configured, beta, c, floor)
return {string.format('%.17g', old), string.format('%.17g', new)}
