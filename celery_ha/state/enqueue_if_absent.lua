--[[ Create tasks under ids the caller fixed earlier, unless a task with the id is present: the
  idempotent replay of an enqueue whose id was already handed out (Django's transactional outbox
  pushes a request again when it cannot tell whether an earlier push arrived). Unlike enqueue.lua, a
  present random id (dedup off) is not a collision to retry under a new id: it is this very task.
  A finished dedup id is present too, unless the caller says when the request was made: then the id
  is queued again as a new run (as enqueue.lua's recrawl: tokens continuing above every earlier run's,
  the completed record leaving the history and the refetch index, counted 'recrawled') only when it
  finished at least the recrawl window before that time. A run the request itself started (an earlier
  push of it) finished after the request was made, so a replay never starts another; the first push
  of a new request behaves as enqueue.lua does. The finish time is exact while the history holds the
  record; of a remembered id only its hour is known, taken as its end here (the latest the run may
  have finished: a replay must stay a no-op), where enqueue.lua takes its start.
  KEYS[1]  tasks
  KEYS[2]  readyp
  KEYS[7]  completed (a finished id queued again leaves the history, whose trim would delete its record)
  KEYS[8]  done (the old sorted set of finished dedup ids -> completion ms, read until the sweep moved
    it into the buckets of _remembered.lua)
  KEYS[10] stats (refetch_waiting: a waiting record queued again leaves it)
  KEYS[11] wake (one token per created task, for blocked claim_next callers)
  Same slot: the record buckets (_records.lua: t:<i>, tg), the ready lists r:<priority>, the host gate's keys (_hosts.lua: h, hb, hl, hq, hcfg,
    hosts, hready, hwait) it may touch, the refetch indexes (_refetch.lua: a finished id queued again
    leaves refetch; rfb, the split's, _records.lua), the buckets of remembered ids (_remembered.lua:
    d:<3 chars>, d:~; a record waiting for a scheduled run stands for its id) and the 0.1
    releases' dedup set `seen` (present, whenever it finished) are named from ARGV[1], the prefix
    every KEYS entry starts with (its {hash tag} included), so they share KEYS[1]'s slot (_common
    checks it).
  ARGV[1] namespace prefix
  ARGV[2] recrawl window (ms); -1 = never (every finished dedup id is present)
  ARGV[3] n: 0, or the number of tasks when request times follow
  ARGV[4 .. 3 + n] when each task's request was made (ms since the epoch, the requester's clock; the
    earlier of it and the Redis clock counts), in task order; -1 = unknown (a finished id is present)
  ARGV[4 + n ..] runs as in enqueue.lua: count, priority, dedup (1/0), task name, max_attempts,
    max_stalls, then count x (id, payload (_record_codec.lua), host key or ''); the host gate as in enqueue.lua
  Reply: one character per task, in order: '1' created now (a new run of a finished task included,
    counted in stats 'recrawled' too), '0' present already (nothing written; a present dedup task
    counts in stats 'duplicates', as in enqueue.lua)
]]
--#include _common
local now = now_ms()
local reply = {}
local created, duplicates, recrawled = 0, 0, 0
local queued = band_batch()
rec_batch()
local gate = redis.call('HGET', K_HCFG, 'on') == '1'
local legacy = PREFIX .. 'seen'
local has_legacy = redis.call('EXISTS', legacy) == 1
local window = tonumber(ARGV[2])
local timed = tonumber(ARGV[3])

-- The latest time (ms) a remembered id may have finished: the end of its hour, or the exact time the
-- old sorted set kept; nil when it is not remembered.
local function finished_by(id)
  local key, field = done_slot(id)
  local hour = redis.call('HGET', key, field)
  if hour then return hour_ms(hour) + HOUR_MS - 1 end
  local at = redis.call('ZSCORE', K_DONE, id)
  return at and tonumber(at) or nil
end

-- Whether task `id` (the n-th) is present; if not, the decoded record of the finished run it
-- follows (false when the history forgot it) when it is a new run of a finished task.
local function look_up(id, n, dd)
  local record = rec_get(id)
  local asked = n <= timed and tonumber(ARGV[3 + n]) or -1
  if dd ~= '1' or window < 0 or asked < 0 then -- a pure replay: anything known is present
    return record or done_time(id) or (has_legacy and redis.call('SISMEMBER', legacy, id) == 1), nil
  end
  local cutoff = math.min(asked, now) - window
  if record then
    local old = decode(record)
    if old.s ~= 'c' or (tonumber(old.ut) or now) > cutoff then return true, nil end -- live, or finished since
    return false, old
  end
  if has_legacy and redis.call('SISMEMBER', legacy, id) == 1 then return true, nil end -- no time kept
  local at = finished_by(id)
  if not at then return false, nil end -- unknown: created as a new task
  if at > cutoff then return true, nil end
  return false, false
end

local i = 4 + timed
local n = 0 -- the task's position in the call
while i <= #ARGV do
  local count, p, dd, name = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local st = {ct = fmt(now), s = 'q'} -- fields at their default are left out (_common's header)
  if name ~= DEFAULT_TASK then st.n = name end
  if ARGV[i + 4] ~= '3' then st.ma = ARGV[i + 4] end
  if ARGV[i + 5] ~= '3' then st.ms = ARGV[i + 5] end
  if p ~= '0' then st.p = p end
  if dd == '1' then st.dd = '1' end
  local head = encode(st, '') -- the same for the whole run (but a gated task's or a new run's)
  i = i + 6
  for _ = 1, count do
    local id = ARGV[i]
    n = n + 1
    local present, old = look_up(id, n, dd)
    if present then
      reply[#reply + 1] = '0'
      if dd == '1' then duplicates = duplicates + 1 end
    else
      local host = gate and ARGV[i + 2] ~= '' and ARGV[i + 2] or nil
      local run = st
      if old ~= nil then
        run = next_run(id, st, old or nil, now) -- _refetch.lua
        recrawled = recrawled + 1
      end
      local record = head .. ARGV[i + 1]
      if host or run ~= st then -- encoded with its payload: a host the URL names is left out of it
        run.h = host
        record = encode(run, ARGV[i + 1])
        run.h = nil
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
incr('recrawled', recrawled)
wake(created)
return table.concat(reply)
