-- pause: hold a key for every instance, on the Redis server's clock.
--
-- KEYS[1]  the key's pause: no admission before this server time (us)
-- ARGV[1]  how long to pause, in us from now
-- ARGV[2]  the channel on which to tell every instance at once
-- ARGV[3]  the key's id, sent on the channel as "<id> <pause left in us>"
--
-- An existing longer pause is kept. Returns the pause left, in us.
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local untilus = now + tonumber(ARGV[1])
local cur = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if cur >= untilus then
  return math.ceil(cur - now)
end
redis.call('SET', KEYS[1], string.format('%.0f', untilus), 'PX', math.ceil((untilus - now) / 1000) + 1)
redis.call('PUBLISH', ARGV[2], ARGV[3] .. ' ' .. string.format('%.0f', untilus - now))
return math.ceil(untilus - now)
