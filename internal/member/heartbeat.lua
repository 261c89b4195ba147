-- heartbeat: say this instance is alive and count the live ones, on the
-- Redis server's clock (follows now.lua and publish.lua).
--
-- KEYS[1]  sorted set of instance ids scored by last-seen time (ms)
-- ARGV[1]  this instance's id
-- ARGV[2]  how long an instance counts as live after its last heartbeat (ms)
-- ARGV[3]  1 to add the instance, 0 to remove it (on Close)
--
-- Returns {live, sharded}: the number of live instances, and 1 when the
-- scripts publish the fleet's announcements to shard channels (publish.lua),
-- 0 when with PUBLISH.
local ms = math.floor(now / 1000)
local ttl = tonumber(ARGV[2])
if ARGV[3] == '1' then
  redis.call('ZADD', KEYS[1], ms, ARGV[1])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms - ttl)
redis.call('PEXPIRE', KEYS[1], ttl * 2)
local sh = 0
if sharded then sh = 1 end
return {redis.call('ZCARD', KEYS[1]), sh}
