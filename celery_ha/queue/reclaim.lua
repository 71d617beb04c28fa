--#include _common
-- Reclaim expired leases, oldest expiry first, at most `batch` per call (cost O(expired)).
-- ARGV: prefix, batch. Reply: {reclaimed, dead, more (1 if the batch was full)}.
-- The batch leaves `running` in one ZREM and re-enters the front of its bands in one LPUSH per band.
local now = now_ms()
local batch = tonumber(ARGV[2])
local ids = redis.call('ZRANGEBYSCORE', K_RUNNING, '-inf', now, 'LIMIT', 0, batch)
for j = 1, #ids, 1000 do
  redis.call('ZREM', K_RUNNING, unpack(ids, j, math.min(j + 999, #ids)))
end
local requeued, dead = 0, 0
local front = band_batch()
for _, id in ipairs(ids) do
  local st, payload = load(id)
  if st and st.s == 'r' then
    if stall(id, st, payload, now, 'lease expired', front) == 'x' then
      dead = dead + 1
    else
      requeued = requeued + 1
    end
  end
end
band_flush(front, 'LPUSH')
incr('reclaimed', requeued + dead)
wake(requeued)
return {requeued, dead, #ids == batch and 1 or 0}
