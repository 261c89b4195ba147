-- slots: the in-flight leases of one key (SharedInFlightLimit), on the
-- Redis server's clock (follows now.lua and publish.lua).
--
-- KEYS[1]  the key's leases: a sorted set of lease id -> expiry (us)
-- ARGV[1]  what to do: acquire, adopt, renew or release; its arguments
--          follow it, as below.
-- acquire:
-- ARGV[2]  a lease id
-- ARGV[3]  the most leases the key may hold
-- ARGV[4]  the lease's life (us)
--          Takes the lease if fewer than that many are live. Returns
--          {1, 0} when taken, {0, wait} when every slot is held, wait
--          being the time (us) until the earliest lease expires.
-- adopt, renew:
-- ARGV[2], ARGV[3], ...  a lease id and its life (us), a lease
--          adopt adds the leases whatever the count (slots taken while
--          Redis was unreachable). Returns {added, 0}. renew extends the
--          leases that are still there, never adding one (a lease released
--          or expired stays gone). Returns {renewed, 0}.
-- release:
-- ARGV[2]  the key's channel (publish.lua), to announce each lease removed on
-- ARGV[3]  the announcement
-- ARGV[4], ...  a lease id, a lease
--          Removes the leases. Returns {removed, 0}.
--
-- The key expires a second after its last lease, so idle keys vanish.
local op = ARGV[1]

local function score(us)
  return string.format('%.0f', now + tonumber(us))
end

-- keep sets the key's TTL past its latest lease (whoever's it is).
local function keep()
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if last[2] then
    local ms = math.ceil((tonumber(last[2]) - now) / 1000)
    redis.call('PEXPIRE', KEYS[1], math.max(ms, 1) + 1000)
  end
end

if op == 'release' then
  local n = 0
  for i = 4, #ARGV - 1 do
    if redis.call('ZREM', KEYS[1], ARGV[i]) > 0 then
      n = n + 1
      publish(ARGV[2], ARGV[3])
    end
  end
  return {n, 0}
end

if op == 'renew' or op == 'adopt' then
  local flag = 'XX'
  if op == 'adopt' then flag = 'NX' end
  local n = 0
  for i = 2, #ARGV - 2, 2 do
    n = n + redis.call('ZADD', KEYS[1], flag, 'CH', score(ARGV[i + 1]), ARGV[i])
  end
  keep()
  return {n, 0}
end

-- acquire
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now))
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], score(ARGV[4]), ARGV[2])
  keep()
  return {1, 0}
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {0, math.max(0, math.ceil(tonumber(first[2]) - now))}
