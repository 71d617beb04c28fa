--[[ Read task records for Python readers (task info, listings, counts, metrics): the raw records
  of ids, wherever _records.lua keeps them (a bucket t:<i> under the bucket geometry tg, or the one
  hash of earlier releases). A script, so the geometry and the buckets are read at one instant: a
  split between the two could otherwise move a record away from under the reader.
  KEYS[1]  tasks (the hash of earlier releases)
  Same slot: the buckets t:<i> and the geometry tg are named from ARGV[1], the prefix KEYS[1] starts
    with (its {hash tag} included).
  ARGV[1]  namespace prefix
  ARGV[2..] task ids
  Reply: one raw record per id, in order (nil where there is none).
]]
local K_TASKS, PREFIX = KEYS[1], ARGV[1]
--#include _base62
--#include _records
local out = {}
for i = 2, #ARGV do out[i - 1] = rec_get(ARGV[i]) end
return out
