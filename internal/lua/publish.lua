-- publish: the fleet's announcements (holds, moved turns, released slots),
-- each on its key's channel, which carries the key's hash tag: the same
-- slot as the keys of the script that publishes it. On Redis 7 and later
-- a shard channel (SPUBLISH): a Redis Cluster carries the message within
-- the shard that serves the slot, where a PUBLISH is sent to every node.
-- Before 7, PUBLISH. The instances subscribe as the heartbeat's reply says
-- (heartbeat.lua): SSUBSCRIBE to the channels of the keys they use, on
-- their nodes, or PSUBSCRIBE to all of the limiter's.
local sharded = (redis.REDIS_VERSION_NUM or 0) >= 0x070000
local function publish(channel, message)
  if sharded then
    return redis.call('SPUBLISH', channel, message)
  end
  return redis.call('PUBLISH', channel, message)
end
