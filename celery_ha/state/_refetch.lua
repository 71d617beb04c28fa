--[[ Shared include of _common: refetch schedules (the design is in celery_ha/state/schedules.py).
  A completed task whose task name (or host) has a schedule is due again `iv` seconds after its
  completion: its record stays (the completed history's trim keeps it) and its id waits in `refetch`
  until the sweep (refetch_due.lua) queues it again, through the host gate, however old it is. A
  scheduled run that dies for a reason that may pass (retries spent on retryable errors, stalls:
  _common's to_dead) keeps its next run the same way, `iv` after its death, while it stays in `dead`;
  a permanent failure (fail.lua without retry) or a cancel ends the schedule. An id waits in `refetch`
  only while its record is completed or dead, once (a sorted set); every path that takes it out of
  those states takes it out of `refetch` (requeue_finished, next_run, unschedule: redrive, cancel).
  Keys, all named from PREFIX (ARGV[1], which carries KEYS[1]'s hash tag: same slot, see same_slot):
    sched    hash: the schedules, copied to every shard by the caller; fields 't:<task name>',
             'h:<host>', 't:<task name>@<host>' (the most specific wins) -> 'every|min|max|adapt'
             (seconds; adapt 1/0; every 0 = never refetch); '_h' present while any host entry exists
    refetch  zset: completed ids waiting for their next run, score = due time (ms, Redis clock)
  Record fields (state part): iv, the current interval (ms, adaptive schedules move it); sg, the
  signature of the last run's output (a hex digest chosen by the task).
  Adaptive intervals (Nutch's AdaptiveFetchSchedule): unchanged output -> iv x 1.4, changed -> iv x
  0.8, clamped to [min, max]; without a verdict (no signature, or the first one) iv stays.
  Defines: schedule_refetch, dead_refetch, unschedule, kept_records, requeue_finished, next_run.
]]

local K_SCHED, K_REFETCH
--#per-call
K_SCHED, K_REFETCH = PREFIX .. 'sched', PREFIX .. 'refetch'
--#end-per-call

-- 'every|min|max|adapt' -> every, min, max, adapt; nil for no schedule (absent, garbled, every 0)
local function parse_schedule(v)
  if not v then return nil end
  local e, lo, hi, ad = string.match(v, '^(%d+)|(%d+)|(%d+)|([01])$')
  if not e or tonumber(e) <= 0 then return nil end
  return tonumber(e), tonumber(lo), tonumber(hi), ad == '1'
end

-- The host of a task without a host key: its URL's host[:port], lower case, without user info, the
-- scheme's default port and a trailing dot (the gate's default key mode, base/hosts.py host_of_url).
-- An internationalised host is left as written (UTF-8): only the host gate's key is its IDNA form.
local function url_host(payload)
  -- A payload of the URL alone is stored as the bare URL (not JSON), an https one without its
  -- scheme ('//host/...': _common's header).
  local url, first = payload, string.byte(payload, 1)
  if first == 123 then
    local ok, p = pcall(cjson.decode, payload)
    if not ok or type(p) ~= 'table' or type(p.u) ~= 'string' then return nil end
    url = p.u
  elseif first == 47 then
    url = 'https:' .. payload
  end
  local scheme, auth = string.match(url, '^(%a[%w+.-]*)://([^/?#]*)')
  if not auth then return nil end
  auth = string.lower(string.gsub(auth, '^.*@', ''))
  scheme = string.lower(scheme)
  if (scheme == 'http' and string.sub(auth, -3) == ':80') then auth = string.sub(auth, 1, -4) end
  if (scheme == 'https' and string.sub(auth, -4) == ':443') then auth = string.sub(auth, 1, -5) end
  -- A fully qualified name's trailing dot is not part of its host key (news.example. = news.example).
  local name, port = string.match(auth, '^(.-)%.+(:%d*)$')
  if name then return name .. port end
  return (string.gsub(auth, '%.+$', ''))
end

-- The schedule of a task: every, min, max, adapt (nil: none). One HMGET, a second one only while
-- host entries exist (and then a task without a host key decodes its payload for the URL's host).
local function schedule_of(st, payload)
  local name = st.n or ''
  local got = redis.call('HMGET', K_SCHED, 't:' .. name, '_h')
  if got[2] then
    local host = st.h or url_host(payload)
    if host then
      local o = redis.call('HMGET', K_SCHED, 't:' .. name .. '@' .. host, 'h:' .. host)
      if o[1] or o[2] then return parse_schedule(o[1] or o[2]) end
    end
  end
  return parse_schedule(got[1])
end

-- At a completion (before the record is saved): the task's next run, if a schedule applies. `sig`
-- is the run's verdict: '' none, '=' unchanged (a 304), else the signature of its output.
local function schedule_refetch(id, st, payload, now, sig)
  local changed
  if sig == '=' then
    changed = false
  elseif sig and sig ~= '' then
    if st.sg then changed = sig ~= st.sg end
    st.sg = sig
  end
  local every, lo, hi, adapt = schedule_of(st, payload)
  if not every then
    st.iv = nil
    return
  end
  local iv = every * 1000
  if adapt then
    iv = tonumber(st.iv) or iv
    if changed == true then iv = iv * 0.8 elseif changed == false then iv = iv * 1.4 end
    iv = math.max(lo * 1000, math.min(hi * 1000, iv))
  end
  iv = math.max(1000, math.floor(iv + 0.5))
  st.iv = fmt(iv)
  redis.call('ZADD', K_REFETCH, fmt(now + iv), id)
end

-- At the death of a scheduled task for a reason that may pass (_common's to_dead): its next regular
-- run, as a completion without a verdict would schedule it (the schedule in force: none or every 0
-- ends it; an adaptive interval stays). `payload` is read from the record when not given (a stall).
local function dead_refetch(id, st, payload, now)
  if not payload then
    local _
    _, payload = load(id)
  end
  schedule_refetch(id, st, payload or '', now, nil)
end

-- Take `id` out of the refetch index: its record leaves the states that wait there (a redrive, a
-- cancel, a new run).
local function unschedule(id)
  redis.call('ZREM', K_REFETCH, id)
end

-- Of the ids whose completed record the history's trim would delete, those it must keep: the ones
-- waiting for a scheduled run (their record is what queues them again).
local function kept_records(ids)
  if #ids == 0 or redis.call('EXISTS', K_REFETCH) == 0 then return ids end
  local due = redis.call('ZMSCORE', K_REFETCH, unpack(ids))
  local out = {}
  for j = 1, #ids do
    if not due[j] then out[#out + 1] = ids[j] end
  end
  return out
end

-- Queue a completed task again as a new run (same URL, meta, task, priority and limits; attempts,
-- stalls and errors cleared; its fencing token carries over), collected into `batch` (band_batch).
-- Its schedule state (iv, sg) stays: the next completion adapts from it. A dead one (its scheduled
-- run, refetch_due.lua) leaves `dead` the same way, its last error kept as the previous one (pe), as
-- a redrive keeps it.
local function requeue_finished(id, st, payload, batch, now)
  local pe = nil
  if st.s == 'x' then
    redis.call('ZREM', K_DEAD, id)
    pe = st.e
  else
    redis.call('ZREM', K_COMPLETED, id)
    forget_done(id)
  end
  unschedule(id)
  st.a, st.st, st.e, st.pe, st.w, st.due, st.qt, st.f = nil, nil, nil, pe, nil, nil, nil, nil
  st.s = 'q'
  st.ut = fmt(now)
  save(id, st, payload)
  band_add(batch, st.p or '0', id, st.h)
end

-- The state of a finished task's next run, enqueued again (enqueue.lua past its recrawl window,
-- enqueue_if_absent.lua for a request made past it): a copy of the new run's `st` whose fencing token
-- carries on above the old record's `old` (decoded; nil once the history forgot it: then from the Redis
-- clock in ms), the old record leaving the history and the refetch index, the remembered id forgotten.
local function next_run(id, st, old, now)
  local token = now
  if old then
    token = math.max(tonumber(old.k) or 0, now)
    redis.call('ZREM', K_COMPLETED, id)
    unschedule(id)
  end
  forget_done(id)
  local run = {}
  for key, value in pairs(st) do run[key] = value end
  run.k = fmt(token)
  if old then run.iv, run.sg = old.iv, old.sg end -- its refetch schedule's state
  return run
end
