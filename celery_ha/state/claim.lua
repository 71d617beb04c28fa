--[[ Claim one named task: a Celery message carried its id.
  KEYS[1]  tasks
  KEYS[2]  readyp (a queued task leaves its band)
  KEYS[4]  inflight (a dispatched task leaves it)
  KEYS[5]  running
  KEYS[9]  ckpt (read: the lease carries the checkpoint)
  KEYS[10] stats
  KEYS[12] hist (the wait histogram counts the claim)
  Same slot: the record buckets (_records.lua: t:<i>, tg), the ready lists r:<priority> and the host gate's keys (_hosts.lua: h, hb, hl, hq, hcfg,
    hosts, hready, hwait) it may touch are
    named from ARGV[1], the prefix every KEYS entry starts with (its {hash tag} included), so they
    share KEYS[1]'s slot (_common checks it). tg's field mv (state/migrate_marks.py) closes the shard:
    a migration moved (or is moving) its tasks to another namespace.
  ARGV[1] namespace prefix
  ARGV[2] task id
  ARGV[3] worker
  ARGV[4] lease ttl (ms)
  ARGV[5] '1': adopt (a caller that alone runs tasks under its worker name: a prefork pool child):
    a task found running under this very worker is this caller's own lease whose grant it never
    heard of (a reply lost to a timeout, Redis paused, an exception between the reply and its use):
    it is returned as it is, same token, its expiry moved to now + ttl; '' or absent: refused
  Reply: {id, token, expiry_ms, record, checkpoint|false}, the lease; or a refusal when the task is
    not queued or dispatched, or its shard is closed (R_UNKNOWN: the task is not this namespace's any
    more; the message is then dropped): R_UNKNOWN, R_RUNNING, R_DELAYED,
    R_COMPLETED, R_DEAD; or R_WAITING for a dispatched task whose host (the host gate) was blocked
    since: it is queued again at the front of its host's queue, uncounted; and for a queued task
    whose host may not start a task now (blocked, at its concurrency, paced): it stays queued
]]
--#include _common
-- The read of the record geometry that load() makes first (_records.lua's rec_geometry), with the
-- shard's migration mark in the same command: a closed shard starts no task (no lease, not even an
-- adopted one), at no extra command per claim.
local geometry = redis.call('HMGET', K_GEOM, 'l', 's', 'mv')
if geometry[3] then return R_UNKNOWN end
rec_level, rec_split = tonumber(geometry[1]) or 0, tonumber(geometry[2]) or 0
rec_mod = 2 ^ rec_level
local st, payload = load(ARGV[2])
if not st then return R_UNKNOWN end
local now = now_ms()
if ARGV[5] == '1' and st.s == 'r' and st.w == ARGV[3] then
  local expiry = fmt(now + tonumber(ARGV[4]))
  redis.call('ZADD', K_RUNNING, expiry, ARGV[2])
  return {ARGV[2], st.k, expiry, rec_get(ARGV[2]), redis.call('HGET', K_CKPT, ARGV[2])}
end
return grant(ARGV[2], st, payload, ARGV[3], tonumber(ARGV[4]), now, false)
