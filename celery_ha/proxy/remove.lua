--[[ Forget a proxy entirely: every zone, its hash, its group and expiry entries, its per-domain bans and
  block counts, and the tombstone of its ban if it expired banned (the operator's removal is final).
  KEYS[1] the available zone
  Same slot: the keys it builds (all, blk:<domain>, dban:<domain>, exp, grp, m:<id>, new, pb, pd:<id>, tb,
    tomb:<id>, each under cha:{ns}:px:) are named from ARGV[1], the prefix KEYS[1] starts with ({hash
    tag} included), so they share KEYS[1]'s slot (_common checks it).
  ARGV[1] the pool's key prefix
  ARGV[2] the proxy id
  Reply: 1 removed, 0 unknown proxy
]]
--#include _common
local P, pid = ARGV[1], ARGV[2]
local buried = redis.call('DEL', P .. 'tomb:' .. pid) == 1
if buried and redis.call('EXISTS', P .. 'm:' .. pid) == 0 then return 1 end
if redis.call('SISMEMBER', P .. 'all', pid) == 0 and redis.call('EXISTS', P .. 'm:' .. pid) == 0 then
  return 0
end
forget(P, pid)
return 1
