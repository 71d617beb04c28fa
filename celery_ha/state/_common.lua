--[[ Shared prelude of every task-state script (pulled in with --#include _common).
  KEYS layout, identical for every script but heartbeat (celery_ha/state/taskqueue.py builds it):
    KEYS[1]  tasks     hash: id -> record, the layout of earlier releases: records now live in the
                       buckets t:<i> of _records.lua (read from here until their next write)
    KEYS[2]  readyp    zset: priority bands that may hold queued ids (score = -priority)
    KEYS[3]  delayed   zset: failed tasks waiting for their retry (score = due ms)
    KEYS[4]  inflight  zset: dispatched tasks (score = dispatch ms)
    KEYS[5]  running   zset: leased tasks (score = lease expiry ms)
    KEYS[6]  dead      zset: dead tasks (score = time of death, us)
    KEYS[7]  completed zset: bounded history of completed tasks (score = completion ms)
    KEYS[8]  done      zset: dedup ids of finished tasks (score = completion ms) before the compact
                       layout of _remembered.lua; read until the sweep has moved it into that layout
    KEYS[9]  ckpt      hash: id -> checkpoint JSON
    KEYS[10] stats     hash: counters
    KEYS[11] wake      list: wake-up tokens for blocked claim_next callers
    KEYS[12] hist      hash: histogram bucket counters, "<kind>:<bucket>:<task name>" -> count
  ARGV[1] is the namespace prefix, from which the per-priority ready lists and the buckets of the
  remembered (finished dedup) ids, d:<3 chars>, d:~ and their bitmap dk (_remembered.lua), are named
  (same hash tag).
  A record is "<state head>\n<payload>": its format, and the functions that read and write it, are
  _record_codec.lua's (included below).
  Defines: the K_* keys and PREFIX; ready_key, push_ready,
  live_in, pop_ready, pop_best, unready, band_batch, band_add, band_flush (ready lists and, for a task with a
  host key st.h, its host's queue: the host gate of _hosts.lua, included below ready_key);
  hist_bucket, observe (histograms);
  incr, wake, promote_due, to_dead,
  stall, fenced, grant, claim_best, trim_history, complete_task (transitions); store_items (the sink),
  complete_with_items (the sink's last items, then the completion);
  schedule_refetch, dead_refetch, unschedule, kept_records, requeue_finished, next_run (refetch
  schedules, _refetch.lua);
  remember, done_time, forget_done and the rest of _remembered.lua (finished dedup ids);
  and, from the includes
  below, fmt, decode, load, encode, save, payload_host (records: _record_codec.lua), now_ms and
  now_us_score (clock), the R_* refusal codes and refusal_in (_replies), and the
  same_slot check that ARGV[1] carries the hash tag of KEYS[1].
]]
--#include clock
--#include _replies
--#include same_slot

local K_TASKS, K_READYP, K_DELAYED, K_INFLIGHT
local K_RUNNING, K_DEAD, K_COMPLETED, K_DONE
local K_CKPT, K_STATS, K_WAKE, K_HIST
local PREFIX
--#per-call
K_TASKS, K_READYP, K_DELAYED, K_INFLIGHT = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
K_RUNNING, K_DEAD, K_COMPLETED, K_DONE = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
K_CKPT, K_STATS, K_WAKE, K_HIST = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
PREFIX = ARGV[1]
--#end-per-call
--#include _base62
--#include _records

--#include _record_codec

local function ready_key(p)
  return PREFIX .. 'r:' .. p
end

-- Stale entries one call may skip, in the ready bands (pop_ready) and the host queues (host_pop)
-- together: a few ms, while a mass cancel can leave long runs of them. Past it a pop says nothing is
-- ready and sets stale_cut (claim_best then leaves a wake token, so a waiting claimer calls again at
-- once), and the next call goes on where this one stopped.
local STALE_BUDGET = 1000
local stale_left, stale_cut
--#per-call
stale_left, stale_cut = STALE_BUDGET, false
--#end-per-call

--#include _hosts
--#include _remembered

-- Queue a task in its priority band: at the back (new work, retries) or the front (reclaimed work);
-- a gated task (st.h) in its host's queue instead.
local function push_ready(id, st, front, now)
  if st.h then
    host_push(id, st, front, now or now_ms())
    st.s = 'q'
    return
  end
  local p = st.p or '0'
  if front then
    redis.call('LPUSH', ready_key(p), id)
  else
    redis.call('RPUSH', ready_key(p), id)
  end
  redis.call('ZADD', K_READYP, -tonumber(p), p)
  st.s = 'q'
end

-- Stale band entries: unready() leaves the id in its band (taking it out would be an LREM over the
-- whole band) and counts it in stats 'rstale'; a pop skips an entry whose record is not queued in
-- that band (gone, moved on, gated, queued in another band) and uncounts it, so the queued count
-- (the bands' lengths minus 'rstale') stays exact. An id queued again while a stale entry of it is
-- left in the same band sits there twice: its first entry is the live one, the other one stale.
local function live_in(st, p)
  return st ~= nil and st.s == 'q' and not st.h and (st.p or '0') == p
end

-- Pop the oldest live task of the highest non-empty priority band: id, state, payload; or nil. A band
-- that a pop emptied stays indexed until a later pop finds it empty (one EXISTS less per claim): every
-- non-empty band is indexed, not every indexed band non-empty. Empty bands can stack up (each pop of
-- a new, higher band leaves one), so the loop drops every one it meets: at most one per priority
-- (2,001). A call skips at most STALE_BUDGET stale entries (declared above the host gate, whose
-- queues' stale entries count against it too).
local function pop_ready()
  while true do
    local top = redis.call('ZRANGE', K_READYP, '0', '0')
    if #top == 0 then return nil end
    local p = top[1]
    local id = redis.call('LPOP', ready_key(p))
    if id then
      local st, payload = load(id)
      if live_in(st, p) then return id, st, payload end
      redis.call('HINCRBY', K_STATS, 'rstale', -1)
      stale_left = stale_left - 1
      if stale_left <= 0 then
        stale_cut = true
        return nil
      end
    else
      redis.call('ZREM', K_READYP, p)
    end
  end
end

-- The next task to hand out: the best queued task among the ready bands and the eligible hosts
-- (the higher priority first; on a tie they take turns). Returns id, state, payload (a host queue's
-- stale id may come with a state nil or not queued: the caller skips it), or nil when nothing may go.
local tie_turn
--#per-call
tie_turn = false
--#end-per-call
local function pop_best(now, mode)
  local hp, head, head_band = host_top_priority()
  if hp then
    local top = redis.call('ZRANGE', K_READYP, '0', '0', 'WITHSCORES')
    local bp = #top > 0 and -tonumber(top[2]) or nil
    if bp and bp == hp then tie_turn = not tie_turn end
    if not bp or hp > bp or (hp == bp and tie_turn) then
      local id, st, payload = host_pop(now, mode, head, head_band)
      if id then return id, st, payload end
    end
  end
  local id, st, payload = pop_ready()
  if not id then
    if hp then return host_pop(now, mode) end
    return nil
  end
  return id, st, payload
end

-- Take one id out of its ready band or host queue (rare path: a direct claim of a queued task,
-- cancel). A band keeps the id as a stale entry, counted in 'rstale', that pops skip (pop_ready):
-- constant cost whatever the band's length.
local function unready(id, st)
  if st.h then
    -- An earlier release's zset gives the id up; a list keeps it as a stale entry (host_take's
    -- caller skips it), uncounted now.
    if legacy_queues() and redis.call('ZREM', hqkey(st.h), id) == 1 then hcfg_add('lq', -1) end
    redis.call('HINCRBY', K_HCFG, 'nq', -1)
    host_place(st.h, host_load(st.h), now_ms())
    return
  end
  redis.call('HINCRBY', K_STATS, 'rstale', 1)
end

-- A number argument of redis.call costs a '%.17g' formatting on Redis 6.2: the common step of 1 is
-- passed as a string.
local function incr(field, by)
  if by ~= 0 then return redis.call('HINCRBY', K_STATS, field, by == 1 and '1' or by) end
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
  redis.call('HINCRBY', K_HIST, kind .. ':' .. hist_bucket(ms) .. ':' .. (name or ''), '1')
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
      push_ready(id, st, false, now)
      save(id, st, payload)
    end
  end
  return #due
end

-- Ids headed for the ready lists, grouped by band (the priority as a string), so a batch costs one
-- push per band.
local function band_batch()
  return {order = {}, ids = {}, hosts = host_batch()}
end

-- Collect `id` for band `p`, or for host `h`'s queue when given (a gated task).
local function band_add(batch, p, id, h)
  if h then
    host_add(batch.hosts, h, p, id)
    return
  end
  local ids = batch.ids[p]
  if not ids then
    ids = {}
    batch.ids[p] = ids
    batch.order[#batch.order + 1] = p
  end
  ids[#ids + 1] = id
end

-- Push every collected id to its band with `cmd`: RPUSH (back) or LPUSH (front; the same order as
-- pushing them one by one), then mark each band ready once; gated ids go to their hosts' queues.
local function band_flush(batch, cmd, now)
  host_flush(batch.hosts, cmd == 'LPUSH', now or now_ms())
  for _, p in ipairs(batch.order) do
    local ids = batch.ids[p]
    for j = 1, #ids, 1000 do
      redis.call(cmd, ready_key(p), unpack(ids, j, math.min(j + 999, #ids)))
    end
    redis.call('ZADD', K_READYP, -tonumber(p), p)
  end
end

--#include _refetch

-- A task ends dead: in `dead` (listed, counted, redrivable). A scheduled one (st.iv: a completion
-- scheduled it) keeps its next regular run unless `ends` says the failure is final (permanent:
-- fail.lua without retry; an operator's cancel): it waits for it, one interval after its death
-- (dead_refetch, _refetch.lua), so a site outage longer than its retries or its stalls does not end
-- its schedule. A final one loses iv: a dead record with iv waits (_refetch.lua's header). `payload`
-- is the record's (read again when not given).
local function to_dead(id, st, now, reason, payload, ends)
  if st.h then host_dead(st.h) end
  st.s = 'x'
  st.e = reason
  st.ut = fmt(now)
  redis.call('ZADD', K_DEAD, now_us_score(), id)
  incr('died', 1)
  if ends then
    st.iv = nil
  elseif st.iv then
    dead_refetch(id, st, payload, now)
    if st.iv then
      -- It waits: written as a waiting head ('@', _record_codec.lua), whose texts hold no newline or
      -- 0x1F (refetch_due.lua tells an earlier release's final death, which kept iv, by that form).
      st.e = (string.gsub(st.e, '[\31\n]', ' '))
      if st.pe then st.pe = (string.gsub(st.pe, '[\31\n]', ' ')) end
    end
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
    band_add(batch, st.p or '0', id, st.h)
    st.s = 'q'
  else
    push_ready(id, st, true, now)
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
-- the refusal code of the task's state when that state allows no claim (R_WAITING also for a queued
-- task whose host may not start one now, or a dispatched one whose host was blocked since).
local function grant(id, st, payload, worker, ttl, now, popped)
  if popped then
    if st.s ~= 'q' then return refusal_in(st.s) end
    if st.h then host_out(st.h, now, 'c', host_popped(st.h)) end
  elseif st.s == 'q' then
    -- A claim by id (a second message, a batch's next id queued again since) passes the host gate
    -- as a pop would: while its host may not start a task (blocked, at its concurrency, paced), it
    -- stays queued and the message is dropped.
    if st.h and host_due(host_load(st.h), now) ~= 0 then return R_WAITING end
    unready(id, st)
    if st.h then host_out(st.h, now, 'c') end
  elseif st.s == 'd' then
    redis.call('ZREM', K_INFLIGHT, id)
    if st.h then
      local hs = host_load(st.h)
      if n0(hs.bu) > now then
        -- Its host was blocked after the message left (a 429, an operator): no lease; the task goes
        -- back to the front of its host's queue, uncounted (its budget unit given back: it never
        -- started), and the message is dropped.
        host_end(st.h, now, false, true, true)
        push_ready(id, st, true, now)
        st.ut = fmt(now)
        save(id, st, payload)
        return R_WAITING
      end
      host_claimed(st.h, now, hs)
    end
  else
    return refusal_in(st.s)
  end
  observe('w', st.n, st.qt or st.ut or st.ct, now)
  st.qt = nil
  st.s = 'r'
  -- A run's first token comes from the Redis clock (ms): a task the dedup sweep forgot and queued anew
  -- starts above every token of its earlier runs, whose holders may still be alive (zombies).
  st.k = st.k and tostring(tonumber(st.k) + 1) or fmt(now)
  st.w = worker
  st.ut = fmt(now)
  local expiry = fmt(now + ttl)
  redis.call('ZADD', K_RUNNING, expiry, id)
  local rec = save(id, st, payload)
  incr('claimed', 1)
  return {id, st.k, expiry, rec, redis.call('HGET', K_CKPT, id)}
end

-- Standalone claim: promote due retries, then lease the best queued task. Returns the lease reply,
-- or R_EMPTY when the ready lists are empty (or their first 16 ids were all stale: popped, not leased;
-- or the call skipped STALE_BUDGET stale entries of the bands and host queues: then a wake-up token
-- makes a waiting claimer call again at once).
local function claim_best(worker, ttl, promote_limit, now)
  promote_due(now, promote_limit)
  hosts_due(now)
  for _ = 1, 16 do
    local id, st, payload = pop_best(now, 'c')
    if not id then
      if stale_cut then wake(1) end
      return R_EMPTY
    end
    if st then
      local reply = grant(id, st, payload, worker, ttl, now, true)
      if type(reply) == 'table' then return reply end
    end
  end
  return R_EMPTY
end

-- Bound the completed history; a record leaving it is deleted unless a scheduled run needs it.
local function trim_history(hmax, hage, now)
  local over = redis.call('ZCARD', K_COMPLETED) - hmax
  if over > 0 then
    local old = redis.call('ZPOPMIN', K_COMPLETED, math.min(over, 64))
    local ids = {}
    for j = 1, #old, 2 do ids[#ids + 1] = old[j] end
    ids = kept_records(ids)
    if #ids > 0 then rec_del(ids) end
  end
  local aged = redis.call('ZRANGEBYSCORE', K_COMPLETED, '-inf', fmt(now - hage), 'LIMIT', '0', '64')
  if #aged > 0 then
    redis.call('ZREM', K_COMPLETED, unpack(aged))
    aged = kept_records(aged)
    if #aged > 0 then rec_del(aged) end
  end
end

-- Complete a task under its lease. Returns true, or the refusal code of fenced() (nothing written).
-- The completed history is bounded: every `period`-th completion (period = history_max / 64, between
-- 1 and 16) trims it, so it holds at most history_max + period records; dedup remembers finished ids
-- in the compact buckets of _remembered.lua, with the completion hour that dedup expiry compares (not
-- one whose completion scheduled a run: its record, which the trim keeps, says it is finished). A
-- caller that already passed fenced() hands its (st, payload) in `held`, so the record is not read
-- twice. `sig` is the run's output verdict for its refetch schedule (_refetch.lua; nil or '' for none).
local function complete_task(id, token, hmax, hage, now, held, sig)
  local st, payload, refusal
  if held then
    st, payload = held[1], held[2]
  else
    st, payload, refusal = fenced(id, token)
    if refusal then return refusal end
  end
  redis.call('ZREM', K_RUNNING, id)
  redis.call('HDEL', K_CKPT, id)
  if st.h then host_end(st.h, now, true) end
  observe('r', st.n, st.ut, now) -- st.ut is the claim time: nothing else moves it while running
  st.s = 'c'
  st.w = nil
  st.ut = fmt(now)
  st.e = nil
  schedule_refetch(id, st, payload, now, sig)
  save(id, st, payload)
  redis.call('ZADD', K_COMPLETED, st.ut, id)
  -- A dedup id is remembered, unless a run was scheduled (st.iv): its record, kept while it waits,
  -- is the dedup memory then (_refetch.lua), and its next run would forget the id anyway.
  if st.dd and not st.iv then remember(id, now) end
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

-- Complete a task under its lease after storing the items from ARGV position `from` on (if any). The
-- items go first: HSETNX is then the step's first write, so a Redis over maxmemory refuses the whole
-- step (OOM, nothing written: the runner hands the task back) rather than letting a completion that
-- began with a ZREM write on past the limit. Fenced before any write; the record it read is handed to
-- complete_task. Returns the number of new items, or (nil, the refusal code) with nothing written.
local function complete_with_items(id, token, hmax, hage, now, sig, from)
  local added, held = 0, nil
  if #ARGV >= from then
    local st, payload, refusal = fenced(id, token)
    if refusal then return nil, refusal end
    added = store_items(from)
    held = {st, payload}
  end
  local done = complete_task(id, token, hmax, hage, now, held, sig)
  if done ~= true then return nil, done end
  return added
end
