--[[ Set (or clear) the per-domain overrides every worker reads at acquire, stored as
  "rate_n rate_ms budget_n budget_ms" (0 = use the worker's default). A new rate drops the domain's
  cool-downs, which were computed with the old one.
  KEYS[1] the available zone
  Same slot: the keys it builds (cd:<domain>, dcfg, dx:<domain>, each under cha:{ns}:px:) are named from ARGV[1], the
    prefix KEYS[1] starts with ({hash tag} included), so they share KEYS[1]'s slot (_common checks it).
  ARGV[1] the pool's key prefix
  ARGV[2] the domain (normalized)
  ARGV[3] which override: 'rate' or 'budget'
  ARGV[4] requests per window (0 clears this override)
  ARGV[5] window (ms)
  Reply: the stored string, or '' when no override is left for the domain
]]
--#include _common
local P, domain, field, n, ms = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local key = P .. 'dcfg'
local cur = numargs(redis.call('HGET', key, domain) or '0 0 0 0')
for i = 1, 4 do cur[i] = cur[i] or 0 end
if field == 'rate' then
  cur[1], cur[2] = n, ms
  redis.call('DEL', P .. 'cd:' .. domain, P .. 'dx:' .. domain) -- both judged with the old rate
else
  cur[3], cur[4] = n, ms
end
if cur[1] == 0 and cur[3] == 0 then
  redis.call('HDEL', key, domain)
  return ''
end
local text = string.format('%d %d %d %d', cur[1], cur[2], cur[3], cur[4])
redis.call('HSET', key, domain, text)
return text
