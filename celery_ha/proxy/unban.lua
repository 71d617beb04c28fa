--[[ Lift every ban of a proxy by hand (CLI `proxies unban`): it rejoins the available zone with clean
  failure counters (its success history and score are kept).
  KEYS[1] the available zone
  Per-domain bans and block counts go too (blk:<domain>, dban:<domain>, through the index pd:<id>),
  and so does the tombstone of an expired proxy's ban (tomb:<id>), so its provider may add it again.
  Same slot: the keys it builds (blk:<domain>, dban:<domain>, gen, m:<id>, new, pb, pd:<id>, tb, tomb:<id>,
    each under cha:{ns}:px:) are named from ARGV[1], the prefix KEYS[1] starts with ({hash tag}
    included), so they share KEYS[1]'s slot (_common checks it).
  ARGV[1] the pool's key prefix
  ARGV[2] the proxy id
  ARGV[3] score constants (scoring.py SCORE_ARG)
  Reply: the proxy's score as a string; '' when only a tombstone was lifted (the proxy itself left the
    pool at its expiry); false (nil) when the proxy is unknown
]]
--#include _common
local P, pid = ARGV[1], ARGV[2]
local mk = P .. 'm:' .. pid
local buried = redis.call('DEL', P .. 'tomb:' .. pid) == 1
if redis.call('EXISTS', mk) == 0 then
  if buried then return '' end
  return false
end
local now = now_ms()
clear_domain_bans(P, pid)
redis.call('HSET', mk, 'cf', 0, 'tbans', 0, 'okst', 0, 'ban_reason', '')
return tostring(make_available(P, pid, now, numargs(ARGV[3])))
