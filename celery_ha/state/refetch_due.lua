--[[ Queue the scheduled runs that are due (the sweep calls it, bounded per call): each completed id
  of `refetch` whose time came starts a new run, as the operator's recrawl does (recrawl.lua), at the
  back of its band or through its host's queue (the host gate paces it); so does a dead one (a
  scheduled run that died for a reason that may pass, _common's to_dead): it leaves `dead`, its
  attempts and stalls reset. An id whose record is neither (queued again meanwhile, or its record
  gone) only leaves `refetch`.
  KEYS[1]  tasks
  KEYS[2]  readyp
  KEYS[6]  dead (a dead id leaves it)
  KEYS[7]  completed (the id leaves the history)
  KEYS[8]  done (the id is no longer a finished dedup id)
  KEYS[10] stats (refetched: runs queued by a schedule)
  KEYS[11] wake (one token per queued task)
  Same slot: the ready lists r:<priority>, a gated task's host keys (_hosts.lua) and the refetch
    schedule's keys (_refetch.lua: refetch, sched) are named from ARGV[1], the prefix every KEYS
    entry starts with (its {hash tag} included), so they share KEYS[1]'s slot (_common checks it).
  ARGV[1] namespace prefix
  ARGV[2] limit: most due ids taken per call
  Reply: {queued, dropped (neither completed nor dead any more), more (1 when due ids are left)}
]]
--#include _common
local now = now_ms()
local limit = tonumber(ARGV[2])
local due = redis.call('ZRANGEBYSCORE', K_REFETCH, '-inf', fmt(now), 'LIMIT', '0', tostring(limit + 1))
local more = 0
if #due > limit then
  more = 1
  due[#due] = nil
end
local queued = band_batch()
local count, dropped = 0, 0
for _, id in ipairs(due) do
  local st, payload = load(id)
  if st and (st.s == 'c' or st.s == 'x') then
    requeue_finished(id, st, payload, queued, now)
    count = count + 1
  else
    redis.call('ZREM', K_REFETCH, id)
    dropped = dropped + 1
  end
end
band_flush(queued, 'RPUSH', now)
incr('refetched', count)
wake(count)
return {count, dropped, more}
