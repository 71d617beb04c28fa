--#include _common
-- Ban a proxy by hand (CLI `proxies ban`): for `seconds` (temporary) or for good (seconds = 0).
-- KEYS[1] = available zone; ARGV: 1 prefix, 2 pid, 3 ms (0 = permanent), 4 reason
-- Returns the new state, or false when the proxy is unknown.
local P, pid, ms, reason = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local mk = P .. 'm:' .. pid
if redis.call('EXISTS', mk) == 0 then return false end
local now = now_ms()
redis.call('ZREM', KEYS[1], pid)
redis.call('ZREM', P .. 'new', pid)
redis.call('HSET', mk, 'ban_reason', reason)
if ms > 0 then
  redis.call('ZREM', P .. 'pb', pid)
  redis.call('ZADD', P .. 'tb', now + ms, pid)
  redis.call('HSET', mk, 'state', 'tban', 'ban_until', now + ms)
  return 'tban'
end
redis.call('ZREM', P .. 'tb', pid)
redis.call('ZADD', P .. 'pb', now, pid)
redis.call('HSET', mk, 'state', 'pban', 'ban_until', 0)
return 'pban'
