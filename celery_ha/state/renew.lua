--#include _common
-- Extend a lease. ARGV: prefix, id, token, ttl_ms. Reply: new expiry (ms) or false (lease lost).
local st = fenced(ARGV[2], ARGV[3])
if not st then return false end
local expiry = now_ms() + tonumber(ARGV[4])
redis.call('ZADD', K_RUNNING, 'XX', fmt(expiry), ARGV[2])
return fmt(expiry)
