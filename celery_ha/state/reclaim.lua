--[[ Reclaim expired leases, oldest expiry first, at most `batch` per call (cost O(expired)).
  Bulk commands per 1000 ids: the batch leaves `running` in one ZREM and re-enters the front of its
  bands in one LPUSH per band; each record is read and written back in its bucket (_records.lua).
  KEYS[1]  tasks
  KEYS[2]  readyp
  KEYS[5]  running
  KEYS[6]  dead (a task past max_stalls)
  KEYS[10] stats
  KEYS[11] wake (one token per requeued task)
  Same slot: the record buckets (_records.lua: t:<i>, tg), the ready lists r:<priority> and a gated task's host keys (_hosts.lua) it may touch are
    named from ARGV[1], the prefix every KEYS entry starts with (its {hash tag} included), so they
    share KEYS[1]'s slot (_common checks it).
  ARGV[1] namespace prefix
  ARGV[2] batch (most leases reclaimed per call)
  ARGV[3] spare_from: start (ms, Redis clock) of a stretch in which no worker could reach Redis
    (worker_registry.quiet_window); a lease that expired inside it goes back to the queue without a
    stall: the platform was down, not the task. "0" with ARGV[4] "0" = none.
  ARGV[4] spare_to: end of that stretch (ms, Redis clock)
  ARGV[5] "1": the reply names the tasks too (tracing on: each gets a span); optional, default "0"
  Reply: {requeued, dead, more (1 if expired leases remain)}; with ARGV[5] "1" two lists follow:
    {requeued ids}, {dead ids}
]]
--#include _common
local now = now_ms()
local batch = tonumber(ARGV[2])
local ids = redis.call('ZRANGEBYSCORE', K_RUNNING, '-inf', fmt(now), 'LIMIT', '0', ARGV[2])
local requeued, dead, spared_count = 0, 0, 0
local named = ARGV[5] == '1'
local requeued_ids, dead_ids = {}, {}
local front = band_batch()
-- The expired leases inside the spare stretch (a subset of `ids`: both lists are in expiry order).
local spared = {}
local spare_from, spare_to = tonumber(ARGV[3]) or 0, math.min(tonumber(ARGV[4]) or 0, now)
if spare_to > spare_from then
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', K_RUNNING, fmt(spare_from), fmt(spare_to),
                                 'LIMIT', '0', ARGV[2])) do
    spared[id] = true
  end
end
for j = 1, #ids, 1000 do
  local last = math.min(j + 999, #ids)
  redis.call('ZREM', K_RUNNING, unpack(ids, j, last))
  local raws = {}
  for k = j, last do raws[k - j + 1] = rec_get(ids[k]) end
  for k = 1, last - j + 1 do
    if raws[k] then
      local id = ids[j + k - 1]
      local st, payload = decode(raws[k])
      if st.s == 'r' then
        -- Its holder may be stopped or gone mid-request: an unreported request holds the host's
        -- slot until it can no longer be in flight (host_end's hold, under a concurrency limit).
        if st.h then host_end(st.h, now, false, false, false, id, st.k) end
        if spared[id] then
          st.w = nil
          st.ut = fmt(now)
          st.s = 'q'
          band_add(front, st.p or '0', id, st.h)
          requeued = requeued + 1
          spared_count = spared_count + 1
          if named then requeued_ids[#requeued_ids + 1] = id end
        elseif stall(id, st, now, 'lease expired', front) == 'x' then
          dead = dead + 1
          if named then dead_ids[#dead_ids + 1] = id end
        else
          requeued = requeued + 1
          if named then requeued_ids[#requeued_ids + 1] = id end
        end
        save(id, st, payload)
      end
    end
  end
end
band_flush(front, 'LPUSH', now)
incr('reclaimed', requeued + dead)
if spared_count > 0 then incr('reclaimed_in_outage', spared_count) end
wake(requeued)
-- `more` only when expired leases remain (a full batch alone would cost the caller an empty call).
local more = #ids == batch and #redis.call('ZRANGEBYSCORE', K_RUNNING, '-inf', fmt(now), 'LIMIT', '0', '1') or 0
if named then return {requeued, dead, more, requeued_ids, dead_ids} end
return {requeued, dead, more}
