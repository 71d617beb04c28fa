--#include _common
-- Commit emitted items (and optionally a checkpoint) under the lease, all or nothing.
-- KEYS 12 items, 13 itemlog. ARGV: prefix, id, token, checkpoint JSON or '', then key, item pairs.
-- A key already held is ignored, so a re-run after a crash never doubles an output.
-- Reply: number of new items, or false (lease lost: nothing written).
if not fenced(ARGV[2], ARGV[3]) then return false end
local added = 0
for i = 5, #ARGV, 2 do
  if redis.call('HSETNX', KEYS[12], ARGV[i], ARGV[i + 1]) == 1 then
    redis.call('RPUSH', KEYS[13], ARGV[i])
    added = added + 1
  end
end
if ARGV[4] ~= '' then redis.call('HSET', K_CKPT, ARGV[2], ARGV[4]) end
incr('items', added)
incr('items_duplicate', (#ARGV - 4) / 2 - added)
return added
