--#include _common
-- Reclaim expired leases, oldest expiry first, at most `batch` per call (cost O(expired)).
-- ARGV: prefix, batch. Reply: {reclaimed, dead, more (1 if the batch was full)}.
local now = now_ms()
local batch = tonumber(ARGV[2])
local ids = redis.call('ZRANGEBYSCORE', K_RUNNING, '-inf', now, 'LIMIT', 0, batch)
local requeued, dead = 0, 0
for _, id in ipairs(ids) do
  local st, payload = load(id)
  if st and st.s == 'r' then
    if stall(id, st, payload, now, 'lease expired') == 'x' then dead = dead + 1 else requeued = requeued + 1 end
  else
    redis.call('ZREM', K_RUNNING, id)
  end
end
incr('reclaimed', requeued + dead)
wake(requeued)
return {requeued, dead, #ids == batch and 1 or 0}
