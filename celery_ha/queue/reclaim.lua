--#include _common
-- Reclaim expired leases, oldest expiry first, at most `batch` per call (cost O(expired)).
-- ARGV: prefix, batch. Reply: {reclaimed, dead, more (1 if the batch was full)}.
-- Per task this is stall() from _common, batched: the ids leave `running` in one ZREM, requeued ids
-- go back to the front of their band in one LPUSH per band (same final order as one LPUSH each) and
-- each band is marked ready once.
local now = now_ms()
local batch = tonumber(ARGV[2])
local ids = redis.call('ZRANGEBYSCORE', K_RUNNING, '-inf', now, 'LIMIT', 0, batch)
for j = 1, #ids, 1000 do
  redis.call('ZREM', K_RUNNING, unpack(ids, j, math.min(j + 999, #ids)))
end
local requeued, dead = 0, 0
local bands, front = {}, {}
for _, id in ipairs(ids) do
  local st, payload = load(id)
  if st and st.s == 'r' then
    st.st = (st.st or 0) + 1
    st.w = nil
    st.ut = fmt(now)
    if st.st > (st.ms or 3) then
      to_dead(id, st, now, 'stalled ' .. st.st .. ' times: lease expired')
      dead = dead + 1
    else
      local p = st.p or 0
      local list = front[p]
      if not list then
        list = {}
        front[p] = list
        bands[#bands + 1] = p
      end
      list[#list + 1] = id
      st.s = 'q'
      requeued = requeued + 1
    end
    save(id, st, payload)
  end
end
for _, p in ipairs(bands) do
  local list = front[p]
  for j = 1, #list, 1000 do
    redis.call('LPUSH', ready_key(p), unpack(list, j, math.min(j + 999, #list)))
  end
  redis.call('ZADD', K_READYP, -p, tostring(p))
end
incr('reclaimed', requeued + dead)
wake(requeued)
return {requeued, dead, #ids == batch and 1 or 0}
