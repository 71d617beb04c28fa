--[[ Add or update proxies in one atomic step (validated in Python beforehand).
  A new proxy joins the available zone (or the 'new' zone when it must pass a health check first) with
  the probation score. A known proxy keeps its statistics; its URL, source and expiry are refreshed. A
  permanently banned proxy is never re-admitted by an add (only an explicit unban does that), not even
  after it expired: its tombstone (tomb:<id>, left by housekeeping in _common) keeps it out. A proxy
  that expired during a temporary ban comes back still banned until the ban's end, and with its ban
  count. An id never moves to another group: a second provider claiming it is skipped.
  KEYS[1] the available zone
  Same slot: the keys it builds (all, exp, gcap, gen, grp, m:<id>, new, pb, stats, tb, tomb:<id>, each
    under cha:{ns}:px:) are named from ARGV[1], the prefix KEYS[1] starts with ({hash tag} included), so they
    share KEYS[1]'s slot (_common checks it).
  ARGV[1] the pool's key prefix
  ARGV[2] JSON list of {id, url, masked, scheme, host, port, user, source, ttl_ms, group, verify}
          (built by celery_ha/proxy/records.py: add_item)
  ARGV[3] JSON object {group: concurrency cap} (may be empty)
  ARGV[4] score constants (scoring.py SCORE_ARG)
  Reply: {added, updated, skipped, conflicts}: skipped counts the proxies left out (permanently banned,
    or held by another group), conflicts those of them held by another group
]]
--#include _common
local P = ARGV[1]
local items = cjson.decode(ARGV[2])
local caps = cjson.decode(ARGV[3])
local K = numargs(ARGV[4])
local now = now_ms()
local added, updated, skipped, conflicts = 0, 0, 0, 0
for g, cap in pairs(caps) do redis.call('HSET', P .. 'gcap', g, cap) end
for _, it in ipairs(items) do
  local pid = it.id
  local mk = P .. 'm:' .. pid
  local exists = redis.call('EXISTS', mk) == 1
  local expires = 0
  if tonumber(it.ttl_ms) and tonumber(it.ttl_ms) > 0 then expires = now + tonumber(it.ttl_ms) end
  local tk = P .. 'tomb:' .. pid
  local tomb = {false, false, false, false}
  if not exists then tomb = redis.call('HMGET', tk, 'state', 'tbans', 'ban_until', 'ban_reason') end
  local held = it.group and it.group ~= '' and redis.call('HGET', P .. 'grp', pid)
  if held and held ~= it.group then
    skipped = skipped + 1
    conflicts = conflicts + 1
  elseif (exists and redis.call('HGET', mk, 'state') == 'pban') or tomb[1] == 'pban' then
    skipped = skipped + 1
  else
    redis.call('HSET', mk, 'url', it.url, 'masked', it.masked, 'scheme', it.scheme, 'host', it.host,
      'port', it.port, 'user', it.user, 'source', it.source, 'expires_at', expires)
    if expires > 0 then redis.call('ZADD', P .. 'exp', expires, pid) else redis.call('ZREM', P .. 'exp', pid) end
    if it.group and it.group ~= '' then redis.call('HSET', P .. 'grp', pid, it.group) end
    if exists then
      if expires > 0 then redis.call('HSET', mk, 'added_at', now) end
      local st = redis.call('HGET', mk, 'state')
      if st == 'avail' then redis.call('ZADD', P .. 'av', 'XX', score_of(P, pid, now, K), pid) end
      updated = updated + 1
    else
      redis.call('HSET', mk, 'id', pid, 'added_at', now, 's', 0, 't', 0, 'ln', 0, 'ld', 0, 'cf', 0,
        'tbans', tonumber(tomb[2]) or 0, 'okst', 0, 'lat_ewma', -1)
      redis.call('SADD', P .. 'all', pid)
      local untl = tonumber(tomb[3]) or 0
      if tomb[1] then redis.call('DEL', tk) end
      if tomb[1] == 'tban' and untl > now then
        redis.call('ZADD', P .. 'tb', untl, pid)
        redis.call('HSET', mk, 'state', 'tban', 'ban_until', untl, 'ban_reason', tomb[4] or '',
          'score', score_of(P, pid, now, K))
      elseif it.verify then
        redis.call('ZADD', P .. 'new', now, pid)
        redis.call('HSET', mk, 'state', 'new', 'score', score_of(P, pid, now, K))
      else
        make_available(P, pid, now, K)
      end
      added = added + 1
    end
  end
end
if added > 0 then redis.call('HINCRBY', P .. 'stats', 'added', added) end
-- New caps or groups may free a proxy for a domain acquire found exhausted.
redis.call('INCR', P .. 'gen')
return {added, updated, skipped, conflicts}
