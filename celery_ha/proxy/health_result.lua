--[[ Record one health-check result: a pass restores the proxy to the available zone; a failure bans it
  again with a longer backoff (permanently after too many bans; at once for a free-list proxy on
  probation).
  KEYS[1] the available zone
  Same slot: the keys it builds (gen, m:<id>, new, pb, stats, tb, each under cha:{ns}:px:) are named from
    ARGV[1], the prefix KEYS[1] starts with ({hash tag} included), so they share KEYS[1]'s slot (_common
    checks it).
  ARGV[1] the pool's key prefix
  ARGV[2] the proxy id
  ARGV[3] '1' passed, '0' failed
  ARGV[4] the probe's latency (ms)
  ARGV[5] jitter in [0, 1) for the ban backoff
  ARGV[6] "ban_base_ms ban_cap_ms max_temp_bans"
  ARGV[7] score constants (scoring.py SCORE_ARG)
  ARGV[8] the claim stamp health_claim handed out ('' = whichever claim is current)
  Reply: the new state 'avail', 'tban' or 'pban', or 'skip' when the claim no longer holds: the proxy
    left the checked zones, or was banned, unbanned or claimed again while it was probed
]]
--#include _common
local P, pid, ok, latency, jitter = ARGV[1], ARGV[2], ARGV[3] == '1', tonumber(ARGV[4]), tonumber(ARGV[5])
local cfg = numargs(ARGV[6])
local K = numargs(ARGV[7])
local mk = P .. 'm:' .. pid
local cur = redis.call('HMGET', mk, 'state', 'ck')
local state = cur[1]
if state ~= 'tban' and state ~= 'new' then return 'skip' end
if not cur[2] or (ARGV[8] ~= '' and ARGV[8] ~= cur[2]) then return 'skip' end
redis.call('HDEL', mk, 'ck')
local now = now_ms()
redis.call('HSET', mk, 'last_check_at', now, 'last_check_ok', ok and 1 or 0)
if ok then
  local m = redis.call('HMGET', mk, 's', 't', 'ln', 'ld')
  local d = K[4]
  local s, t = (tonumber(m[1]) or 0) * d + 1, (tonumber(m[2]) or 0) * d + 1
  local ln, ld = (tonumber(m[3]) or 0) * d + latency, (tonumber(m[4]) or 0) * d + 1
  redis.call('HSET', mk, 's', s, 't', t, 'ln', ln, 'ld', ld, 'cf', 0, 'lat_ewma', math.floor(ln / ld))
  make_available(P, pid, now, K)
  redis.call('HINCRBY', P .. 'stats', 'health_restored', 1)
  return 'avail'
end
redis.call('HINCRBY', P .. 'stats', 'health_failed', 1)
if state == 'new' and redis.call('HGET', mk, 'source') == 'free' then
  redis.call('ZREM', P .. 'new', pid)
  redis.call('ZADD', P .. 'pb', now, pid)
  redis.call('HSET', mk, 'state', 'pban', 'ban_until', 0, 'ban_reason', 'failed probation check')
  return 'pban'
end
return temp_ban(P, pid, now, cfg[1], cfg[2], cfg[3], jitter, 'failed health check')
