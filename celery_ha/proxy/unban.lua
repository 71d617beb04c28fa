--[[ Lift every ban of a proxy by hand (CLI `proxies unban`): it rejoins the available zone with clean
  failure counters (its success history and score are kept).
  KEYS[1] the available zone
  Same slot: the keys it builds (gen, m:<id>, new, pb, tb, each under cha:{ns}:px:) are named from ARGV[1],
    the prefix KEYS[1] starts with ({hash tag} included), so they share KEYS[1]'s slot (_common checks
    it).
  ARGV[1] the pool's key prefix
  ARGV[2] the proxy id
  ARGV[3] score constants (scoring.py SCORE_ARG)
  Reply: the proxy's score as a string, or false (nil) when the proxy is unknown
]]
--#include _common
local P, pid = ARGV[1], ARGV[2]
local mk = P .. 'm:' .. pid
if redis.call('EXISTS', mk) == 0 then return false end
local now = now_ms()
redis.call('HSET', mk, 'cf', 0, 'tbans', 0, 'okst', 0, 'ban_reason', '')
return tostring(make_available(P, pid, now, numargs(ARGV[3])))
