--#include _common
-- Complete a task under its lease. ARGV: prefix, id, token, history_max, history_age_ms.
-- The completed history is bounded: the oldest records beyond count or age are dropped a few per
-- call (amortized), while dedup remembers finished ids in the lean `seen` set.
local id = ARGV[2]
local st, payload = fenced(id, ARGV[3])
if not st then return false end
local now = now_ms()
redis.call('ZREM', K_RUNNING, id)
redis.call('HDEL', K_CKPT, id)
st.s = 'c'
st.w = nil
st.ut = now
st.e = nil
save(id, st, payload)
redis.call('ZADD', K_COMPLETED, now, id)
if st.dd then redis.call('SADD', K_SEEN, id) end
incr('completed', 1)
local hmax, hage = tonumber(ARGV[4]), tonumber(ARGV[5])
local over = redis.call('ZCARD', K_COMPLETED) - hmax
if over > 0 then
  local old = redis.call('ZPOPMIN', K_COMPLETED, math.min(over, 8))
  for j = 1, #old, 2 do redis.call('HDEL', K_TASKS, old[j]) end
end
local aged = redis.call('ZRANGEBYSCORE', K_COMPLETED, '-inf', now - hage, 'LIMIT', 0, 8)
for _, old in ipairs(aged) do
  redis.call('ZREM', K_COMPLETED, old)
  redis.call('HDEL', K_TASKS, old)
end
return 1
