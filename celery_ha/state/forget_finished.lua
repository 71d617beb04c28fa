--[[ Dedup upkeep, run by the maintenance sweep: bounds the remembered (finished dedup) ids by the
  dedup TTL, and moves the older layouts into the buckets of _remembered.lua: the sorted set `done`
  (KEYS[8], the layout before it: its completion ms becomes the completion hour) and the 0.1
  releases' set `seen` (no completion time: finished now). An id the buckets hold already keeps
  their time (written later).
  A remembered id older than the TTL is forgotten once its record has left the completed history
  (until then the record says the task is finished, and enqueue's recrawl window decides). Its age is
  counted from the start of its completion hour: it may be forgotten up to an hour early. A task whose
  record waits for a scheduled run is not remembered (_refetch.lua: the record is its dedup memory,
  and enqueue's window reads the record's own time): the sweep never needs to look at records.
  The buckets are read in passes, bucket by bucket in the order of their bitmap `dk` (only those
  whose bit is set; one met empty has its bit cleared), a pass carried over calls by a cursor (stats
  'dcur'): a call stops once it examined `limit` ids or read BUCKETS_PER_CALL buckets. A pass starts
  only once the TTL may have reached the oldest remembered hour (stats 'dmin', a lower bound each pass
  renews from what it kept, 'dpmin' while it runs), so a sweep with nothing old enough to forget reads
  no bucket. Ids past the TTL that a pass kept because the completed history still holds them
  ('dkmin', their oldest hour, 'dpkmin' while a pass runs) start a pass at most once an hour ('dkat':
  the hour of the pass that kept them): a history longer than the TTL would otherwise have every
  sweep read every bucket.
  KEYS[7]  completed (an id still in the history is kept)
  KEYS[8]  done (the old sorted set: moved, then gone)
  KEYS[10] stats ('remembered', and the passes' dcur, dpmin, dmin, dpkmin, dkmin, dkat)
  Same slot: the buckets (d:<3 chars>, d:~), their bitmap dk and the old set `seen` are named from ARGV[1], the prefix
    every KEYS entry starts with (its {hash tag} included), so they share KEYS[1]'s slot (_common
    checks it).
  ARGV[1] namespace prefix
  ARGV[2] dedup TTL (ms); -1 = never forget
  ARGV[3] limit: most ids examined (and moved, from each old set) per call
  Reply: {forgotten, moved (from the old sets), more (1 while a pass is under way or an old set has
    ids left)}
]]
--#include _common
local now = now_ms()
local limit = tonumber(ARGV[3])
local ttl = tonumber(ARGV[2])
local forgotten, moved, more = 0, 0, 0
local BUCKETS_PER_CALL = 4096

-- The old layouts first, so a pass under way counts them.
local zset = redis.call('ZRANGE', K_DONE, '0', tostring(limit - 1), 'WITHSCORES')
if #zset > 0 then
  local oldest, ids = nil, {}
  for j = 1, #zset, 2 do
    local hour = done_hour(tonumber(zset[j + 1]))
    if not oldest or hour < oldest then oldest = hour end
    remember(zset[j], now, hour, true)
    ids[#ids + 1] = zset[j]
  end
  for j = 1, #ids, 1000 do
    redis.call('ZREM', K_DONE, unpack(ids, j, math.min(j + 999, #ids)))
  end
  lower_dmin(oldest)
  moved = #ids
  if redis.call('EXISTS', K_DONE) == 1 then more = 1 end
end

local legacy = PREFIX .. 'seen'
local ids = redis.call('SPOP', legacy, limit)
if #ids > 0 then
  for _, id in ipairs(ids) do remember(id, now, nil, true) end
  moved = moved + #ids
  if redis.call('EXISTS', legacy) == 1 then more = 1 end
end

if ttl >= 0 then
  local cutoff = done_hour(now - ttl) -- an id of this hour or older is past the TTL
  local hour_now = done_hour(now)
  local got = redis.call('HMGET', K_STATS, 'dcur', 'dpmin', 'dpkmin')
  local cur, pmin, kmin = tonumber(got[1]), tonumber(got[2]), tonumber(got[3])
  if not cur then
    local last = redis.call('HMGET', K_STATS, 'dmin', 'dkmin', 'dkat')
    local dmin, dkmin, dkat = tonumber(last[1]), tonumber(last[2]), tonumber(last[3])
    -- Ids old enough that only the history kept: looked at again once an hour, not at every sweep.
    local kept_due = dkmin and dkmin <= cutoff and (not dkat or hour_now > dkat)
    if not dmin or dmin <= cutoff or kept_due then cur = 0 end
  end
  if cur then
    pmin = pmin or hour_now -- ids remembered while the pass runs are this hour or later
    local examined, visited = 0, 0
    local next_marked = bitmap_reader(K_DK)
    while cur <= DONE_BUCKETS and examined < limit and visited < BUCKETS_PER_CALL do
      cur = next_marked(cur)
      local key = done_bucket(cur)
      local flat = redis.call('HGETALL', key)
      visited = visited + 1
      examined = examined + #flat / 2
      local old, fields, hours, emptied = {}, {}, {}, 0
      for j = 1, #flat, 2 do
        local hour = tonumber(flat[j + 1])
        if hour <= cutoff then
          old[#old + 1] = done_id(cur, flat[j])
          fields[#fields + 1] = flat[j]
          hours[#hours + 1] = hour
        elseif hour < pmin then
          pmin = hour
        end
      end
      for j = 1, #old, 1000 do
        local last = math.min(j + 999, #old)
        local kept = redis.call('ZMSCORE', K_COMPLETED, unpack(old, j, last))
        local gone = {}
        for k = 1, last - j + 1 do
          if kept[k] then -- past the TTL, still in the completed history: a later pass forgets it
            kmin = math.min(kmin or hours[j + k - 1], hours[j + k - 1])
          else
            gone[#gone + 1] = fields[j + k - 1]
          end
        end
        if #gone > 0 then
          redis.call('HDEL', key, unpack(gone))
          emptied = emptied + #gone
          incr('remembered', -#gone)
          forgotten = forgotten + #gone
        end
      end
      if emptied * 2 == #flat and cur < DONE_BUCKETS then redis.call('SETBIT', K_DK, tostring(cur), '0') end
      cur = cur + 1
    end
    if cur > DONE_BUCKETS then -- the pass is over: no remembered id is older than what it kept
      redis.call('HSET', K_STATS, 'dmin', tostring(pmin))
      redis.call('HDEL', K_STATS, 'dcur', 'dpmin', 'dpkmin')
      if kmin then
        redis.call('HSET', K_STATS, 'dkmin', tostring(kmin), 'dkat', tostring(hour_now))
      else
        redis.call('HDEL', K_STATS, 'dkmin', 'dkat')
      end
    else
      redis.call('HSET', K_STATS, 'dcur', tostring(cur), 'dpmin', tostring(pmin))
      if kmin then redis.call('HSET', K_STATS, 'dpkmin', tostring(kmin)) end
      more = 1
    end
  end
end
return {forgotten, moved, more}
