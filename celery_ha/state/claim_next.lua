--[[ Standalone mode: claim the best queued task (highest priority, then FIFO). Due retries are
  promoted first, so a lone worker needs no beat.
  KEYS[1]  tasks
  KEYS[2]  readyp
  KEYS[3]  delayed (due retries are promoted)
  KEYS[4]  inflight (in grant(), which leaves it alone for a task popped from its band)
  KEYS[5]  running
  KEYS[9]  ckpt (read: the lease carries the checkpoint)
  KEYS[10] stats
  KEYS[11] wake (a token when a pop stopped at stale band entries: a blocked claim_next retries)
  KEYS[12] hist (the wait histogram counts the claim)
  Same slot: the record buckets (_records.lua: t:<i>, tg), the ready lists r:<priority> and the host gate's keys (_hosts.lua: h, hb, hl, hq, hcfg,
    hosts, hready, hwait) it may touch are
    named from ARGV[1], the prefix every KEYS entry starts with (its {hash tag} included), so they
    share KEYS[1]'s slot (_common checks it). tg's field mv (state/migrate_marks.py) closes the shard:
    a migration moved (or is moving) its tasks to another namespace.
  ARGV[1] namespace prefix
  ARGV[2] worker
  ARGV[3] lease ttl (ms)
  ARGV[4] promote limit (due retries moved per call)
  Reply: {id, token, expiry_ms, record, checkpoint|false}, the lease; or R_EMPTY (also for a closed
    shard: nothing promoted, nothing handed out)
]]
--#include _common
-- The record geometry that the first load() reads (_records.lua's rec_geometry), read first with the
-- shard's migration mark (as claim.lua reads it): a closed shard hands out no task. The same command
-- when a task is queued (the pop's load would read it); one HMGET more when nothing is.
local geometry = redis.call('HMGET', K_GEOM, 'l', 's', 'mv')
if geometry[3] then return R_EMPTY end
rec_level, rec_split = tonumber(geometry[1]) or 0, tonumber(geometry[2]) or 0
rec_mod = 2 ^ rec_level
return claim_best(ARGV[2], tonumber(ARGV[3]), ARGV[4], now_ms())
