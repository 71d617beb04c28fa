--[[ Record that a pool process is alive now, timed by the Redis clock; notice a silence first.
  When no process of the namespace beat for longer than ARGV[2] ms before this beat, every one of
  them was cut off from Redis (or Redis was down or paused): the silence [last beat, now] is recorded
  in the meta hash, and the reclaim sweep hands back the leases that expired inside it without
  counting a stall (see reclaim.lua).
  KEYS[1] the namespace's workers zset (member = "node:pid", score = last heartbeat ms)
  KEYS[2] the namespace's meta hash (fields quiet_from, quiet_to: the last silence, ms)
  ARGV[1] the worker name ("node:pid")
  ARGV[2] quiet_after: ms without any heartbeat that count as a silence (0 = do not look)
  Reply: the heartbeat time (integer ms, Redis clock)
]]
--#include clock
local now = now_ms()
local quiet_after = tonumber(ARGV[2]) or 0
if quiet_after > 0 then
  local last = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if last[2] and now - tonumber(last[2]) > quiet_after then
    redis.call('HSET', KEYS[2], 'quiet_from', last[2], 'quiet_to', now)
  end
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
return now
