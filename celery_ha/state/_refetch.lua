--[[ Shared include of _common: refetch schedules (the design is in celery_ha/state/schedules.py).
  A completed task whose task name (or host) has a schedule is due again `iv` seconds after its
  completion: its record stays (the completed history's trim keeps it) and is what queues it again,
  through the host gate, however old it is, when the sweep (refetch_due.lua) finds it due. A
  scheduled run that dies for a reason that may pass (retries spent on retryable errors, stalls:
  _common's to_dead) keeps its next run the same way, `iv` after its death, while it stays in `dead`;
  a permanent failure (fail.lua without retry) or a cancel ends the schedule (to_dead clears iv).
  A record WAITS for a scheduled run iff its state is completed or dead (st.s 'c' or 'x') and it has
  iv; it is due at ut + iv (ut: its completion or death). Every path that takes a record out of those
  states starts a new run (requeue_finished, next_run, a redrive), and none ends a schedule while
  the record stays completed or dead (a cancel refuses those): so the record alone says whether and
  when it waits, and a waiting dedup task is not remembered in _remembered.lua (complete_task): its
  record is the dedup memory, as long as it waits.
  Keys, all named from PREFIX (ARGV[1], which carries KEYS[1]'s hash tag: same slot, see same_slot):
    sched    hash: the schedules, copied to every shard by the caller; fields 't:<task name>',
             'h:<host>', 't:<task name>@<host>' (the most specific wins) -> 'every|min|max|adapt'
             (seconds; adapt 1/0; every 0 = never refetch); '_h' present while any host entry exists
    rfb      zset: the refetch index, by record bucket (t:<i> of _records.lua): member i, score a
             lower bound (ms, Redis clock) of the due times of bucket i's waiting records. A record
             that starts waiting lowers its bucket's score (ZADD LT); one that stops leaves it as it
             is (an early or stale entry costs the sweep one bucket read, nothing more); the sweep
             sets a bucket's score to its earliest waiting run, or drops it. A split copies the score
             to the new bucket (_records.lua). Every bucket with a waiting record is indexed at or
             below that record's due time. ~100 B per bucket of 16-32 records instead of per id.
    refetch  zset: the index of earlier releases (waiting ids, score = due time): read (refetch_due
             drains it, a record leaving it ZREMs it) until empty; nothing new is written to it.
  Stats 'refetch_waiting' (KEYS[10]): how many records wait, the earlier index's ids aside (its ZCARD
  counts those): +1 when a run is scheduled, -1 when a waiting record starts a new run.
  Record fields (state part): iv, the current interval (ms, adaptive schedules move it); sg, the
  signature of the last run's output (a hex digest chosen by the task).
  Adaptive intervals (Nutch's AdaptiveFetchSchedule): unchanged output -> iv x 1.4, changed -> iv x
  0.8, clamped to [min, max]; without a verdict (no signature, or the first one) iv stays.
  Defines: K_REFETCH, waiting_due(st) -> due ms or nil, raw_due(raw) (the same of a raw record), rf_moved_due (set as _records.lua's split
  hook rec_moved_due), schedule_refetch, dead_refetch, unschedule, kept_records, requeue_finished,
  next_run. The index's key is PREFIX .. 'rfb', written out where used (no local: the library's
  prelude is near Lua's 200 locals, tests/redisio/test_functions.py).
]]

local K_SCHED, K_REFETCH
--#per-call
K_SCHED, K_REFETCH = PREFIX .. 'sched', PREFIX .. 'refetch'
--#end-per-call

-- When a record waits for a scheduled run (see the header): its due time (ms), else nil.
local function waiting_due(st)
  if st.iv and (st.s == 'c' or st.s == 'x') then return (tonumber(st.ut) or 0) + tonumber(st.iv) end
  return nil
end

-- The due time (ms) of a raw record that waits for a scheduled run, else nil, without decoding it
-- whole (the scans read every record of a bucket, most of them queued or running): a waiting head
-- ('@', _record_codec.lua) gives ut and iv by one match (iv is the first '!' or '|' tag: the tags
-- before it are all numbers' and none of them is either), a compact head whose state letter cannot
-- wait is skipped by its first bytes, and any other record is decoded.
local function raw_due(raw)
  local first = string.byte(raw, 1)
  if first == 64 then
    local ut, tag, iv = string.match(raw, '^@[CXcx](%w+)[^!|\n]-([!|])(%w+)')
    if not ut then return waiting_due((decode(raw))) end
    local a, b = 0, 0
    for j = 1, #ut do a = a * 62 + IDX[string.byte(ut, j)] end
    for j = 1, #iv do b = b * 62 + IDX[string.byte(iv, j)] end
    return a + (tag == '!' and b * 1000 or b)
  end
  if first == 126 then first = string.byte(raw, 2) end -- '~': the compact head's host mark
  if first ~= 123 and first ~= 99 and first ~= 120 and first ~= 67 and first ~= 88 then return nil end
  return waiting_due((decode(raw)))
end

-- A split's moved records (_records.lua: id, record pairs) -> the earliest due time (a score string) of
-- the waiting ones, nil when none waits: their new bucket's index entry.
local function rf_moved_due(flat)
  local first
  for j = 2, #flat, 2 do
    local at = raw_due(flat[j])
    if at and (not first or at < first) then first = at end
  end
  return first and fmt(first)
end
--#per-call
rec_moved_due = rf_moved_due
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
  -- st.ut is `now` (the completion or the death): due at ut + iv. The record is saved after this.
  local bucket = string.format('%d', rec_index(rec_hash(id))) -- its record's (_records.lua)
  redis.call('ZADD', PREFIX .. 'rfb', 'LT', fmt(now + iv), bucket)
  incr('refetch_waiting', 1)
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

-- A record of state `st` (decoded before any change) leaves the states that wait (a new run: a
-- redrive, a recrawl, a scheduled run): out of the earlier releases' index, or uncounted. Returns 1
-- when `st` waited and was counted in stats 'refetch_waiting': `batched` leaves the count to the
-- caller (one HINCRBY for many), else it is done here. Its bucket's index entry stays (lazy).
local function unschedule(id, st, batched)
  if redis.call('ZREM', K_REFETCH, id) == 1 or not waiting_due(st) then return 0 end
  if not batched then incr('refetch_waiting', -1) end
  return 1
end

-- Of the ids whose completed record the history's trim would delete, those it must delete: not the
-- ones waiting for a scheduled run (their record is what queues them again). Decided from the
-- records, read only while something may wait: the index, or the earlier releases' one, exists (one
-- EXISTS for both; an unscheduled namespace has neither).
local function kept_records(ids)
  if #ids == 0 or redis.call('EXISTS', PREFIX .. 'rfb', K_REFETCH) == 0 then return ids end
  local out = {}
  for j = 1, #ids do
    local raw = rec_get(ids[j])
    if not raw or not raw_due(raw) then out[#out + 1] = ids[j] end
  end
  return out
end

-- Queue a completed task again as a new run (same URL, meta, task, priority and limits; attempts,
-- stalls and errors cleared; its fencing token carries over), collected into `batch` (band_batch).
-- Returns 1 when it waited for a scheduled run (counted): the caller takes those off stats
-- 'refetch_waiting' at once (unschedule's batched count).
-- Its schedule state (iv, sg) stays: the next completion adapts from it. A dead one (its scheduled
-- run, refetch_due.lua) leaves `dead` the same way, its last error kept as the previous one (pe), as
-- a redrive keeps it.
local function requeue_finished(id, st, payload, batch, now)
  local left = unschedule(id, st, true)
  local pe = nil
  if st.s == 'x' then
    redis.call('ZREM', K_DEAD, id)
    pe = st.e
  else
    redis.call('ZREM', K_COMPLETED, id)
    forget_done(id)
  end
  st.a, st.st, st.e, st.pe, st.w, st.due, st.qt, st.f = nil, nil, nil, pe, nil, nil, nil, nil
  st.s = 'q'
  st.ut = fmt(now)
  save(id, st, payload)
  band_add(batch, st.p or '0', id, st.h)
  return left
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
    unschedule(id, old)
  end
  forget_done(id)
  local run = {}
  for key, value in pairs(st) do run[key] = value end
  run.k = fmt(token)
  if old then run.iv, run.sg = old.iv, old.sg end -- its refetch schedule's state
  return run
end
