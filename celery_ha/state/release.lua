--[[ Give a running task back at once, without waiting for its lease to expire: fast failover (a
  pool child died: the stall counts, so a poison pill still ends up dead) or graceful shutdown (it
  does not count).
  KEYS[1]  tasks
  KEYS[2]  readyp
  KEYS[5]  running
  KEYS[6]  dead (a task past max_stalls)
  KEYS[10] stats
  KEYS[11] wake
  Same slot: the ready lists r:<priority> it may touch are named from ARGV[1], the prefix every KEYS
    entry starts with (its {hash tag} included), so they share KEYS[1]'s slot (_common checks it).
  ARGV[1] namespace prefix
  ARGV[2] task id
  ARGV[3] fencing token, or '' for any
  ARGV[4] worker, or '' for any
  ARGV[5] count_stall (1/0)
  ARGV[6] reason (the error recorded if the stall kills the task)
  Reply: 'q' queued again, 'x' dead; or a refusal (nothing written): R_UNKNOWN, R_WAITING,
    R_STALE_TOKEN, R_OTHER_WORKER, R_DELAYED, R_COMPLETED, R_DEAD
]]
--#include _common
local id = ARGV[2]
local st, payload = load(id)
if not st then return R_UNKNOWN end
if st.s ~= 'r' then return refusal_in(st.s) end
if ARGV[3] ~= '' and st.k ~= ARGV[3] then return R_STALE_TOKEN end
if ARGV[4] ~= '' and st.w ~= ARGV[4] then return R_OTHER_WORKER end
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
