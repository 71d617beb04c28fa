--#include _common
-- Record a failed attempt under the lease. ARGV: prefix, id, token, error, retry (1/0),
-- backoff_base_ms, backoff_cap_ms. Retries wait in `delayed` for base * 2^(failures-1) (capped),
-- scaled by a jitter in [0.5, 1.5) so a burst of failures does not return in lockstep.
-- Reply: {'retry', due_ms} | {'dead'} | false (lease lost).
local id = ARGV[2]
local st, payload = fenced(id, ARGV[3])
if not st then return false end
local now = now_ms()
redis.call('ZREM', K_RUNNING, id)
local attempts = (tonumber(st.a) or 0) + 1
st.a = tostring(attempts)
st.e = ARGV[4]
st.w = nil
st.ut = fmt(now)
incr('failed', 1)
if ARGV[5] == '1' and attempts < (tonumber(st.ma) or 3) then
  local delay = math.min(tonumber(ARGV[7]), tonumber(ARGV[6]) * 2 ^ (attempts - 1))
  local t = redis.call('TIME')
  math.randomseed(tonumber(t[2]) + tonumber(st.k) * 7919)
  delay = delay * (0.5 + math.random())
  local due = now + math.floor(delay)
  st.s = 'w'
  st.due = fmt(due)
  redis.call('ZADD', K_DELAYED, fmt(due), id)
  save(id, st, payload)
  incr('retried', 1)
  return {'retry', fmt(due)}
end
to_dead(id, st, now, ARGV[4])
save(id, st, payload)
return {'dead'}
