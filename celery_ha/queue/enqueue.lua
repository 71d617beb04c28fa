--#include _common
-- Enqueue a batch in one round trip. ARGV: prefix, then runs of tasks sharing their common fields:
--   count, priority, dedup (1/0), task name, max_attempts, max_stalls, then count x (id, payload JSON).
-- Reply: one character per task, in order: '1' new, '0' duplicate of a live or finished task,
-- '-' id collision (a random id met an existing one).
-- The state part of a record is the same for a whole run, so it is encoded once per run; records and
-- ready ids are written with one HSET / RPUSH per 1000 tasks and each band is marked ready once.
local now = now_ms()
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
  local count, p, dd, name = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), ARGV[i + 2], ARGV[i + 3]
  local st = {n = name, ct = fmt(now), ma = tonumber(ARGV[i + 4]), ms = tonumber(ARGV[i + 5])}
  i = i + 6
  if p ~= 0 then st.p = p end
  if dd == '1' then st.dd = 1 end
  st.s = 'q'
  local head = cjson.encode(st) .. '\n'
  for _ = 1, count do
    local id = ARGV[i]
    if fresh[id] or redis.call('HEXISTS', K_TASKS, id) == 1 or redis.call('SISMEMBER', K_SEEN, id) == 1 then
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
