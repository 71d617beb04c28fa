--#include _common
-- Forget a proxy entirely. KEYS[1] = available zone; ARGV: 1 prefix, 2 pid. Returns 1 if it existed.
local P, pid = ARGV[1], ARGV[2]
if redis.call('SISMEMBER', P .. 'all', pid) == 0 and redis.call('EXISTS', P .. 'm:' .. pid) == 0 then
  return 0
end
forget(P, pid)
return 1
