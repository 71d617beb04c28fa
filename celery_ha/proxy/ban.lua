--[[ Ban a proxy by hand (CLI `proxies ban`): for a while (temporary) or for good.
  KEYS[1] the available zone
  KEYS[2] the pool's counters (stats hash: 'banned_manual' counts this ban)
  Same slot: the keys it builds (m:<id>, new, pb, tb, each under cha:{ns}:px:) are named from ARGV[1],
    the prefix KEYS[1] starts with ({hash tag} included), so they share KEYS[1]'s slot (_common checks
    it).
  ARGV[1] the pool's key prefix
  ARGV[2] the proxy id
  ARGV[3] ban length (ms; 0 = permanent)
  ARGV[4] the reason, shown by `proxies list`
  Reply: 'tban' or 'pban' (the new state), or false (nil) when the proxy is unknown
]]
--#include _common
local P, pid, ms, reason = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local mk = P .. 'm:' .. pid
if redis.call('EXISTS', mk) == 0 then return false end
local now = now_ms()
redis.call('ZREM', KEYS[1], pid)
redis.call('ZREM', P .. 'new', pid)
redis.call('HSET', mk, 'ban_reason', reason)
redis.call('HDEL', mk, 'ck') -- a health probe in flight must not undo this ban
redis.call('HINCRBY', KEYS[2], 'banned_manual', 1)
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
