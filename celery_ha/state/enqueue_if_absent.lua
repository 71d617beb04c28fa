--[[ Create tasks under ids the caller fixed earlier, unless a task with the id is present: the
  idempotent replay of an enqueue whose id was already handed out (Django's transactional outbox
  pushes a request again when it cannot tell whether an earlier push arrived). Unlike enqueue.lua, a
  present random id (dedup off) is not a collision to retry under a new id: it is this very task.
  KEYS[1]  tasks
  KEYS[2]  readyp
  KEYS[8]  done (the old sorted set of finished dedup ids, read until the sweep moved it into the
    buckets of _remembered.lua). A remembered (finished dedup) id counts as present, however long ago
    it finished: a replay repeats a request, it never asks for a recrawl.
  KEYS[10] stats
  KEYS[11] wake (one token per created task, for blocked claim_next callers)
  Same slot: the record buckets (_records.lua: t:<i>, tg), the ready lists r:<priority>, the host gate's keys (_hosts.lua: h, hb, hl, hq, hcfg,
    hosts, hready, hwait) it may touch, the buckets of remembered ids (_remembered.lua: d:<3 chars>,
    d:~) and the 0.1 releases' dedup set `seen` are named from ARGV[1], the prefix every KEYS entry starts with
    (its {hash tag} included), so they share KEYS[1]'s slot (_common checks it).
  ARGV[1] namespace prefix
  ARGV[2..] runs as in enqueue.lua: count, priority, dedup (1/0), task name, max_attempts, max_stalls,
    then count x (id, payload (_common.lua), host key or ''); the host gate as in enqueue.lua
  Reply: one character per task, in order: '1' created now, '0' present already (nothing written; a
    present dedup task counts in stats 'duplicates', as in enqueue.lua)
]]
--#include _common
local now = now_ms()
local reply = {}
local created, duplicates = 0, 0
local queued = band_batch()
rec_batch()
local gate = redis.call('HGET', K_HCFG, 'on') == '1'
local legacy = PREFIX .. 'seen'
local has_legacy = redis.call('EXISTS', legacy) == 1

local i = 2
while i <= #ARGV do
  local count, p, dd, name = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local st = {ct = fmt(now), s = 'q'} -- fields at their default are left out (_common's header)
  if name ~= DEFAULT_TASK then st.n = name end
  if ARGV[i + 4] ~= '3' then st.ma = ARGV[i + 4] end
  if ARGV[i + 5] ~= '3' then st.ms = ARGV[i + 5] end
  if p ~= '0' then st.p = p end
  if dd == '1' then st.dd = '1' end
  local head = encode(st, '') -- the same for the whole run (but a gated task's)
  i = i + 6
  for _ = 1, count do
    local id = ARGV[i]
    if rec_get(id) or done_time(id)
       or (has_legacy and redis.call('SISMEMBER', legacy, id) == 1) then
      reply[#reply + 1] = '0'
      if dd == '1' then duplicates = duplicates + 1 end
    else
      local host = gate and ARGV[i + 2] ~= '' and ARGV[i + 2] or nil
      local record = head .. ARGV[i + 1]
      if host then -- encoded with its payload: a host the URL names is left out of it
        st.h = host
        record = encode(st, ARGV[i + 1])
        st.h = nil
      end
      rec_set(id, record)
      band_add(queued, p, id, host)
      created = created + 1
      reply[#reply + 1] = '1'
    end
    i = i + 3
  end
end
rec_settle()
band_flush(queued, 'RPUSH', now)
incr('duplicates', duplicates)
incr('enqueued', created)
wake(created)
return table.concat(reply)
