--[[ Enqueue a batch in one round trip. The state part of a record is the same for a whole run, so
  it is encoded once per run; records and ready ids are written with one HSET / RPUSH per 1000 tasks
  and each band is marked ready once.
  KEYS[1]  tasks
  KEYS[2]  readyp
  KEYS[8]  seen (a finished dedup id counts as a duplicate)
  KEYS[10] stats
  KEYS[11] wake (one token per created task, for blocked claim_next callers)
  Same slot: the ready lists r:<priority> it may touch are named from ARGV[1], the prefix every KEYS
    entry starts with (its {hash tag} included), so they share KEYS[1]'s slot (_common checks it).
  ARGV[1] namespace prefix
  ARGV[2..] runs of tasks sharing their common fields: count, priority, dedup (1/0), task name,
    max_attempts, max_stalls, then count x (id, payload JSON)
  Reply: one character per task, in order: '1' new, '0' duplicate of a live or finished task, '-' id
    collision (a random id met an existing one: nothing written for it, the caller retries it)
]]
--#include _common
local now = now_ms()

-- Which ids exist already (a live record, or a finished dedup id in `seen`): one HMGET and one
-- SMISMEMBER per 1000 ids instead of two lookups per task.
local taken = {}
do
  local ids = {}
  local i = 2
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
    local finished = redis.call('SMISMEMBER', K_SEEN, unpack(ids, j, last))
    for k = 1, last - j + 1 do
      if records[k] or finished[k] == 1 then taken[ids[j + k - 1]] = true end
    end
  end
end

local reply = {}
local created, duplicates = 0, 0
local fresh = {}   -- ids created by this call: their HSET may still be pending
local records = {} -- pending HSET arguments: id, record, id, record, ...
local queued = band_batch()

local function write_records()
  if #records > 0 then
    redis.call('HSET', K_TASKS, unpack(records))
    records = {}
  end
end

local i = 2
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
    if fresh[id] or taken[id] then
      if dd == '1' then
        reply[#reply + 1] = '0'
        duplicates = duplicates + 1
      else
        reply[#reply + 1] = '-'
      end
    else
      fresh[id] = true
      records[#records + 1] = id
      records[#records + 1] = head .. ARGV[i + 1]
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
wake(created)
return table.concat(reply)
