--[[ Enqueue a batch in one round trip. The state part of a record is the same for a whole run, so
  it is encoded once per run; records and ready ids are written with one HSET / RPUSH per 1000 tasks
  and each band is marked ready once.
  Dedup: a dedup id that is live (queued, dispatched, running, delayed, dead) is a duplicate; one that
  finished is a duplicate until the recrawl window (ARGV[2]) has passed since its completion, and is
  then queued again as a new run of the same task: its completed record leaves the history, and its
  fencing tokens continue above every token of its earlier runs (from the old record's, or from the
  Redis clock in ms once the history forgot it), so a holder left over from an earlier run can never
  match a new lease.
  KEYS[1]  tasks
  KEYS[2]  readyp
  KEYS[7]  completed (a recrawled id leaves the history, whose trim would otherwise delete its record)
  KEYS[8]  done (finished dedup ids -> completion ms)
  KEYS[10] stats
  KEYS[11] wake (one token per created task, for blocked claim_next callers)
  Same slot: the ready lists r:<priority> it may touch and the 0.1 releases' dedup set `seen` (read
    while the sweep moves it into `done`) are named from ARGV[1], the prefix every KEYS entry starts
    with (its {hash tag} included), so they share KEYS[1]'s slot (_common checks it).
  ARGV[1] namespace prefix
  ARGV[2] recrawl window (ms): a dedup id finished at least that long ago is queued again; -1 = never
  ARGV[3..] runs of tasks sharing their common fields: count, priority, dedup (1/0), task name,
    max_attempts, max_stalls, then count x (id, payload JSON)
  Reply: one character per task, in order: '1' new (or a finished task queued again: counted in stats
    'recrawled' too), '0' duplicate of a live or recently finished task, '-' id collision (a random id
    met an existing one: nothing written for it, the caller retries it)
]]
--#include _common
local now = now_ms()

-- Which ids exist already (a live record, or a finished dedup id in `done`): one HMGET and one
-- ZMSCORE per 1000 ids instead of two lookups per task. `expired` holds the finished ids whose
-- recrawl window has passed, with their old record (false once the history trimmed it).
local window = tonumber(ARGV[2])
local cutoff = window >= 0 and now - window or nil
local legacy = PREFIX .. 'seen'
local has_legacy = redis.call('EXISTS', legacy) == 1
local taken, expired = {}, {}
do
  local ids = {}
  local i = 3
  while i <= #ARGV do
    local count = tonumber(ARGV[i])
    i = i + 6
    for _ = 1, count do
      ids[#ids + 1] = ARGV[i]
      i = i + 2
    end
  end
  for j = 1, #ids, 1000 do
    local last = math.min(j + 999, #ids)
    local records = redis.call('HMGET', K_TASKS, unpack(ids, j, last))
    local finished = redis.call('ZMSCORE', K_DONE, unpack(ids, j, last))
    local old = has_legacy and redis.call('SMISMEMBER', legacy, unpack(ids, j, last))
    for k = 1, last - j + 1 do
      local id, at = ids[j + k - 1], finished[k]
      if at and cutoff and tonumber(at) <= cutoff then
        expired[id] = records[k]
      elseif records[k] or at or (old and old[k] == 1) then
        taken[id] = true
      end
    end
  end
end

-- The state part of a finished task's next run: `st` with the token carried over (see the header).
-- Nil when its record says it is not finished after all (then it is a live duplicate).
local function next_run(id, st, old_record)
  local token = now
  if old_record then
    local old = decode(old_record)
    if old.s ~= 'c' then return nil end
    token = math.max(tonumber(old.k) or 0, now)
    redis.call('ZREM', K_COMPLETED, id)
  end
  redis.call('ZREM', K_DONE, id)
  local run = {}
  for key, value in pairs(st) do run[key] = value end
  run.k = fmt(token)
  return cjson.encode(run) .. '\n'
end

local reply = {}
local created, duplicates, recrawled = 0, 0, 0
local fresh = {}   -- ids created by this call: their HSET may still be pending
local records = {} -- pending HSET arguments: id, record, id, record, ...
local queued = band_batch()

local function write_records()
  if #records > 0 then
    redis.call('HSET', K_TASKS, unpack(records))
    records = {}
  end
end

local i = 3
while i <= #ARGV do
  local count, p, dd, name = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local st = {n = name, ct = fmt(now), ma = ARGV[i + 4], ms = ARGV[i + 5]}
  i = i + 6
  if p ~= '0' then st.p = p end
  if dd == '1' then st.dd = '1' end
  st.s = 'q'
  local head = cjson.encode(st) .. '\n'
  for _ = 1, count do
    local id = ARGV[i]
    local head_of = head
    if expired[id] ~= nil and dd == '1' and not fresh[id] then
      head_of = next_run(id, st, expired[id])
      if head_of then recrawled = recrawled + 1 end
    elseif expired[id] ~= nil then
      head_of = nil
    end
    if fresh[id] or taken[id] or not head_of then
      if dd == '1' then
        reply[#reply + 1] = '0'
        duplicates = duplicates + 1
      else
        reply[#reply + 1] = '-'
      end
    else
      fresh[id] = true
      records[#records + 1] = id
      records[#records + 1] = head_of .. ARGV[i + 1]
      if #records >= 2000 then write_records() end
      band_add(queued, p, id)
      created = created + 1
      reply[#reply + 1] = '1'
    end
    i = i + 2
  end
end
write_records()
band_flush(queued, 'RPUSH')
incr('duplicates', duplicates)
incr('enqueued', created)
incr('recrawled', recrawled)
wake(created)
return table.concat(reply)
