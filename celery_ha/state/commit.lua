--[[ Commit emitted items (and optionally a checkpoint) under the lease, all or nothing. A key the
  sink already holds is ignored, so a re-run after a crash never doubles an output.
  KEYS[1]  tasks (the fencing check)
  KEYS[9]  ckpt
  KEYS[10] stats
  KEYS[13] items (hash: item key -> item JSON)
  KEYS[14] itemlog (list: item keys in commit order)
  Same slot: the record buckets (_records.lua: t:<i>, tg) are named from ARGV[1], the prefix
    every KEYS entry starts with (its {hash tag} included), so they share KEYS[1]'s slot.
  ARGV[1] namespace prefix
  ARGV[2] task id
  ARGV[3] fencing token
  ARGV[4] checkpoint JSON, or '' to keep the checkpoint
  ARGV[5..] item key, item JSON, item key, item JSON, ...
  Reply: how many items were new (0 or more), or a refusal (nothing written): R_UNKNOWN, R_WAITING,
    R_STALE_TOKEN, R_DELAYED, R_COMPLETED, R_DEAD
]]
--#include _common
local _, _, refusal = fenced(ARGV[2], ARGV[3])
if refusal then return refusal end
local added = store_items(5)
if ARGV[4] ~= '' then redis.call('HSET', K_CKPT, ARGV[2], ARGV[4]) end
return added
