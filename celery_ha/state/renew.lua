--[[ Extend a lease from now.
  KEYS[1] tasks (the fencing check)
  KEYS[5] running
  Same slot: the record buckets (_records.lua: t:<i>, tg) are named from ARGV[1], the prefix
    every KEYS entry starts with (its {hash tag} included), so they share KEYS[1]'s slot.
  ARGV[1] namespace prefix
  ARGV[2] task id
  ARGV[3] fencing token
  ARGV[4] lease ttl (ms)
  Reply: the new expiry (ms, as a string), or a refusal (nothing written): R_UNKNOWN, R_WAITING,
    R_STALE_TOKEN, R_DELAYED, R_COMPLETED, R_DEAD
]]
--#include _common
local _, _, refusal = fenced(ARGV[2], ARGV[3])
if refusal then return refusal end
local expiry = now_ms() + tonumber(ARGV[4])
redis.call('ZADD', K_RUNNING, 'XX', fmt(expiry), ARGV[2])
return fmt(expiry)
