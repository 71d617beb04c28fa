--[[ Dedup upkeep, run by the maintenance sweep: bounds `done` by the dedup TTL and moves the 0.1
  releases' dedup set into it. A finished id older than the TTL is forgotten once its record has left
  the completed history (until then the record says the task is finished, and enqueue's recrawl
  window decides); an id of the old set `seen` (no completion time) enters `done` as finished now.
  KEYS[7]  completed (an id still in the history is kept)
  KEYS[8]  done (finished dedup ids -> completion ms)
  Same slot: the old set `seen` is named from ARGV[1], the prefix every KEYS entry starts with (its
    {hash tag} included), so it shares KEYS[1]'s slot (_common checks it).
  ARGV[1] namespace prefix
  ARGV[2] dedup TTL (ms); -1 = never forget
  ARGV[3] limit: most ids examined for each of the two jobs per call
  Reply: {forgotten, moved (from the old set), more (1 when either job has more left)}
]]
--#include _common
local now = now_ms()
local limit = tonumber(ARGV[3])
local ttl = tonumber(ARGV[2])
local forgotten, moved, more = 0, 0, 0

if ttl >= 0 then
  local old = redis.call('ZRANGEBYSCORE', K_DONE, '-inf', fmt(now - ttl), 'LIMIT', '0', ARGV[3])
  if #old == limit then more = 1 end
  for j = 1, #old, 1000 do
    local last = math.min(j + 999, #old)
    local kept = redis.call('ZMSCORE', K_COMPLETED, unpack(old, j, last))
    local gone = {}
    for k = 1, last - j + 1 do
      if not kept[k] then gone[#gone + 1] = old[j + k - 1] end
    end
    if #gone > 0 then
      redis.call('ZREM', K_DONE, unpack(gone))
      forgotten = forgotten + #gone
    end
  end
end

local legacy = PREFIX .. 'seen'
local ids = redis.call('SPOP', legacy, limit)
if #ids > 0 then
  local stamped = {}
  for _, id in ipairs(ids) do
    stamped[#stamped + 1] = fmt(now)
    stamped[#stamped + 1] = id
  end
  for j = 1, #stamped, 2000 do
    redis.call('ZADD', K_DONE, 'NX', unpack(stamped, j, math.min(j + 1999, #stamped)))
  end
  moved = #ids
  if redis.call('EXISTS', legacy) == 1 then more = 1 end
end
return {forgotten, moved, more}
