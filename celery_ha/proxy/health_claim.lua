--[[ Claim proxies due for a health check: temporary bans whose time is up, then new proxies on
  probation. Each claimed proxy's due time moves the claim length ahead, so two checkers never probe
  the same proxy, and gets a claim stamp (field 'ck' of m:<id>): health_result applies a probe only
  while its stamp is still there, and a ban, unban or other change of state made meanwhile clears it.
  KEYS[1] the available zone
  Same slot: the keys it builds (m:<id>, each under cha:{ns}:px:) are named from ARGV[1], the prefix
    KEYS[1] starts with ({hash tag} included), so they share KEYS[1]'s slot (_common checks it).
  ARGV[1] the pool's key prefix
  ARGV[2] the most proxies to claim
  ARGV[3] claim length (ms)
  Reply: a flat list {pid, url, zone, source, claim, ...}, five entries per claimed proxy (url with
    credentials; zone 'tb' or 'new'; claim the stamp to hand to health_result); empty when none is due
]]
--#include _common
local P, limit, claim = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local out = {}
for _, zone in ipairs({'tb', 'new'}) do
  local left = limit - #out / 5
  if left <= 0 then break end
  local ids = redis.call('ZRANGEBYSCORE', P .. zone, '-inf', now, 'LIMIT', 0, left)
  for _, pid in ipairs(ids) do
    redis.call('ZADD', P .. zone, now + claim, pid)
    local mk = P .. 'm:' .. pid
    local m = redis.call('HMGET', mk, 'url', 'source')
    local stamp = zone .. ':' .. now
    redis.call('HSET', mk, 'ck', stamp)
    out[#out + 1] = pid
    out[#out + 1] = m[1] or ''
    out[#out + 1] = zone
    out[#out + 1] = m[2] or ''
    out[#out + 1] = stamp
  end
end
return out
