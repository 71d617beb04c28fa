--[[ Save a task's checkpoint (its resume point) under the lease.
  KEYS[1] tasks (the fencing check)
  KEYS[9] ckpt
  Same slot: the record buckets (_records.lua: t:<i>, tg) are named from ARGV[1], the prefix
    every KEYS entry starts with (its {hash tag} included), so they share KEYS[1]'s slot.
  ARGV[1] namespace prefix
  ARGV[2] task id
  ARGV[3] fencing token
  ARGV[4] checkpoint JSON
  Reply: 1 saved, or a refusal (nothing written): R_UNKNOWN, R_WAITING, R_STALE_TOKEN, R_DELAYED,
    R_COMPLETED, R_DEAD
]]
--#include _common
local _, _, refusal = fenced(ARGV[2], ARGV[3])
if refusal then return refusal end
redis.call('HSET', K_CKPT, ARGV[2], ARGV[4])
return 1
