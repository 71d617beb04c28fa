--[[ Give a running task back at once, without waiting for its lease to expire: fast failover (a
  pool child died: the stall counts, so a poison pill still ends up dead), graceful shutdown (it
  does not count), or a fault of celery-ha's own code around the task (counted in the record's `f`;
  every OWN_FAULTS_PER_STALL-th one counts a stall, so a bug that fails every run ends in dead with
  its reason instead of handing the task back for ever).
  KEYS[1]  tasks
  KEYS[2]  readyp
  KEYS[5]  running
  KEYS[6]  dead (a task past max_stalls)
  KEYS[10] stats
  KEYS[11] wake
  Same slot: the record buckets (_records.lua: t:<i>, tg), the ready lists r:<priority> and a gated task's host keys (_hosts.lua) it may touch are
    named from ARGV[1], the prefix every KEYS entry starts with (its {hash tag} included), so they
    share KEYS[1]'s slot (_common checks it).
  ARGV[1] namespace prefix
  ARGV[2] task id
  ARGV[3] fencing token, or '' for any
  ARGV[4] worker, or '' for any
  ARGV[5] count_stall: '1' yes, '0' no, 'f' celery-ha's own fault (see above)
  ARGV[6] reason (the error recorded if the stall kills the task)
  Reply: 'q' queued again, 'x' dead; or a refusal (nothing written): R_UNKNOWN, R_WAITING,
    R_STALE_TOKEN, R_OTHER_WORKER, R_DELAYED, R_COMPLETED, R_DEAD
]]
--#include _common
local OWN_FAULTS_PER_STALL = 5
local id = ARGV[2]
local st, payload = load(id)
if not st then return R_UNKNOWN end
if st.s ~= 'r' then return refusal_in(st.s) end
if ARGV[3] ~= '' and st.k ~= ARGV[3] then return R_STALE_TOKEN end
if ARGV[4] ~= '' and st.w ~= ARGV[4] then return R_OTHER_WORKER end
local now = now_ms()
local state
redis.call('ZREM', K_RUNNING, id)
-- A request the holder let go and never heard the end of (it was killed mid-request) holds the host's
-- slot until it can no longer be in flight (host_end's hold, under a concurrency limit).
if st.h then host_end(st.h, now, false, false, false, id, st.k) end
local count = ARGV[5] == '1'
if ARGV[5] == 'f' then
  st.f = tostring((tonumber(st.f) or 0) + 1)
  if tonumber(st.f) >= OWN_FAULTS_PER_STALL then
    st.f = nil
    count = true
  end
end
if count then
  state = stall(id, st, now, ARGV[6])
  save(id, st, payload)
else
  st.w = nil
  st.ut = fmt(now)
  push_ready(id, st, true, now)
  save(id, st, payload)
  state = 'q'
end
incr('released', 1)
wake(state == 'q' and 1 or 0)
return state
