--[[ Shared prelude of every task-state script (pulled in with --#include _common).
  KEYS layout, identical for every script but heartbeat (celery_ha/state/taskqueue.py builds it):
    KEYS[1]  tasks     hash: id -> record
    KEYS[2]  readyp    zset: priority bands that may hold queued ids (score = -priority)
    KEYS[3]  delayed   zset: failed tasks waiting for their retry (score = due ms)
    KEYS[4]  inflight  zset: dispatched tasks (score = dispatch ms)
    KEYS[5]  running   zset: leased tasks (score = lease expiry ms)
    KEYS[6]  dead      zset: dead tasks (score = time of death, us)
    KEYS[7]  completed zset: bounded history of completed tasks (score = completion ms)
    KEYS[8]  done      zset: dedup ids of finished tasks (score = completion ms)
    KEYS[9]  ckpt      hash: id -> checkpoint JSON
    KEYS[10] stats     hash: counters
    KEYS[11] wake      list: wake-up tokens for blocked claim_next callers
    KEYS[12] hist      hash: histogram bucket counters, "<kind>:<bucket>:<task name>" -> count
  ARGV[1] is the namespace prefix, from which the per-priority ready lists are named (same hash tag).
  A record is "<state JSON>\n<payload JSON>": Lua decodes only the small state part; the payload (url,
  meta) stays an opaque string, so user JSON is never re-encoded by cjson. Every value in the state
  part is a JSON string, integers included ({"k":"3"}): cjson formats and parses numbers through
  printf/strtod, which makes encoding a record 2.4x slower than with strings.
  One-letter states (st.s): q queued, d dispatched, r running, w delayed, c completed, x dead.
  Timestamps in the state part (ms, Redis clock): ct created, ut last transition (for a running task:
  its claim), due (a delayed task's retry time), qt (when a waiting task became ready, kept from a
  retry's promotion or a dispatch until its claim; otherwise ut or ct say it).
  Defines: the K_* keys and PREFIX; fmt, decode, load, encode, save (records); ready_key, push_ready,
  pop_ready, unready, band_batch, band_add, band_flush (ready lists); hist_bucket, observe (histograms);
  incr, wake, promote_due, to_dead,
  stall, fenced, grant, claim_best, trim_history, complete_task (transitions); store_items (the sink);
  and, from the includes
  below, now_ms and now_us_score (clock), the R_* refusal codes and refusal_in (_replies), and the
  same_slot check that ARGV[1] carries the hash tag of KEYS[1].
]]
--#include clock
--#include _replies
--#include same_slot

local K_TASKS, K_READYP, K_DELAYED, K_INFLIGHT = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_RUNNING, K_DEAD, K_COMPLETED, K_DONE = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local K_CKPT, K_STATS, K_WAKE, K_HIST = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local PREFIX = ARGV[1]

-- Integers as strings: ZADD scores, and the record's timestamps. Lua would format a number argument
-- of redis.call with '%.17g' and cjson with '%.14g' (slow for 13-digit milliseconds, and lossy for
-- cjson); scripts format the same `now` several times, so the last result is kept.
local fmt_n, fmt_s
local function fmt(n)
  if n ~= fmt_n then
    fmt_n, fmt_s = n, string.format('%.0f', n)
  end
  return fmt_s
end

-- A stored record -> (state table, payload string).
local function decode(raw)
  local nl = string.find(raw, '\n', 1, true)
  return cjson.decode(string.sub(raw, 1, nl - 1)), string.sub(raw, nl + 1)
end

local function load(id)
  local raw = redis.call('HGET', K_TASKS, id)
  if not raw then return nil, nil end
  return decode(raw)
end

local function encode(st, payload)
  return cjson.encode(st) .. '\n' .. payload
end

-- Write a record back; returns it (a lease's reply carries it without encoding it twice).
local function save(id, st, payload)
  local rec = encode(st, payload)
  redis.call('HSET', K_TASKS, id, rec)
  return rec
end

local function ready_key(p)
  return PREFIX .. 'r:' .. p
end

-- Queue a task in its priority band: at the back (new work, retries) or the front (reclaimed work).
local function push_ready(id, st, front)
  local p = st.p or '0'
  if front then
    redis.call('LPUSH', ready_key(p), id)
  else
    redis.call('RPUSH', ready_key(p), id)
  end
  redis.call('ZADD', K_READYP, -tonumber(p), p)
  st.s = 'q'
end

-- Pop the oldest task of the highest non-empty priority band, or nil. A band that a pop emptied stays
-- indexed until a later pop finds it empty (one EXISTS less per claim): every non-empty band is
-- indexed, not every indexed band non-empty. Empty bands can stack up (each pop of a new, higher band
-- leaves one), so the loop drops every one it meets: at most one per priority (2,001).
local function pop_ready()
  while true do
    local top = redis.call('ZRANGE', K_READYP, '0', '0')
    if #top == 0 then return nil end
    local id = redis.call('LPOP', ready_key(top[1]))
    if id then return id end
    redis.call('ZREM', K_READYP, top[1])
  end
end

-- Remove one id from its ready band (rare path: a direct claim of a queued task, purge).
local function unready(id, st)
  local p = st.p or '0'
  redis.call('LREM', ready_key(p), 1, id)
  if redis.call('EXISTS', ready_key(p)) == 0 then redis.call('ZREM', K_READYP, p) end
end

local function incr(field, by)
  if by ~= 0 then return redis.call('HINCRBY', K_STATS, field, by) end
end

-- Histogram buckets: 12 per decade of milliseconds, upper bounds (10 12 15 18 20 25 30 36 40 50 60
-- 75) / 10 x 10^e ms for e = 0..9, bucket 120 above 7.5e9 ms. Every Prometheus bound celery-ha shows
-- (5 ms ... 1 h) is one of them, so those counts are exact; celery_ha/state/metrics.py reads them.
-- Times are whole ms, compared in tenths so every bound is an integer.
local HIST_STEPS = {10, 12, 15, 18, 20, 25, 30, 36, 40, 50, 60, 75}
local function hist_bucket(ms)
  local t, scale = ms * 10, 1
  for e = 0, 9 do
    if t <= 75 * scale then
      for j = 1, 12 do
        if t <= HIST_STEPS[j] * scale then return e * 12 + j - 1 end
      end
    end
    scale = scale * 10
  end
  return 120
end

-- Count one observation of `kind` ('w' wait: ready -> claimed, 'r' runtime: claimed -> completed) for
-- the task name: one HINCRBY, never a task id in the field.
local function observe(kind, name, since, now)
  local ms = now - (tonumber(since) or now)
  if ms < 0 then ms = 0 end
  redis.call('HINCRBY', K_HIST, kind .. ':' .. hist_bucket(ms) .. ':' .. (name or ''), 1)
end

local function wake(n)
  if n > 0 then
    local tokens = {}
    for j = 1, math.min(n, 64) do tokens[j] = '1' end
    redis.call('RPUSH', K_WAKE, unpack(tokens))
    redis.call('LTRIM', K_WAKE, -64, -1)
  end
end

-- Move up to `limit` due retries from delayed to ready. Returns how many moved.
local function promote_due(now, limit)
  local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', fmt(now), 'LIMIT', '0', limit)
  for _, id in ipairs(due) do
    redis.call('ZREM', K_DELAYED, id)
    local st, payload = load(id)
    if st and st.s == 'w' then
      st.qt = st.due -- ready since its due time, however late this promotion runs
      st.due = nil
      push_ready(id, st, false)
      save(id, st, payload)
    end
  end
  return #due
end

local function to_dead(id, st, now, reason)
  st.s = 'x'
  st.e = reason
  st.ut = fmt(now)
  redis.call('ZADD', K_DEAD, now_us_score(), id)
  incr('died', 1)
end

-- Ids headed for the ready lists, grouped by band (the priority as a string), so a batch costs one
-- push per band.
local function band_batch()
  return {order = {}, ids = {}}
end

local function band_add(batch, p, id)
  local ids = batch.ids[p]
  if not ids then
    ids = {}
    batch.ids[p] = ids
    batch.order[#batch.order + 1] = p
  end
  ids[#ids + 1] = id
end

-- Push every collected id to its band with `cmd`: RPUSH (back) or LPUSH (front; the same order as
-- pushing them one by one), then mark each band ready once.
local function band_flush(batch, cmd)
  for _, p in ipairs(batch.order) do
    local ids = batch.ids[p]
    for j = 1, #ids, 1000 do
      redis.call(cmd, ready_key(p), unpack(ids, j, math.min(j + 999, #ids)))
    end
    redis.call('ZADD', K_READYP, -tonumber(p), p)
  end
end

-- Take back a running task whose holder vanished (the caller already removed it from `running`, and
-- writes the record back): counts a stall; dead past max_stalls, else queued at the front of its
-- band, pushed now or collected into `batch`. Returns 'q' (queued again) or 'x' (dead).
local function stall(id, st, now, reason, batch)
  local stalls = (tonumber(st.st) or 0) + 1
  st.st = tostring(stalls)
  st.w = nil
  st.ut = fmt(now)
  if stalls > (tonumber(st.ms) or 3) then
    to_dead(id, st, now, 'stalled ' .. stalls .. ' times: ' .. reason)
  elseif batch then
    band_add(batch, st.p or '0', id)
    st.s = 'q'
  else
    push_ready(id, st, true)
  end
  return st.s
end

-- The fencing check: the task must be running and the caller's token (a decimal string) its current
-- one. Returns (state, payload), or (nil, nil, refusal code) saying why the caller holds no lease.
local function fenced(id, token)
  local st, payload = load(id)
  if not st then return nil, nil, R_UNKNOWN end
  if st.s ~= 'r' then return nil, nil, refusal_in(st.s) end
  if st.k ~= token then return nil, nil, R_STALE_TOKEN end
  return st, payload
end

-- Grant a lease on a task that is queued, dispatched, or already popped from its band (popped=true).
-- Returns the reply Python turns into a Lease: {id, token, expiry_ms, record, checkpoint|false}, or
-- the refusal code of the task's state when that state allows no claim.
local function grant(id, st, payload, worker, ttl, now, popped)
  if popped then
    if st.s ~= 'q' then return refusal_in(st.s) end
  elseif st.s == 'q' then
    unready(id, st)
  elseif st.s == 'd' then
    redis.call('ZREM', K_INFLIGHT, id)
  else
    return refusal_in(st.s)
  end
  observe('w', st.n, st.qt or st.ut or st.ct, now)
  st.qt = nil
  st.s = 'r'
  st.k = tostring((tonumber(st.k) or 0) + 1)
  st.w = worker
  st.ut = fmt(now)
  local expiry = fmt(now + ttl)
  redis.call('ZADD', K_RUNNING, expiry, id)
  local rec = save(id, st, payload)
  incr('claimed', 1)
  return {id, st.k, expiry, rec, redis.call('HGET', K_CKPT, id)}
end

-- Standalone claim: promote due retries, then lease the best queued task. Returns the lease reply,
-- or R_EMPTY when the ready lists are empty (or their first 16 ids were all stale: popped, not leased).
local function claim_best(worker, ttl, promote_limit, now)
  promote_due(now, promote_limit)
  for _ = 1, 16 do
    local id = pop_ready()
    if not id then return R_EMPTY end
    local st, payload = load(id)
    if st then
      local reply = grant(id, st, payload, worker, ttl, now, true)
      if type(reply) == 'table' then return reply end
    end
  end
  return R_EMPTY
end

-- Drop completed records beyond history_max or older than history_age_ms, at most 64 of each.
local function trim_history(hmax, hage, now)
  local over = redis.call('ZCARD', K_COMPLETED) - hmax
  if over > 0 then
    local old = redis.call('ZPOPMIN', K_COMPLETED, math.min(over, 64))
    local ids = {}
    for j = 1, #old, 2 do ids[#ids + 1] = old[j] end
    redis.call('HDEL', K_TASKS, unpack(ids))
  end
  local aged = redis.call('ZRANGEBYSCORE', K_COMPLETED, '-inf', fmt(now - hage), 'LIMIT', '0', '64')
  if #aged > 0 then
    redis.call('ZREM', K_COMPLETED, unpack(aged))
    redis.call('HDEL', K_TASKS, unpack(aged))
  end
end

-- Complete a task under its lease. Returns true, or the refusal code of fenced() (nothing written).
-- The completed history is bounded: every `period`-th completion (period = history_max / 64, between
-- 1 and 16) trims it, so it holds at most history_max + period records; dedup remembers finished ids
-- in the lean `done` sorted set, with the completion time that dedup expiry compares. A caller that
-- already passed fenced() hands its (st, payload) in `held`, so the record is not read twice.
local function complete_task(id, token, hmax, hage, now, held)
  local st, payload, refusal
  if held then
    st, payload = held[1], held[2]
  else
    st, payload, refusal = fenced(id, token)
    if refusal then return refusal end
  end
  redis.call('ZREM', K_RUNNING, id)
  redis.call('HDEL', K_CKPT, id)
  observe('r', st.n, st.ut, now) -- st.ut is the claim time: nothing else moves it while running
  st.s = 'c'
  st.w = nil
  st.ut = fmt(now)
  st.e = nil
  save(id, st, payload)
  redis.call('ZADD', K_COMPLETED, st.ut, id)
  if st.dd then redis.call('ZADD', K_DONE, fmt(now), id) end
  local period = math.max(1, math.min(16, math.floor(hmax / 64)))
  if incr('completed', 1) % period == 0 then trim_history(hmax, hage, now) end
  return true
end

-- Store the keyed output items from ARGV position `from` on (key, item JSON pairs) in the sink: its
-- items hash and item log are the 13th and 14th keys of the scripts that call it. A key the sink
-- holds already is ignored, so a re-run never doubles an output. Returns how many were new.
local function store_items(from)
  local added = 0
  for i = from, #ARGV, 2 do
    if redis.call('HSETNX', KEYS[13], ARGV[i], ARGV[i + 1]) == 1 then
      redis.call('RPUSH', KEYS[14], ARGV[i])
      added = added + 1
    end
  end
  incr('items', added)
  incr('items_duplicate', (#ARGV - from + 1) / 2 - added)
  return added
end
