--[[ Enqueue a batch in one round trip. The state part of a record is the same for a whole run, so
  it is encoded once per run; ready ids are written with one RPUSH per 1000 tasks and each band is
  marked ready once; each record is one HSET into its bucket (_records.lua), and the new records are
  counted once, at the end (which may split a few buckets).
  Dedup: a dedup id that is live (queued, dispatched, running, delayed, dead) is a duplicate; one that
  finished is a duplicate until the recrawl window (ARGV[2]) has passed since its completion (exact
  while the history holds its record, or the record waits for a scheduled refetch (_refetch.lua: such a
  dedup id is not remembered, its record is), else the start of its completion hour: _remembered.lua), and is
  then queued again as a new run of the same task: its completed record leaves the history, and its
  fencing tokens continue above every token of its earlier runs (from the old record's, or from the
  Redis clock in ms once the history forgot it), so a holder left over from an earlier run can never
  match a new lease.
  KEYS[1]  tasks
  KEYS[2]  readyp
  KEYS[7]  completed (a recrawled id leaves the history, whose trim would otherwise delete its record)
  KEYS[8]  done (the old sorted set of finished dedup ids -> completion ms, read until the sweep
    moved it into the buckets of _remembered.lua)
  KEYS[10] stats (refetch_waiting: a waiting record queued again leaves it)
  KEYS[11] wake (one token per created task, for blocked claim_next callers)
  Same slot: the record buckets and their geometry (_records.lua: t:<i>, tg), the ready lists r:<priority>, the host gate's keys (_hosts.lua: h, hb, hl, hq, hcfg,
    hosts, hready, hwait) it may touch, the refetch indexes (_refetch.lua: rfb, refetch; whether any
    record may wait; a finished id queued again leaves refetch), the split's rfb (_records.lua), the
    buckets of remembered ids (_remembered.lua: d:<3 chars>, d:~) and the
    0.1 releases' dedup set `seen` (read while the sweep moves it) are named from ARGV[1],
    the prefix every KEYS entry starts with (its {hash tag} included), so they share KEYS[1]'s slot
    (_common checks it).
  ARGV[1] namespace prefix
  ARGV[2] recrawl window (ms): a dedup id finished at least that long ago is queued again; -1 = never
  ARGV[3] the host key mode the host keys were made under (host, registered-domain, custom)
  ARGV[4..] runs of tasks sharing their common fields: count, priority, dedup (1/0), task name,
    max_attempts, max_stalls, then count x (id, payload (_record_codec.lua), host key or '')
  The host gate: while the namespace's gate is on (hcfg 'on' = '1', _hosts.lua), a task with a host
    key records it (st.h) and is queued in its host's queue instead of its band; otherwise the key
    is ignored and the task is exactly as without a gate. While it is on, the keys must have been
    made under the namespace's key mode (hcfg 'km', default host): if not (another process changed
    it since this one read it), nothing is written and the reply is '!' .. the mode in force; the
    caller makes the keys again and retries.
  Reply: '!' .. mode (above), else one character per task, in order: '1' new (or a finished task queued again: counted in stats
    'recrawled' too), '0' duplicate of a live or recently finished task, '-' id collision (a random id
    met an existing one: nothing written for it, the caller retries it)
]]
--#include _common
local now = now_ms()
local gate = redis.call('HGET', K_HCFG, 'on') == '1'
if gate then
  local mode = redis.call('HGET', K_HCFG, 'km') or 'host'
  if mode ~= ARGV[3] then return '!' .. mode end
end

-- Which ids exist already (a live record, or a remembered finished dedup id): one HGET of its record's
-- bucket and one of its remembered bucket per id. `expired` holds the finished ids whose recrawl window has
-- passed, with their old record (false once the history trimmed it). A remembered time is the start
-- of its hour: when it says expired, the record, while the history holds it, has the exact time.
local window = tonumber(ARGV[2])
local cutoff = window >= 0 and now - window or nil
local legacy = PREFIX .. 'seen'
local has_legacy = redis.call('EXISTS', legacy) == 1
local has_zset = redis.call('EXISTS', K_DONE) == 1
-- Whether any record may wait for a scheduled run (_refetch.lua: an index exists): only then may a
-- record without a remembered time be a finished task's (a waiting dedup task is not remembered).
local has_waiting = cutoff and redis.call('EXISTS', PREFIX .. 'rfb', K_REFETCH) > 0
local function finished_time(id, zscore)
  local key, field = done_slot(id)
  local hour = redis.call('HGET', key, field)
  if hour then return hour_ms(hour) end
  return zscore and tonumber(zscore) or nil
end
local taken, expired = {}, {}
do
  local ids = {}
  local i = 4
  while i <= #ARGV do
    local count = tonumber(ARGV[i])
    i = i + 6
    for _ = 1, count do
      ids[#ids + 1] = ARGV[i]
      i = i + 3
    end
  end
  for j = 1, #ids, 1000 do
    local last = math.min(j + 999, #ids)
    local records = {}
    for k = j, last do records[k - j + 1] = rec_get(ids[k]) end
    local zset = has_zset and redis.call('ZMSCORE', K_DONE, unpack(ids, j, last)) or {}
    local old = has_legacy and redis.call('SMISMEMBER', legacy, unpack(ids, j, last))
    for k = 1, last - j + 1 do
      local id = ids[j + k - 1]
      local at -- not needed for an id with a record when no window applies: it is taken anyway
      if cutoff or not records[k] then at = finished_time(id, zset[k]) end
      if not at and has_waiting and records[k] then
        -- finished, its record kept for a scheduled refetch (no remembered hour): its own time
        local st = decode(records[k])
        if st.s == 'c' and waiting_due(st) then at = tonumber(st.ut) end
      end
      if at and cutoff and at <= cutoff and records[k] then
        local st = decode(records[k])
        if st.s == 'c' and tonumber(st.ut) > cutoff then at = nil end -- finished within the window
      end
      if at and cutoff and at <= cutoff then
        expired[id] = records[k]
      elseif records[k] or at or (old and old[k] == 1) then
        taken[id] = true
      end
    end
  end
end

-- The state of a finished task's next run: a copy of `st` with the token carried over (see the
-- header). Nil when its record says it is not finished after all (then it is a live duplicate).
local function next_run_of(id, st, old_record)
  local old = old_record and decode(old_record) or nil
  if old and old.s ~= 'c' then return nil end
  return next_run(id, st, old, now) -- _refetch.lua
end

local reply = {}
local created, duplicates, recrawled = 0, 0, 0
local fresh = {}   -- ids created by this call
local queued = band_batch()
rec_batch()

local i = 4
while i <= #ARGV do
  local count, p, dd, name = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local st = {ct = fmt(now)} -- fields at their default are left out (_common's header)
  if name ~= DEFAULT_TASK then st.n = name end
  if ARGV[i + 4] ~= '3' then st.ma = ARGV[i + 4] end
  if ARGV[i + 5] ~= '3' then st.ms = ARGV[i + 5] end
  i = i + 6
  if p ~= '0' then st.p = p end
  if dd == '1' then st.dd = '1' end
  st.s = 'q'
  local head = encode(st, '') -- the same for the whole run (but a recrawl's or a gated task's)
  -- A gated task whose URL names its host key has the head marked '~' (the key left out: encode's
  -- HOST_MARK): the same for the run too, taken once the first such row's own encoding agrees.
  local marked
  for _ = 1, count do
    local id = ARGV[i]
    local run = st -- its state, when it differs from the run's (a recrawl): nil for a duplicate
    if expired[id] ~= nil and dd == '1' and not fresh[id] then
      run = next_run_of(id, st, expired[id])
      if run then recrawled = recrawled + 1 end
    elseif expired[id] ~= nil then
      run = nil
    end
    if fresh[id] or taken[id] or not run then
      if dd == '1' then
        reply[#reply + 1] = '0'
        duplicates = duplicates + 1
      else
        reply[#reply + 1] = '-'
      end
    else
      fresh[id] = true
      local host = gate and ARGV[i + 2] ~= '' and ARGV[i + 2] or nil
      local record
      -- (not a payload starting 'https://', which encode would shorten)
      if host and run == st and marked and string.byte(ARGV[i + 1], 1) ~= 104
          and host == payload_host(ARGV[i + 1]) then
        record = marked .. ARGV[i + 1]
      elseif host or run ~= st then -- encoded with its payload: a host the URL names is left out of it
        run.h = host
        record = encode(run, ARGV[i + 1])
        run.h = nil
        if host and run == st and not marked and record == '~' .. head .. ARGV[i + 1] then
          marked = '~' .. head
        end
      else
        record = head .. ARGV[i + 1]
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
