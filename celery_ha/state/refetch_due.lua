--[[ Queue the scheduled runs that are due (the sweep calls it, bounded per call): each record that
  waits for a scheduled run (_refetch.lua: completed or dead, with iv) and whose time came (ut + iv)
  starts a new run, as the operator's recrawl does (recrawl.lua), at the back of its band or through
  its host's queue (the host gate paces it); a dead one (a scheduled run that died for a reason that
  may pass, _common's to_dead) leaves `dead`, its attempts and stalls reset.
  Where: the earlier releases' index of ids (`refetch`) first, while it holds due ids (an id whose
  record no longer waits only leaves it); then the index by record bucket (`rfb`): each bucket whose
  score is due is read whole (HGETALL, one small hash), its due waiting records queued, and its
  score set to its earliest waiting run left, or the bucket dropped when none waits (an entry a
  record left early, or a deleted record, costs that one read).
  Bounded: at most `limit` runs queued, and buckets read until `limit` * 2 records were examined
  (a bucket of 16-32 records; at least one bucket per call): ~5 ms a call at most where a tenth of
  the waiting records are due (benchmarks/refetch_bench.py).
  KEYS[1]  tasks
  KEYS[2]  readyp
  KEYS[6]  dead (a dead id leaves it)
  KEYS[7]  completed (the id leaves the history)
  KEYS[8]  done (the id is no longer a finished dedup id)
  KEYS[10] stats (refetched: runs queued by a schedule; refetch_waiting: records waiting)
  KEYS[11] wake (one token per queued task)
  Same slot: the record buckets and their geometry (_records.lua: t:<i>, tg), the ready lists
    r:<priority>, a gated task's host keys (_hosts.lua), the refetch indexes (_refetch.lua: rfb,
    refetch) and the buckets of remembered ids (_remembered.lua: d:<3 chars>, d:~) are named from
    ARGV[1], the prefix every KEYS entry starts with (its {hash tag} included), so they share
    KEYS[1]'s slot (_common checks it).
  ARGV[1] namespace prefix
  ARGV[2] limit: most runs queued per call
  Reply: {queued, dropped (stale entries of the indexes: ids of `refetch` neither completed nor dead
    any more, buckets of `rfb` that held no waiting record), more (1 when due entries may be left)}
]]
--#include _common
local now = now_ms()
local limit = tonumber(ARGV[2])
local index = PREFIX .. 'rfb'
local queued = band_batch()
local count, dropped, more, left = 0, 0, 0, 0

-- The earlier releases' index of ids, until it is drained.
local due = redis.call('ZRANGEBYSCORE', K_REFETCH, '-inf', fmt(now), 'LIMIT', '0', tostring(limit + 1))
if #due > limit then
  more = 1
  due[#due] = nil
end
for _, id in ipairs(due) do
  local st, payload = load(id)
  if st and (st.s == 'c' or st.s == 'x') then
    requeue_finished(id, st, payload, queued, now) -- ZREMs it from `refetch`
    count = count + 1
  else
    redis.call('ZREM', K_REFETCH, id)
    dropped = dropped + 1
  end
end

-- The index by bucket.
if count < limit then
  local budget = limit * 2 -- records examined
  local buckets = redis.call('ZRANGEBYSCORE', index, '-inf', fmt(now), 'LIMIT', '0', tostring(limit))
  local j = 0
  while j < #buckets and count < limit and budget > 0 do
    j = j + 1
    local b = buckets[j]
    local flat = redis.call('HGETALL', PREFIX .. 't:' .. b)
    budget = budget - #flat / 2
    local next_due, stale = nil, true
    for k = 1, #flat, 2 do
      local at = raw_due(flat[k + 1]) -- most records of a bucket are not decoded
      local st, payload
      if at and at <= now and count < limit then
        st, payload = decode(flat[k + 1])
        if st.s == 'x' and string.byte(flat[k + 1], 1) ~= 64
            and not redis.call('ZSCORE', K_REFETCH, flat[k]) then
          -- Dead with iv, yet neither written as a waiting head ('@') nor in the earlier index: a
          -- final death (a permanent failure, a cancel) of an earlier release, which kept iv. Not a
          -- waiting run.
          st.iv = nil
          save(flat[k], st, payload)
          at = nil
        end
      end
      if at then
        stale = false
        if st then
          left = left + requeue_finished(flat[k], st, payload, queued, now)
          count = count + 1
        elseif not next_due or at < next_due then
          next_due = at
        end
      end
    end
    if next_due then
      redis.call('ZADD', index, fmt(next_due), b)
      if next_due <= now then more = 1 end -- the limit cut this bucket short
    else
      redis.call('ZREM', index, b)
      if stale then dropped = dropped + 1 end
    end
  end
  if j < #buckets or #buckets == limit then more = 1 end
end

band_flush(queued, 'RPUSH', now)
incr('refetched', count)
incr('refetch_waiting', -left)
wake(count)
return {count, dropped, more}
