--[[ Dedup upkeep of carried ids (state/carried.py), run by the maintenance sweep after
  forget_finished: forgets the remembered ids of a migration's ancestors that are older than the dedup
  TTL. Only a migration writes carried ids, so a pass over their buckets needs no cursor safety
  against new ones; it starts only once the TTL may have reached the oldest carried hour (stats
  'cmin'), so after the first pass a sweep reads nothing until then. A pass that keeps no id marks
  the shard as carrying none ('cmin' -1); the caller drops the namespace's `carry` list once every
  shard is so, and enqueue stops looking carried ids up.
  A pass reads only the buckets the bitmap cdk marks (as dk for remembered ids; a bucket it empties
  loses its mark); without the bitmap (carried by a migration before it was kept), every bucket,
  BUCKETS_PER_CALL a call.
  KEYS[10] stats ('ccur' the next bucket of a pass under way, 'cpmin' the oldest hour it kept so far,
    'cmin' the oldest carried hour after the last pass, -1 for none)
  Same slot: the carried buckets cd:<3 chars> and cd:~ and their bitmap cdk are named from ARGV[1], the prefix every
    KEYS entry starts with (its {hash tag} included), so they share KEYS[1]'s slot (_common checks it).
  ARGV[1] namespace prefix
  ARGV[2] dedup TTL (ms, >= 0)
  ARGV[3] limit: most ids examined per call
  Reply: {forgotten, more (1 while a pass is under way), none (1 when the shard carries no id)}
]]
--#include _common
local now = now_ms()
local ttl, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local BUCKETS_PER_CALL = 2048
local cutoff = done_hour(now - ttl) -- an id of this hour or older is past the TTL
local cur, pmin = tonumber(redis.call('HGET', K_STATS, 'ccur')), nil
if cur then
  pmin = tonumber(redis.call('HGET', K_STATS, 'cpmin'))
else
  local cmin = redis.call('HGET', K_STATS, 'cmin')
  if cmin == '-1' then return {0, 0, 1} end
  if cmin and tonumber(cmin) > cutoff then return {0, 0, 0} end
  cur = 0
end
local carried, K_CDK = PREFIX .. 'c', PREFIX .. 'cdk'
local has_marks = redis.call('EXISTS', K_CDK) == 1
local next_marked = has_marks and bitmap_reader(K_CDK) or function(i) return i end
local forgotten, examined, visited = 0, 0, 0
while cur <= DONE_BUCKETS and examined < limit and visited < BUCKETS_PER_CALL do
  cur = next_marked(cur)
  local key = carried .. string.sub(done_bucket(cur), #PREFIX + 1)
  local flat = redis.call('HGETALL', key)
  visited = visited + 1
  examined = examined + #flat / 2
  local gone = {}
  for j = 1, #flat, 2 do
    local hour = tonumber(flat[j + 1])
    if hour <= cutoff then
      gone[#gone + 1] = flat[j]
    elseif not pmin or hour < pmin then
      pmin = hour
    end
  end
  for j = 1, #gone, 1000 do
    redis.call('HDEL', key, unpack(gone, j, math.min(j + 999, #gone)))
  end
  if has_marks and #gone * 2 == #flat and cur < DONE_BUCKETS then
    redis.call('SETBIT', K_CDK, tostring(cur), '0')
  end
  forgotten = forgotten + #gone
  cur = cur + 1
end
if cur > DONE_BUCKETS then -- the pass is over
  redis.call('HSET', K_STATS, 'cmin', pmin and tostring(pmin) or '-1')
  redis.call('HDEL', K_STATS, 'ccur', 'cpmin')
  if not pmin then redis.call('DEL', K_CDK) end
  return {forgotten, 0, pmin and 0 or 1}
end
redis.call('HSET', K_STATS, 'ccur', tostring(cur))
if pmin then redis.call('HSET', K_STATS, 'cpmin', tostring(pmin)) end
return {forgotten, 1, 0}
