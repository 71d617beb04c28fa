--[[ Hold a host back, or let it go: the fleet-wide politeness of a host (an operator's block, a
  Retry-After, a 429/503 without one, a refusal at fetch time). Its queued tasks stay queued and cost
  no worker slot; tasks already running are not touched.
  KEYS: the task-state layout (_common); none is touched but through the prefix, except
  KEYS[1]  tasks (read: the record of a 'request' that names its task, for the lease's fence)
  Same slot: the host gate's keys (_hosts.lua: h, hb, hl, hq, hcfg,
    hosts, hready, hwait) and the record buckets a fenced 'request' reads (_records.lua: t:<i>, tg)
    are named from ARGV[1], the prefix every KEYS entry
    starts with (its {hash tag} included), so they share KEYS[1]'s slot (_common checks it).
  ARGV[1] namespace prefix
  ARGV[2] host key
  ARGV[3] op: 'block' (blocked until now + ms, with the reason; replaces a block), 'extend' (the
    same, but never shortens a block: a Retry-After), 'backoff' (the backoff level grows by one, after
    being forgiven when the last block is at least the forgiveness old; blocked for
    min(cap, ms x 2^(level-1)) ms, scaled by a jitter factor between 1 - jitter and 1 + jitter),
    'unblock' (block and backoff level cleared), 'defer' (next eligible no earlier than now + ms: a
    refusal's retry time), 'start' (a request to the host got its answer, or went out, now: the
    host's spacing counts from here, however long the task took to get to it), 'request' (a request
    to the host asks to go out now: it may when the host is not blocked and the host's spacing has
    passed since the last request's start or answer, rs; then it is stamped as 'start' stamps it,
    and, with a task id and an in-flight bound under a concurrency limit, marked in flight until
    now + the bound (h:<host> f:<id>, _hosts.lua), else nothing is written and the reply says how
    long to wait), 'unsent' (the request a task's 'request' let go never went out: its mark goes,
    nothing is stamped). 'start' and 'unsent' with a task id drop that task's mark under its token
    (and a slot held for it since its lease ended: host_over), unfenced: a woken zombie's request is
    over too.
  ARGV[4] ms: the block's length, the backoff's start, or the deferral
  ARGV[5] reason (block, extend, backoff); for 'request', 'start' and 'unsent': the asking task's
    id, or '' (none), whose record is on this shard (a gated task is placed on its host's shard)
  ARGV[6] for 'request', 'start' and 'unsent' with a task id: its lease's fencing token
  ARGV[6] backoff: the cap (ms)
  ARGV[7] for 'request' with a task id: the ms the request may be in flight at most, counted from
    now (its wait for a proxy, its connect and its answer); '' or 0: no mark
  ARGV[7] backoff: forgiveness (ms without a block after which the level starts again)
  ARGV[8] backoff: jitter (a fraction)
  The gate's switch (hcfg 'on'): 'block' and 'unblock' (the operator's) switch it on; the others (the
  fetcher's) only in a namespace never switched, never after an explicit `hosts off`.
  Reply: the host's blocked-until time (ms, Redis clock; 0 = not blocked); for 'request', 0 when the
    request may go now (stamped), else the ms to wait for it (the block's end or the spacing's), or
    with a task id the refusal code (R_*, negative) when its lease is no longer the task's (a zombie
    woken after its task ran again elsewhere must not reach the site)
]]
--#include _common
local h, op = ARGV[2], ARGV[3]
local now = now_ms()
local hs = host_load(h)
local ms = tonumber(ARGV[4]) or 0
local fields
if op == 'block' or op == 'extend' then
  local bu = now + ms
  if op == 'extend' then bu = math.max(bu, n0(hs.bu)) end
  hs.bu = string.format('%.0f', bu)
  fields = {'bu', hs.bu, 'br', ARGV[5], 'lb', string.format('%.0f', now)}
elseif op == 'backoff' then
  local level = n0(hs.bl)
  if now - n0(hs.lb) >= (tonumber(ARGV[7]) or 0) then level = 0 end -- quiet that long (0: always)
  level = level + 1
  local t = redis.call('TIME')
  math.randomseed(tonumber(t[2]) + level * 7919)
  local jitter = tonumber(ARGV[8]) or 0
  local span = math.min(tonumber(ARGV[6]), ms * 2 ^ (level - 1)) * (1 + jitter * (2 * math.random() - 1))
  hs.bu = string.format('%.0f', math.max(n0(hs.bu), now + math.floor(span)))
  fields = {'bu', hs.bu, 'bl', tostring(level), 'br', ARGV[5], 'lb', string.format('%.0f', now)}
elseif op == 'unblock' then
  hs.bu = '0'
  fields = {'bu', '0', 'bl', '0', 'br', ''}
elseif op == 'start' or op == 'request' then
  if op == 'request' then
    if ARGV[5] ~= '' then
      local st, _, refused = fenced(ARGV[5], ARGV[6])
      if not st then return refused end
    end
    -- Requests are spaced where the site sees them, not only hand-outs: a task claimed on time may
    -- reach its request late (a slow robots.txt first, a retry, its second page) and meet another's.
    local wait = math.max(n0(hs.bu) - now, n0(hs.rs) + host_interval(hs) - now)
    if wait > 0 then return wait end
  end
  hs.ls = string.format('%.0f', math.max(n0(hs.ls), now))
  hs.rs = string.format('%.0f', math.max(n0(hs.rs), now))
  fields = {'ls', hs.ls, 'rs', hs.rs}
  local bound = tonumber(ARGV[7]) or 0
  if op == 'start' and ARGV[5] ~= '' then
    host_over(h, hs, ARGV[5], ARGV[6])
  elseif op == 'request' and ARGV[5] ~= '' and bound > 0 and hnum(hs, 'cc', 0) > 0 then
    -- Under a concurrency limit, until its answer is reported the request may be in flight: should
    -- its task end first (its holder killed, or stopped past its lease), the slot stays taken.
    host_sweep(h, hs, now)
    fields[5], fields[6] = 'f:' .. ARGV[5], ARGV[6] .. ':' .. string.format('%.0f', now + bound)
  end
elseif op == 'unsent' then
  if ARGV[5] ~= '' and host_over(h, hs, ARGV[5], ARGV[6]) then host_place(h, hs, now) end
  return hs.bu and tonumber(hs.bu) > now and tonumber(hs.bu) or 0
elseif op == 'defer' then
  hs.ne = string.format('%.0f', math.max(n0(hs.ne), now + ms))
  fields = {'ne', hs.ne}
else
  return redis.error_reply('ERR celery-ha: unknown host op ' .. tostring(op))
end
redis.call('HSET', hkey(h), unpack(fields))
-- An operator's block or unblock switches the gate on; what the fetcher reports of a task (its
-- request's stamps, a refusal, a 429/503) switches on only a namespace never switched: the task may be
-- one still draining from its host's queue after `hosts off`, which must stay off.
if op == 'block' or op == 'unblock' then
  redis.call('HSET', K_HCFG, 'on', '1')
else
  redis.call('HSETNX', K_HCFG, 'on', '1')
end
redis.call('SADD', K_HOSTS, h)
host_place(h, hs, now)
return hs.bu and tonumber(hs.bu) > now and tonumber(hs.bu) or 0
