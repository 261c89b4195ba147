-- slots: the in-flight leases of one key (SharedInFlightLimit), on the
-- Redis server's clock.
--
-- KEYS[1]  the key's leases: a sorted set of lease id -> expiry (us)
-- ARGV[1]  what to do: "acquire", "renew" or "release"
-- ARGV[2]  the lease id
-- ARGV[3]  acquire: the most leases the key may hold
-- ARGV[4]  acquire, renew: how long a lease lives unless renewed (us)
-- ARGV[5]  release: the channel on which to announce the free slot
-- ARGV[6]  release: the payload, the key's id
--
-- Returns {1, 0} when a lease is taken (acquire), renewed or released, {0,
-- 0} when renew or release found no such lease, and {0, wait} when acquire
-- found every slot held, wait being the time (us) until the earliest lease
-- expires.
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local op = ARGV[1]
if op == 'release' then
  local n = redis.call('ZREM', KEYS[1], ARGV[2])
  if n > 0 then redis.call('PUBLISH', ARGV[5], ARGV[6]) end
  return {n, 0}
end
local live = tonumber(ARGV[4])
local ttl = math.ceil(live / 1000) + 1000
if op == 'renew' then
  local n = redis.call('ZADD', KEYS[1], 'XX', 'CH', string.format('%.0f', now + live), ARGV[2])
  if n > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
  return {n, 0}
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now))
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], string.format('%.0f', now + live), ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1, 0}
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {0, math.max(0, math.ceil(tonumber(first[2]) - now))}
