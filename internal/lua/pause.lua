-- pause: hold a key for every instance, on the Redis server's clock (follows
-- rate.lua).
--
-- KEYS[1]  the key's pause: no admission before this server time (us)
-- KEYS[2]  the key's bucket (its tat, see reserve.lua)
-- KEYS[3]  the key's learnt limit (see rate.lua)
-- ARGV[1]  how long to pause, in us from now
-- ARGV[2]  the channel on which to tell every instance at once
-- ARGV[3]  the key's id, sent on the channel as "<id> <pause left in us>"
-- ARGV[4]  the configured rate, units per second
-- ARGV[5], ARGV[6], ARGV[7]  adaptive mode's beta, C and floor
-- ARGV[8]  the burst; 0 for a pacer
--
-- An existing longer pause is kept. The bucket is emptied as of the pause's
-- end but for one unit, so that the fleet resumes at the rate rather than in
-- a burst (a provider that asked to wait has refilled little). Returns the
-- pause left, in us.
local untilus = now + tonumber(ARGV[1])
local cur = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if cur >= untilus then
  return math.ceil(cur - now)
end
local ttl = math.ceil((untilus - now) / 1000) + 1
redis.call('SET', KEYS[1], string.format('%.0f', untilus), 'PX', ttl)
local burst = tonumber(ARGV[8])
if burst > 0 then
  local rate = effective(KEYS[3], now, tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]))
  local interval = 1000000 / rate
  local tat = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
  local drained = untilus + (burst - 1) * interval
  if drained > tat then
    redis.call('SET', KEYS[2], string.format('%.3f', drained), 'PX', math.ceil((drained - now) / 1000) + 1)
  end
end
redis.call('PUBLISH', ARGV[2], ARGV[3] .. ' ' .. string.format('%.0f', untilus - now))
return math.ceil(untilus - now)
