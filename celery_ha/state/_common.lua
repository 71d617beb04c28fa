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
  A record is "<state head>\n<payload>": Lua decodes only the small state head; the payload stays an
  opaque string, so user JSON is never re-encoded by cjson. The payload is the JSON {"u": url[, "m":
  meta][, "t": trace]}, or the bare URL when that is all it holds and the URL needs no JSON escaping
  (state/enqueue_args.py), an https URL without its scheme: 'https://host/p' is stored '//host/p'.
  So a payload starting with '{' is JSON, one starting with '/' is an https URL ('https:' goes back
  in front: url_host of _refetch.lua, TaskInfo.parse of records.py), any other a bare URL as it is
  (http://, or an https URL a record of an earlier release holds whole). The JSON payload keeps the
  URL whole. encode() writes a bare 'https://' payload of an earlier release in the '//' form.
  The state head is compact: the values of the fields of HEAD_FIELDS, in that fixed order (the one
  source of truth with HEAD_FIELDS of celery_ha/state/records.py; fields are only added at the end),
  joined by the byte 0x1F, an absent field empty, trailing empty fields left out. Every value is a
  string as the scripts made it, integers and timestamps (decimal ms) included. The dedup flag
  (dd '1') is folded into the state letter: a dedup task's letter is written upper-case (Q D R W C
  X) and its dd field left empty, so a freshly queued dedup task's head is 'Q<1F>1733333333333' (15
  bytes; 'q<1F>1733333333333<1F>1', 17, before the fold; the JSON head was 39). decode() gives the
  scripts the lower-case letter and dd '1' back (a head with dd '1' and a lower-case letter, as
  earlier releases wrote, reads the same): the scripts see the lower-case st.s and st.dd only, and
  none reads the letter from the raw record. A state the compact head cannot hold (a field it does
  not know; a value that is empty, not a string, or holds 0x1F or a newline, as an error text may;
  a state st.s that starts with '{' or is one of the upper-case letters) is written as the JSON
  object of string values of earlier releases, which starts with '{' (a compact head never does)
  and is read as before: records of earlier releases stay readable and are written compact at
  their next write. Fields at their default are left out: n (the task name) when it is fetch_page,
  ma and ms (max_attempts, max_stalls) when they are 3, and h (the host gate's key) when it is the
  host the bare-URL payload names as written: the compact head then starts with '~' (payload_host).
  One-letter states (st.s): q queued, d dispatched, r running, w delayed, c completed, x dead (in a
  compact head, Q D R W C X for a dedup task's).
  Timestamps in the state part (ms, Redis clock): ct created, ut last transition (for a running task:
  its claim), due (a delayed task's retry time), qt (when a waiting task became ready, kept from a
  retry's promotion or a dispatch until its claim; otherwise ut or ct say it).
  Defines: the K_* keys and PREFIX; fmt, decode, load, encode, save (records; HEAD_FIELDS and
  compact_head: the compact head); ready_key, push_ready,
  live_in, pop_ready, pop_best, unready, band_batch, band_add, band_flush (ready lists and, for a task with a
  host key st.h, its host's queue: the host gate of _hosts.lua, included below ready_key);
  hist_bucket, observe (histograms);
  incr, wake, promote_due, to_dead,
  stall, fenced, grant, claim_best, trim_history, complete_task (transitions); store_items (the sink),
  complete_with_items (the sink's last items, then the completion);
  schedule_refetch, kept_records, requeue_finished (refetch schedules, _refetch.lua);
  remember, done_time, forget_done and the rest of _remembered.lua (finished dedup ids);
  and, from the includes
  below, now_ms and now_us_score (clock), the R_* refusal codes and refusal_in (_replies), and the
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

-- The task name a record leaves out (st.n absent): decode() puts it back, encode() leaves it out.
local DEFAULT_TASK = 'fetch_page'

-- The compact state head (see the header). HEAD_FIELDS is the order, the one source of truth with
-- HEAD_FIELDS of celery_ha/state/records.py (tests/state/test_compact_head.py checks that the two
-- and the unrolled code below agree); fields are only ever added at the end. The first 12 (every
-- field of a queued, dispatched, running or completed task) are read and written by unrolled code
-- (about as fast as cjson was); a state with any of the others goes through the general loops.
local HEAD_FIELDS = {'s', 'ct', 'dd', 'n', 'p', 'h', 'ma', 'ms', 'ut', 'k', 'w', 'qt', 'a', 'st', 'due',
                     'e', 'pe', 'f', 'iv', 'sg'}
local HEAD_SEP = '\31'
-- The state letter of a dedup task (dd '1'), written upper-case with the dd field left empty, and
-- back (tests/state/test_compact_head.py checks these against DEDUP_LETTERS of records.py).
local DD_UP = {q = 'Q', d = 'D', r = 'R', w = 'W', c = 'C', x = 'X'}
local DD_DOWN = {Q = 'q', D = 'd', R = 'r', W = 'w', C = 'c', X = 'x'}
-- The first 12 fields, the rest of the head, and where the head ends. One literal, so no pattern is
-- built at each call: ('([^\31\n]*)\31?' x 12) .. '([^\n]*)()'.
local HEAD_HOT = '^([^\31\n]*)\31?([^\31\n]*)\31?([^\31\n]*)\31?([^\31\n]*)\31?([^\31\n]*)\31?([^\31\n]*)\31?([^\31\n]*)\31?([^\31\n]*)\31?([^\31\n]*)\31?([^\31\n]*)\31?([^\31\n]*)\31?([^\31\n]*)\31?([^\n]*)()'
local head_pos -- field -> position, built at the first need (the general ways only)
local function head_position(key)
  if not head_pos then
    head_pos = {}
    for j, name in ipairs(HEAD_FIELDS) do head_pos[name] = j end
  end
  return head_pos[key]
end
-- States that encode() must not take the unrolled way: decoded from a JSON head with a field the
-- compact head does not know or a value it cannot hold, or from a compact head with positions past
-- HEAD_FIELDS (a later release's).
local head_odd
--#per-call
head_odd = {}
--#end-per-call

-- Fields 13 on of a compact head (`rest`: their values, HEAD_SEP-separated) into `st`.
local function head_rest(st, rest)
  local j, from, len = 13, 1, #rest
  while from <= len do
    local to = string.find(rest, HEAD_SEP, from, true) or len + 1
    if to > from then
      local key = HEAD_FIELDS[j]
      if not key then
        key = j
        head_odd[st] = true
      end
      st[key] = string.sub(rest, from, to - 1)
    end
    j = j + 1
    from = to + 1
  end
end

-- A stored record -> (state table, payload string). A head starting with '{' is the JSON object of
-- earlier releases (or of a state the compact head cannot hold); any other is the compact head.
-- The host a bare-URL payload names: what follows '//' up to the path, query or fragment, as
-- written ('//host/p', the https form, or 'scheme://host/p'); nil for a JSON payload. A record whose
-- host key is exactly that leaves it out and starts with HOST_MARK instead (encode, decode): the
-- host gate's key is the URL's host for most tasks, ~20 bytes a record. records.py's payload_host
-- reads the same text the same way.
local HOST_MARK = 126 -- '~'
local function payload_host(payload)
  local first = string.byte(payload, 1)
  if first == 47 then return string.match(payload, '^//([^/?#]*)') end
  if first == 123 then return nil end
  return string.match(payload, '^%a[%w+.-]*://([^/?#]*)')
end

local function decode(raw)
  local st, nl
  if string.byte(raw, 1) == 123 then
    nl = string.find(raw, '\n', 1, true)
    st = cjson.decode(string.sub(raw, 1, nl - 1))
    for key, v in pairs(st) do
      if not head_position(key) or type(v) ~= 'string' or v == '' or string.find(v, '[\31\n]')
          or key == 's' and (string.byte(v) == 123 or DD_DOWN[v]) then
        head_odd[st] = true
        break
      end
    end
    if not st.n then st.n = DEFAULT_TASK end
  else
    local s, ct, dd, n, p, h, ma, ms, ut, k, w, qt, rest
    local marked = string.byte(raw, 1) == HOST_MARK
    s, ct, dd, n, p, h, ma, ms, ut, k, w, qt, rest, nl = string.match(raw, HEAD_HOT, marked and 2 or 1)
    local low = DD_DOWN[s]
    if low then s, dd = low, '1' end -- a dedup task's letter (the dd field of earlier heads: as is)
    st = {s = s ~= '' and s or nil, ct = ct ~= '' and ct or nil, dd = dd ~= '' and dd or nil,
          n = n ~= '' and n or DEFAULT_TASK, p = p ~= '' and p or nil, h = h ~= '' and h or nil,
          ma = ma ~= '' and ma or nil, ms = ms ~= '' and ms or nil, ut = ut ~= '' and ut or nil,
          k = k ~= '' and k or nil, w = w ~= '' and w or nil, qt = qt ~= '' and qt or nil}
    if rest ~= '' then head_rest(st, rest) end
    if marked then
      local payload = string.sub(raw, nl + 1)
      st.h = payload_host(payload)
      return st, payload
    end
  end
  return st, string.sub(raw, nl + 1)
end

local function load(id)
  local raw = rec_get(id)
  if not raw then return nil, nil end
  return decode(raw)
end

-- The compact head of any state, or nil when it cannot say it (a field it does not know, a value
-- that is not a non-empty string or holds HEAD_SEP or a newline, a state starting with '{').
local function compact_head(st)
  local vals, last = {}, 0
  for key, v in pairs(st) do
    local j = head_position(key) or (type(key) == 'number' and key > #HEAD_FIELDS and key % 1 == 0 and key)
    if not j or type(v) ~= 'string' or v == '' or string.find(v, '[\31\n]') then return nil end
    vals[j] = v
    if j > last then last = j end
  end
  local s = vals[1]
  -- A head starting with '{' would read as a JSON head, an upper-case letter as a dedup task's.
  if s and (string.byte(s) == 123 or DD_DOWN[s]) then return nil end
  if vals[3] == '1' and DD_UP[s] then -- the dedup flag goes into the state letter
    vals[1], vals[3] = DD_UP[s], nil
    while last > 0 and not vals[last] do last = last - 1 end
  end
  for j = 1, last do
    if not vals[j] then vals[j] = '' end
  end
  return table.concat(vals, HEAD_SEP, 1, last)
end

-- The record of (st, payload): the compact head when it can hold the state, else the JSON head. The
-- common states (fields 1-12 only) take the unrolled way, which looks for HEAD_SEP and newlines
-- only in the free-text values (n, h, w): the others are made by the scripts (states, counters,
-- validated priorities and limits, times from fmt), or come from a JSON head whose odd values
-- decode() marked in head_odd.
local function encode(st, payload)
  if string.byte(payload, 1) == 104 and string.sub(payload, 1, 8) == 'https://' then
    payload = string.sub(payload, 7) -- the scheme-relative form (see the header)
  end
  local s, ct, dd, name, p, h, ma, ms = st.s, st.ct, st.dd, st.n, st.p, st.h, st.ma, st.ms
  local ut, k, w, qt = st.ut, st.k, st.w, st.qt
  local n = name ~= DEFAULT_TASK and name or nil
  if head_odd[st] or st.a or st.st or st.due or st.e or st.pe or st.f or st.iv or st.sg
      or n and (n == '' or string.find(n, '[\31\n]')) or h and (h == '' or string.find(h, '[\31\n]'))
      or w and (w == '' or string.find(w, '[\31\n]')) or s == '' or ct == '' or dd == '' or p == ''
      or ma == '' or ms == '' or ut == '' or k == '' or qt == '' or DD_DOWN[s] then
    st.n = n
    local head = compact_head(st) or cjson.encode(st)
    st.n = name
    return head .. '\n' .. payload
  end
  if dd == '1' and DD_UP[s] then s, dd = DD_UP[s], nil end -- the dedup flag in the state letter
  local mark = ''
  if h and h == payload_host(payload) then mark, h = '~', nil end -- the URL's own host (HOST_MARK)
  local last = qt and 12 or w and 11 or k and 10 or ut and 9 or ms and 8 or ma and 7 or h and 6
    or p and 5 or n and 4 or dd and 3 or ct and 2 or 1
  local head = (s or '') .. '\31' .. (ct or '') .. '\31' .. (dd or '') .. '\31' .. (n or '') .. '\31'
    .. (p or '') .. '\31' .. (h or '') .. '\31' .. (ma or '') .. '\31' .. (ms or '') .. '\31' .. (ut or '')
    .. '\31' .. (k or '') .. '\31' .. (w or '') .. '\31' .. (qt or '')
  return mark .. string.sub(head, 1, #head - 12 + last) .. '\n' .. payload
end

-- Write a record back; returns it (a lease's reply carries it without encoding it twice).
local function save(id, st, payload)
  local rec = encode(st, payload)
  rec_set(id, rec)
  return rec
end

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

local function to_dead(id, st, now, reason)
  if st.h then host_dead(st.h) end
  st.s = 'x'
  st.e = reason
  st.ut = fmt(now)
  redis.call('ZADD', K_DEAD, now_us_score(), id)
  incr('died', 1)
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

-- Drop completed records beyond history_max or older than history_age_ms, at most 64 of each.
--#include _refetch

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
-- in the compact buckets of _remembered.lua, with the completion hour that dedup expiry compares. A
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
  if st.dd then remember(id, now) end
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
