--[[ Remove one refetch schedule from a shard's copy, and the host entries' flag with the last host
  entry, in one step: a host schedule set meanwhile (another process) keeps its flag, which
  _refetch.lua reads before it looks for host entries.
  KEYS[1]  sched (hash: schedule field -> encoded schedule, plus the flag)
  ARGV[1]  the schedule's field (task, h:<host>, or task@host)
  ARGV[2]  the flag's field (present while any host entry exists)
  Reply: 1 when the schedule existed, else 0
]]
local existed = redis.call('HDEL', KEYS[1], ARGV[1])
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  if field ~= ARGV[2] and (string.sub(field, 1, 2) == 'h:' or string.find(field, '@', 1, true)) then
    return existed
  end
end
redis.call('HDEL', KEYS[1], ARGV[2])
return existed
