--#include _common
-- Give a running task back at once, without waiting for its lease to expire.
-- ARGV: prefix, id, token ('' = any), worker ('' = any), count_stall (1/0), reason.
-- Used for fast failover (a pool child died: the stall counts) and graceful shutdown (it does not).
-- Reply: 'q' (queued again), 'x' (dead), or false (not running under that token/worker).
local id = ARGV[2]
local st, payload = load(id)
if not st or st.s ~= 'r' then return false end
if ARGV[3] ~= '' and st.k ~= ARGV[3] then return false end
if ARGV[4] ~= '' and st.w ~= ARGV[4] then return false end
local now = now_ms()
local state
redis.call('ZREM', K_RUNNING, id)
if ARGV[5] == '1' then
  state = stall(id, st, now, ARGV[6])
  save(id, st, payload)
else
  st.w = nil
  st.ut = fmt(now)
  push_ready(id, st, true)
  save(id, st, payload)
  state = 'q'
end
incr('released', 1)
wake(state == 'q' and 1 or 0)
return state
