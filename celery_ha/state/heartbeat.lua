--[[ Record that a pool process is alive now, timed by the Redis clock.
  KEYS[1] the namespace's workers zset (member = "node:pid", score = last heartbeat ms)
  ARGV[1] the worker name ("node:pid")
  Reply: the heartbeat time (integer ms, Redis clock)
]]
--#include clock
local now = now_ms()
redis.call('ZADD', KEYS[1], now, ARGV[1])
return now
