--[[ Queue completed tasks again (the operator's recrawl): each completed id starts a new run of the
  same task (same URL, meta, task name, priority and limits; attempts, stalls and errors cleared),
  queued at the back of its band. Its fencing token carries over and keeps growing, so a holder left
  over from an earlier run can never match a new lease. Other states are left alone.
  KEYS[1]  tasks
  KEYS[2]  readyp
  KEYS[6]  dead (named by requeue_finished for a dead scheduled run, refetch_due.lua's; recrawl
    queues completed tasks only and leaves a dead one, and its scheduled run, alone)
  KEYS[7]  completed (the id leaves the history, whose trim would otherwise delete its record)
  KEYS[8]  done (the old sorted set of finished dedup ids: the id leaves it, as it leaves the buckets)
  KEYS[10] stats (recrawled; refetch_waiting: a task waiting for a scheduled run leaves it)
  KEYS[11] wake (one token per queued task)
  Same slot: the record buckets (_records.lua: t:<i>, tg, rfb), the ready lists r:<priority>, the
    buckets of remembered ids (_remembered.lua: d:<3 chars>, d:~; the id is no longer a finished
    dedup id), a gated task's host keys (_hosts.lua) and the earlier releases' refetch index
    (_refetch.lua: refetch; a scheduled id leaves it, its next completion schedules it again) it
    may touch are
    named from ARGV[1], the prefix every KEYS entry starts with (its {hash tag} included), so they
    share KEYS[1]'s slot (_common checks it).
  ARGV[1] namespace prefix
  ARGV[2..] task ids
  Reply: one character per id, in order: '1' queued again, '0' not completed (queued, running,
    delayed or dead: unchanged), '?' unknown (never created, or trimmed from the history)
]]
--#include _common
local now = now_ms()
local reply = {}
local queued = band_batch()
local count, left = 0, 0
for j = 2, #ARGV do
  local id = ARGV[j]
  local st, payload = load(id)
  if not st then
    reply[#reply + 1] = '?'
  elseif st.s ~= 'c' then
    reply[#reply + 1] = '0'
  else
    left = left + requeue_finished(id, st, payload, queued, now)
    count = count + 1
    reply[#reply + 1] = '1'
  end
end
band_flush(queued, 'RPUSH', now)
incr('recrawled', count)
incr('refetch_waiting', -left)
wake(count)
return table.concat(reply)
