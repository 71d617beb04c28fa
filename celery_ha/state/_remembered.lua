--[[ Shared include (pulled in by _common, below the K_* keys): the memory of finished dedup ids, the
  "remembered" ids a dedup enqueue treats as duplicates. Exact (no false positive: one would silently
  drop a URL) and compact: ~13 bytes of listpack per id instead of a sorted-set entry's ~110.
  Layout (same hash tag as KEYS[1]: every key below is named from ARGV[1], the prefix):
    d:<c1 c2 h>  hash, one of 62 * 62 * 31 = 119,164 buckets. A task id is 12 base62 characters
                 c1..c12 (celery_ha/state/ids.py); its bucket is named by c1, c2 and h = the
                 character of index floor(idx(c3) / 2); the field is 7 bytes, big-endian: 3 of
                 idx(c4..c7) in base 62, then 4 of (idx(c8..c12) in base 62) * 2 + idx(c3) mod 2, so
                 bucket + field give back the id exactly. The value is the completion hour: whole
                 hours since 2026-01-01T00:00Z on the Redis clock (a 16-bit integer of the listpack
                 until 2029-09, then 24-bit), read back as the start of that hour: a time read from
                 here is up to an hour early, so a recrawl window or the dedup TTL ends up to an hour
                 sooner, and a sitemap lastmod within the hour of the crawl counts as newer (callers
                 use the record's exact time while the completed history holds it).
    d:~          hash: any other id (not 12 base62 characters) -> completion hour, as is.
    dk           string, a bitmap of the buckets that may hold ids (bit i = bucket i, set when an id
                 lands in an empty bucket; a bucket emptied later keeps its bit until the sweep's next
                 pass meets it empty): the sweep reads 15 KB of it instead of 119,164 empty buckets.
  A bucket stays a listpack while it holds at most hash-max-listpack-entries (ziplist on 6.2) fields:
  ~84 per bucket at 10M ids per shard (characters 0-7 of an id are 1.25x likelier, so the fullest
  buckets hold ~1.8x that), so the default 512 serves ~30M ids per shard; beyond, a bucket becomes a
  plain hash table (still exact, several times bigger) unless the setting is raised (README "Limits
  of the task layer": 1024 serves ~65M per shard).
  The count of remembered ids is stats 'remembered'. The sweep's state, in stats too: 'dcur' (the next
  bucket of a pass in progress), 'dpmin' (the oldest hour the pass kept), 'dmin' (no remembered id is
  older than this hour: the sweep starts a pass only once the TTL may have reached it).
  Before this layout, finished ids lived in the sorted set `done` (KEYS[8]; score = completion ms): it
  is still read (exact time) until the sweep has moved it into the buckets.
  Uses IDX and CHR of _base62 (included by _common before it).
  Defines: DONE_BUCKETS, K_DK (the bitmap), done_hour(ms), hour_ms(hour), done_slot(id) -> key, field,
  bucket index; bitmap_reader(key) -> next_marked(i);
  done_bucket(i) -> key of bucket i (0-based; DONE_BUCKETS is d:~); done_id(i, field) -> the id;
  remember(id, now, hour, nx) -> 1 when newly remembered; done_time(id) -> completion ms or nil;
  forget_done(id); lower_dmin(hour).
]]
local DONE_EPOCH_MS = 1767225600000 -- 2026-01-01T00:00:00Z, hour 0
local HOUR_MS = 3600000
local DONE_BUCKETS = 62 * 62 * 31
local K_DK
--#per-call
K_DK = PREFIX .. 'dk'
--#end-per-call

local function done_hour(ms)
  return math.floor((ms - DONE_EPOCH_MS) / HOUR_MS)
end

local function hour_ms(hour)
  return DONE_EPOCH_MS + tonumber(hour) * HOUR_MS
end

local sbyte, schar
--#per-call
sbyte, schar = string.byte, string.char -- a function library sees no globals when it loads
--#end-per-call
local bucket_keys -- bucket index -> key, for the ids of this call
--#per-call
bucket_keys = {}
--#end-per-call
local function done_slot(id)
  if #id == 12 then
    local b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12 = sbyte(id, 1, 12)
    local v1, v2, v3, v4, v5, v6 = IDX[b1], IDX[b2], IDX[b3], IDX[b4], IDX[b5], IDX[b6]
    local v7, v8, v9, v10, v11, v12 = IDX[b7], IDX[b8], IDX[b9], IDX[b10], IDX[b11], IDX[b12]
    if v1 and v2 and v3 and v4 and v5 and v6 and v7 and v8 and v9 and v10 and v11 and v12 then
      local lo = v3 % 2
      local h = (v3 - lo) / 2
      local i = (v1 * 62 + v2) * 31 + h
      local key = bucket_keys[i]
      if not key then
        key = PREFIX .. 'd:' .. schar(b1, b2, CHR[h])
        bucket_keys[i] = key
      end
      local a = ((v4 * 62 + v5) * 62 + v6) * 62 + v7
      local b = (((((v8 * 62 + v9) * 62 + v10) * 62 + v11) * 62 + v12) * 2) + lo
      local a3, b4 = a % 256, b % 256
      a = (a - a3) / 256
      b = (b - b4) / 256
      local a2, b3 = a % 256, b % 256
      local b2 = ((b - b3) / 256) % 256
      return key, schar((a - a2) / 256, a2, a3, (b - b3 - b2 * 256) / 65536, b2, b3, b4), i
    end
  end
  return PREFIX .. 'd:~', id, DONE_BUCKETS
end

-- A reader of a buckets bitmap (K_DK, or the carried ids' cdk): next_marked(i) -> the first bucket from
-- i on that may hold ids (DONE_BUCKETS, the ~ bucket, always may); it reads a 4 KB window of the
-- bitmap at a time and skips whole zero bytes.
local function bitmap_reader(key)
  local map, map_from = nil, 0 -- the window, from byte map_from
  local function marked(i) -- whether bucket i may hold ids, and the next bucket worth a look
    if i >= DONE_BUCKETS then return true end
    local byte = math.floor(i / 8)
    if not map or byte < map_from or byte >= map_from + 4096 then
      map_from = byte
      map = redis.call('GETRANGE', key, tostring(byte), tostring(byte + 4095))
    end
    local b = string.byte(map, byte - map_from + 1) or 0
    if b == 0 then return false, (byte + 1) * 8 end
    return math.floor(b / 2 ^ (7 - i % 8)) % 2 == 1, i + 1
  end
  return function(i)
    local hit, skip_to = marked(i)
    while not hit and skip_to <= DONE_BUCKETS do
      i = skip_to
      hit, skip_to = marked(i)
    end
    return hit and i or DONE_BUCKETS
  end
end

local function done_bucket(i)
  if i >= DONE_BUCKETS then return PREFIX .. 'd:~' end
  local c1, rest = math.floor(i / 1922), i % 1922
  local c2, h = math.floor(rest / 31), rest % 31
  return PREFIX .. 'd:' .. string.sub(ALPHA, c1 + 1, c1 + 1) .. string.sub(ALPHA, c2 + 1, c2 + 1)
    .. string.sub(ALPHA, h + 1, h + 1)
end

-- The id stored in bucket i under `field` (the inverse of done_slot).
local function done_id(i, field)
  if i >= DONE_BUCKETS then return field end
  local f1, f2, f3, f4, f5, f6, f7 = string.byte(field, 1, 7)
  local a = (f1 * 256 + f2) * 256 + f3
  local b = ((f4 * 256 + f5) * 256 + f6) * 256 + f7
  local c3 = (i % 31) * 2 + b % 2
  b = (b - b % 2) / 2
  local c12 = b % 62 b = (b - c12) / 62
  local c11 = b % 62 b = (b - c11) / 62
  local c10 = b % 62 b = (b - c10) / 62
  local c9 = b % 62
  local c8 = (b - c9) / 62
  local c7 = a % 62 a = (a - c7) / 62
  local c6 = a % 62 a = (a - c6) / 62
  local c5 = a % 62
  local c4 = (a - c5) / 62
  local c12i = i % 1922
  return string.char(CHR[(i - c12i) / 1922], CHR[(c12i - c12i % 31) / 31], CHR[c3], CHR[c4], CHR[c5],
    CHR[c6], CHR[c7], CHR[c8], CHR[c9], CHR[c10], CHR[c11], CHR[c12])
end

-- Remember `id` as finished at `now` (ms), or in `hour` when given; with nx, an id remembered already
-- keeps its time (the sweep's move of the old sets: what the buckets hold was written later).
local function remember(id, now, hour, nx)
  local key, field, i = done_slot(id)
  local added = redis.call(nx and 'HSETNX' or 'HSET', key, field, tostring(hour or done_hour(now)))
  if added == 1 then
    redis.call('HINCRBY', K_STATS, 'remembered', 1)
    if i < DONE_BUCKETS and redis.call('HLEN', key) == 1 then redis.call('SETBIT', K_DK, i, 1) end
  end
  return added
end

-- The completion time (ms) of a remembered id: exact from the old sorted set, else the start of its
-- hour; nil when not remembered.
local function done_time(id)
  local key, field = done_slot(id)
  local hour = redis.call('HGET', key, field)
  if hour then return hour_ms(hour) end
  local at = redis.call('ZSCORE', K_DONE, id)
  if at then return tonumber(at) end
  return nil
end

local function forget_done(id)
  local key, field = done_slot(id)
  if redis.call('HDEL', key, field) == 1 then redis.call('HINCRBY', K_STATS, 'remembered', -1) end
  redis.call('ZREM', K_DONE, id)
end

-- An id remembered with an older hour than the sweep's lower bound (moved from the old sets): lower it.
local function lower_dmin(hour)
  for _, field in ipairs({'dmin', 'dpmin'}) do
    local cur = tonumber(redis.call('HGET', K_STATS, field))
    if cur and hour < cur then redis.call('HSET', K_STATS, field, tostring(hour)) end
  end
end
