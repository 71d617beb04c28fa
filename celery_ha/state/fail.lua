--[[ Record a failed attempt under the lease. A retry waits in `delayed` for
  base * 2^(failures-1) (capped), scaled by a jitter in [0.5, 1.5) so a burst of failures does not
  return in lockstep; past max_attempts, or without retry, the task is dead. A scheduled task
  (_refetch.lua) dead past max_attempts keeps its next regular run (its errors may pass: an outage);
  one failed without retry (a permanent error: 404/410, robots.txt, PermanentError) ends its schedule.
  KEYS[1]  tasks
  KEYS[3]  delayed
  KEYS[5]  running
  KEYS[6]  dead
  KEYS[10] stats (refetch_waiting: a death that keeps its schedule waits for its next run)
  Same slot: the record buckets (_records.lua: t:<i>, tg), a gated task's host keys (_hosts.lua) and
    the refetch schedule's keys (_refetch.lua: sched, rfb) are named from ARGV[1], the prefix every
    KEYS entry starts with (its {hash tag} included), so they share KEYS[1]'s slot (_common checks it).
  ARGV[1] namespace prefix
  ARGV[2] task id
  ARGV[3] fencing token
  ARGV[4] error text
  ARGV[5] retry (1/0; 0: a permanent error, which also ends a refetch schedule)
  ARGV[6] backoff base (ms)
  ARGV[7] backoff cap (ms)
  Reply: {'retry', due_ms} or {'dead'}; or a refusal (nothing written): R_UNKNOWN, R_WAITING,
    R_STALE_TOKEN, R_DELAYED, R_COMPLETED, R_DEAD
]]
--#include _common
local id = ARGV[2]
local st, payload, refusal = fenced(id, ARGV[3])
if refusal then return refusal end
local now = now_ms()
redis.call('ZREM', K_RUNNING, id)
-- A request it let go and never reported over (a soft time limit cut it mid-request) may still be in
-- flight: under a concurrency limit the host's slot stays held until it can no longer be (host_end's
-- hold, as for a release or a reclaim).
if st.h then host_end(st.h, now, false, false, false, id, st.k) end
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
to_dead(id, st, now, ARGV[4], payload, ARGV[5] ~= '1')
save(id, st, payload)
return {'dead'}
