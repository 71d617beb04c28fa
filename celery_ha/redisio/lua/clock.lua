--[[ Shared include: the Redis server clock (pulled in with --#include clock).
  Every lease expiry, due time, rate window and timestamp in celery-ha is read from here, never from a
  worker's clock. Effects replication is switched on first: Redis 6.2 refuses a write after TIME in a
  script otherwise (on 7.x the call is a harmless no-op, and a function library has none).
  Defines: now_ms() -> integer ms; now_us_score() -> the instant of the last now_ms() in microseconds,
  as a score string (orders events that fall within one millisecond).
]]
local clock_s, clock_us
--#per-call
if redis.replicate_commands then redis.replicate_commands() end -- absent in a function library
clock_s, clock_us = nil, nil
--#end-per-call
local function now_ms()
  local t = redis.call('TIME')
  clock_s, clock_us = t[1], tonumber(t[2])
  return tonumber(t[1]) * 1000 + math.floor(clock_us / 1000)
end

local function now_us_score()
  return clock_s .. string.format('%06d', clock_us)
end
