--[[ Move dead tasks back to ready with failures and stalls reset: one named task, or up to `batch`
  of the oldest dead tasks. A dead task waiting for its scheduled run (_refetch.lua) waits no more
  (stats refetch_waiting, or the earlier releases' index `refetch`): the redriven run is its next one
  (its completion schedules the one after).
  KEYS[1]  tasks
  KEYS[2]  readyp
  KEYS[6]  dead
  KEYS[10] stats (refetch_waiting: a waiting task leaves it)
  KEYS[11] wake
  Same slot: the record buckets (_records.lua: t:<i>, tg, rfb), the ready lists r:<priority>, a
    gated task's host keys (_hosts.lua) and the earlier releases' refetch index (_refetch.lua:
    refetch) it may touch are
    named from ARGV[1], the prefix every KEYS entry starts with (its {hash tag} included), so they
    share KEYS[1]'s slot (_common checks it).
  ARGV[1] namespace prefix
  ARGV[2] task id, or '' for the oldest dead tasks
  ARGV[3] batch (most tasks moved without an id)
  ARGV[4] "1": without an id, the reply is the list of the ids moved (tracing on: each gets a span);
    optional, default "0"
  Reply: with an id: 1 moved; or a refusal: R_UNKNOWN (no record; a stray id is dropped from
    `dead`), or the code of the task's state when it is not dead (R_WAITING, R_RUNNING, R_DELAYED,
    R_COMPLETED; nothing written). Without an id: how many moved (or which, with ARGV[4] "1")
]]
--#include _common
-- Take `id` out of `dead` and, if its record is dead, queue it again: 1, or 0 when the record is in
-- another state, or R_UNKNOWN when there is no record.
local function revive(id)
  local st, payload = load(id)
  redis.call('ZREM', K_DEAD, id)
  if not st then return R_UNKNOWN end
  if st.s ~= 'x' then return 0 end
  unschedule(id, st)
  st.a = nil
  st.st = nil
  st.f = nil
  st.pe = st.e
  st.e = nil
  st.ut = fmt(now_ms())
  push_ready(id, st, false)
  save(id, st, payload)
  return 1
end
local moved = 0
if ARGV[2] ~= '' then
  if not redis.call('ZSCORE', K_DEAD, ARGV[2]) then
    local st = load(ARGV[2])
    if not st then return R_UNKNOWN end
    return refusal_in(st.s)
  end
  moved = revive(ARGV[2])
  if moved == R_UNKNOWN then return moved end
else
  local named = ARGV[4] == '1' and {} or nil
  for _, id in ipairs(redis.call('ZRANGE', K_DEAD, 0, tonumber(ARGV[3]) - 1)) do
    if revive(id) == 1 then
      moved = moved + 1
      if named then named[#named + 1] = id end
    end
  end
  if named then
    incr('redriven', moved)
    wake(moved)
    return named
  end
end
incr('redriven', moved)
wake(moved)
return moved
