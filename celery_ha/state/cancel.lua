--[[ Cancel one task: it ends dead with the reason "cancelled: <reason>" (redrive brings it back).
  A queued task leaves its band (a stale entry stays, skipped when popped and counted in `stats`
  as `rstale`), a delayed one its retry schedule, a dispatched one the window (its
  message is dropped by the claim); a running one leaves `running`, so its holder's next renewal,
  checkpoint or commit is refused (fencing) and the task stops there, writing nothing more.
  A cancel ends a refetch schedule (_refetch.lua): the task waits for no scheduled run (to_dead
  clears its interval; a completed or dead task, the only ones that wait, is refused).
  KEYS[1]  tasks
  KEYS[3]  delayed
  KEYS[4]  inflight
  KEYS[5]  running
  KEYS[6]  dead
  KEYS[10] stats
  Same slot: the record buckets (_records.lua: t:<i>, tg, rfb), the ready lists r:<priority> and a
    gated task's host keys (_hosts.lua) it may touch are
    named from ARGV[1], the prefix every KEYS entry starts with (its {hash tag} included), so they
    share KEYS[1]'s slot (_common checks it).
  ARGV[1] namespace prefix (the ready lists: computed keys, all under the namespace's hash tag)
  ARGV[2] task id
  ARGV[3] reason (cleaned by the caller)
  Reply: the state it was cancelled from ('q', 'd', 'w', 'r'), or a refusal (nothing written):
    R_UNKNOWN, R_COMPLETED, R_DEAD
]]
--#include _common
local id = ARGV[2]
local st, payload = load(id)
if not st then return R_UNKNOWN end
local was = st.s
if was == 'c' or was == 'x' then return refusal_in(was) end
if was == 'q' then
  unready(id, st)
elseif was == 'd' then
  redis.call('ZREM', K_INFLIGHT, id)
  if st.h then host_end(st.h, now_ms(), false, true) end
elseif was == 'w' then
  redis.call('ZREM', K_DELAYED, id)
  st.due = nil
elseif was == 'r' then
  redis.call('ZREM', K_RUNNING, id)
  -- Its holder may be mid-request (it stops at its next fenced write): the slot stays held while
  -- that request, unreported, may be in flight (host_end's hold, under a concurrency limit).
  if st.h then host_end(st.h, now_ms(), false, false, false, id, st.k) end
  st.w = nil
end
to_dead(id, st, now_ms(), 'cancelled: ' .. ARGV[3], payload, true)
save(id, st, payload)
incr('cancelled', 1)
return was
