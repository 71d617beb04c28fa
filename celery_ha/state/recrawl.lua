--[[ Queue completed tasks again (the operator's recrawl): each completed id starts a new run of the
  same task (same URL, meta, task name, priority and limits; attempts, stalls and errors cleared),
  queued at the back of its band. Its fencing token carries over and keeps growing, so a holder left
  over from an earlier run can never match a new lease. Other states are left alone.
  KEYS[1]  tasks
  KEYS[2]  readyp
  KEYS[7]  completed (the id leaves the history, whose trim would otherwise delete its record)
  KEYS[8]  done (the id is no longer a finished dedup id)
  KEYS[10] stats
  KEYS[11] wake (one token per queued task)
  Same slot: the ready lists r:<priority> it may touch are named from ARGV[1], the prefix every KEYS
    entry starts with (its {hash tag} included), so they share KEYS[1]'s slot (_common checks it).
  ARGV[1] namespace prefix
  ARGV[2..] task ids
  Reply: one character per id, in order: '1' queued again, '0' not completed (queued, running,
    delayed or dead: unchanged), '?' unknown (never created, or trimmed from the history)
]]
--#include _common
local now = now_ms()
local reply = {}
local queued = band_batch()
local count = 0
for j = 2, #ARGV do
  local id = ARGV[j]
  local st, payload = load(id)
  if not st then
    reply[#reply + 1] = '?'
  elseif st.s ~= 'c' then
    reply[#reply + 1] = '0'
  else
    redis.call('ZREM', K_COMPLETED, id)
    redis.call('ZREM', K_DONE, id)
    st.a, st.st, st.e, st.pe, st.w, st.due, st.qt = nil, nil, nil, nil, nil, nil, nil
    st.s = 'q'
    st.ut = fmt(now)
    save(id, st, payload)
    band_add(queued, st.p or '0', id)
    count = count + 1
    reply[#reply + 1] = '1'
  end
end
band_flush(queued, 'RPUSH')
incr('recrawled', count)
wake(count)
return table.concat(reply)
