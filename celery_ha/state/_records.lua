--[[ Shared include (pulled in by _common, and by records.lua, once K_TASKS and PREFIX are defined):
  where task records live. A record is one field of a small hash, a bucket, instead of an entry of
  one namespace-wide hash: a hash of 10M entries doubles its table in steps that every write pays
  for a while (enqueue calls over 10 ms at depth), and each of its entries is three allocations
  (~90 bytes of overhead beside the record). A bucket of 16-32 records stays a listpack (one
  allocation, ~3 bytes per field and value) while its values fit hash-max-listpack-value (default
  64 bytes: a record is longer, so the compact form needs the setting raised, README "Limits of the
  task layer"; otherwise a bucket is an ordinary small hash, as big as before, and only the flat
  cost remains).
  The bucket count grows with the records, by linear hashing: bucket i is t:<i>; with level L and
  split pointer S, an id whose hash is h lives in bucket h mod 2^L, or h mod 2^(L+1) when that is
  below S. When the records pass LOAD per bucket, bucket S is split: its records whose hash mod
  2^(L+1) is S + 2^L move to that new bucket, S advances, and once it reaches 2^L, L grows and S
  goes back to 0. A split moves one bucket's records (a dozen or two): every call stays bounded, at
  any depth. Buckets never merge back (an emptied one is no key at all).
  Keys (same hash tag as KEYS[1]: named from PREFIX, ARGV[1]):
    tg      hash: l (level L), s (split pointer S), n (records in buckets); mv (set by celery-ha migrate: the
            namespace the tasks moved to; claim.lua refuses a claim while it is set)
    t:<i>   hash: id -> record, bucket i
    K_TASKS the one hash of earlier releases (KEYS[1]); a record still in it is read from it and
            moves into its bucket at its next write, so a live namespace changes layout as it runs.
    rfb     zset: the refetch index of _refetch.lua (record bucket -> a lower bound of its waiting
            records' due times): when the bucket a split moves records out of is indexed, the new
            bucket is indexed at the earliest due time of the waiting records among them (none
            waits: not indexed), so they stay indexed; without _refetch.lua (a reader, a test's
            writer), at the split bucket's score.
  The hash of an id of 12 base62 characters (celery_ha/state/ids.py) is its characters 1-5 read as
  a base-62 number (62^5 > 2^29); any other id hashes by h = (31h + byte) mod 2^31 over its bytes.
  Uses IDX of _base62 (included before it). Defines: rec_get(id) -> raw or false; rec_set(id, raw); rec_del(ids); rec_batch() / rec_settle()
  (a batch of writes counts its new records once, at the settle).
]]
local REC_LOAD = 16 -- records per bucket before a split (benchmarks/RESULTS.md: 64 scanned longer listpacks)
local K_GEOM
local rec_level, rec_split, rec_mod -- the geometry, read at the first use (rec_mod = 2^level)
local rec_old                       -- whether K_TASKS exists, read at the first need
local rec_new, rec_batched
local rec_moved_due -- _refetch.lua's rf_moved_due when included (set per call there), else nil
--#per-call
K_GEOM = PREFIX .. 'tg'
rec_level, rec_split, rec_mod, rec_old = nil, nil, nil, nil
rec_new, rec_batched, rec_moved_due = 0, false, nil
--#end-per-call

local function rec_hash(id)
  if #id == 12 then
    local b1, b2, b3, b4, b5 = string.byte(id, 1, 5)
    local v1, v2, v3, v4, v5 = IDX[b1], IDX[b2], IDX[b3], IDX[b4], IDX[b5]
    if v1 and v2 and v3 and v4 and v5 then
      return (((v1 * 62 + v2) * 62 + v3) * 62 + v4) * 62 + v5
    end
  end
  local h = 0
  for j = 1, #id do h = (h * 31 + string.byte(id, j)) % 2147483648 end
  return h
end

local function rec_geometry()
  local g = redis.call('HMGET', K_GEOM, 'l', 's')
  rec_level, rec_split = tonumber(g[1]) or 0, tonumber(g[2]) or 0
  rec_mod = 2 ^ rec_level
end

local function rec_index(h)
  if not rec_level then rec_geometry() end
  local b = h % rec_mod
  if b < rec_split then b = h % (rec_mod * 2) end
  return b
end

local function rec_key(id)
  return PREFIX .. 't:' .. string.format('%d', rec_index(rec_hash(id)))
end

local function rec_legacy()
  if rec_old == nil then rec_old = redis.call('EXISTS', K_TASKS) == 1 end
  return rec_old
end

local function rec_get(id)
  local raw = redis.call('HGET', rec_key(id), id)
  if not raw and rec_legacy() then raw = redis.call('HGET', K_TASKS, id) end
  return raw
end

-- Split bucket S (see the header): bounded by one bucket's records.
local function rec_split_one()
  local from = rec_split
  local to = from + rec_mod
  local key = PREFIX .. 't:' .. string.format('%d', from)
  local flat = redis.call('HGETALL', key)
  local moved, names = {}, {}
  for j = 1, #flat, 2 do
    if rec_hash(flat[j]) % (rec_mod * 2) == to then
      moved[#moved + 1] = flat[j]
      moved[#moved + 1] = flat[j + 1]
      names[#names + 1] = flat[j]
    end
  end
  if #names > 0 then
    local dest = string.format('%d', to)
    redis.call('HSET', PREFIX .. 't:' .. dest, unpack(moved))
    redis.call('HDEL', key, unpack(names))
    -- The refetch index (rfb, _refetch.lua) holds buckets: moved waiting records stay indexed.
    local due = redis.call('ZSCORE', PREFIX .. 'rfb', string.format('%d', from))
    if due and rec_moved_due then due = rec_moved_due(moved) end
    if due then redis.call('ZADD', PREFIX .. 'rfb', 'LT', due, dest) end
  end
  rec_split = from + 1
  if rec_split >= rec_mod then
    rec_level, rec_split, rec_mod = rec_level + 1, 0, rec_mod * 2
  end
  redis.call('HSET', K_GEOM, 'l', string.format('%d', rec_level), 's', string.format('%d', rec_split))
end

-- Count `k` records more (or fewer) in the buckets, splitting while they pass LOAD per bucket.
local function rec_count(k)
  if k == 0 then return end
  local n = redis.call('HINCRBY', K_GEOM, 'n', k)
  if k < 0 then return end
  if not rec_level then rec_geometry() end
  while n > REC_LOAD * (rec_mod + rec_split) do rec_split_one() end
end

local function rec_set(id, raw)
  if redis.call('HSET', rec_key(id), id, raw) == 1 then
    if rec_legacy() then redis.call('HDEL', K_TASKS, id) end
    if rec_batched then rec_new = rec_new + 1 else rec_count(1) end
  end
end

-- Writes until rec_settle() count their new records at the settle (one HINCRBY for a batch).
local function rec_batch()
  rec_batched = true
end

local function rec_settle()
  rec_batched = false
  local k = rec_new
  rec_new = 0
  rec_count(k)
end

local function rec_del(ids)
  local gone = 0
  for _, id in ipairs(ids) do gone = gone + redis.call('HDEL', rec_key(id), id) end
  if rec_legacy() then redis.call('HDEL', K_TASKS, unpack(ids)) end
  rec_count(-gone)
end
