-- now: the time of the decision, in microseconds since the epoch, which
-- every script reads first. The last argument of every script says whose:
-- "@" for the Redis server's clock (TIME), "@<us>" for a time the caller
-- gives (a test on a fake clock runs a script and its Go twin on the same
-- instants). Any other last argument is an error: a call that forgot the
-- time fails loudly rather than read another argument as one.
if redis.replicate_commands then redis.replicate_commands() end
local now
do
  local given = ARGV[#ARGV]
  if type(given) ~= 'string' or string.sub(given, 1, 1) ~= '@' then
    return redis.error_reply('egress: a script\'s last argument is the time, "@" or "@<us>"')
  end
  if given == '@' then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  else
    now = tonumber(string.sub(given, 2))
  end
end
