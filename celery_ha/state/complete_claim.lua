--[[ Complete a task under its lease and claim the next task of the same Celery message (a batch,
  CELERY_HA_BATCH) in the same step: one script per task of a batch instead of a completion and a
  claim. No window refill (a batch refills once, with its last task: complete_dispatch.lua). A stale
  lease writes nothing and claims nothing.
  KEYS[1]  tasks
  KEYS[2]  readyp (a queued next task leaves its band)
  KEYS[4]  inflight (a dispatched next task leaves it)
  KEYS[5]  running
  KEYS[7]  completed
  KEYS[9]  ckpt (the completed task's is dropped; the next task's is read into its lease)
  KEYS[10] stats
  KEYS[12] hist (the runtime histogram counts the completion, the wait histogram the claim)
  KEYS[13] items (hash: item key -> item JSON)
  KEYS[14] itemlog (list: item keys in commit order)
  Same slot: the record buckets (_records.lua: t:<i>, tg), the ready lists r:<priority>, the host gate's keys (_hosts.lua: h, hb, hl, hq, hcfg,
    hosts, hready, hwait), the refetch schedule's (_refetch.lua: sched, rfb, refetch) and the bucket that
    remembers a dedup id with its completion hour (_remembered.lua: d:<3 chars> or d:~; its bit in
    the bitmap dk) it may touch are
    named from ARGV[1], the prefix every KEYS entry starts with (its {hash tag} included), so they
    share KEYS[1]'s slot (_common checks it). The next task must be on the same shard (the caller
    checks). tg's field mv (state/migrate_marks.py) closes the shard: a migration moved (or is moving)
    its tasks to another namespace; the completion stands, the next task is refused (R_UNKNOWN).
  ARGV[1]  namespace prefix
  ARGV[2]  task id
  ARGV[3]  fencing token
  ARGV[4]  history_max (completed records kept)
  ARGV[5]  history_age (ms a completed record is kept)
  ARGV[6]  the run's output verdict for its refetch schedule: '' none, '=' unchanged, else its
    signature (_refetch.lua)
  ARGV[7]  the next task's id
  ARGV[8]  worker (the next lease's holder)
  ARGV[9]  lease ttl (ms)
  ARGV[10..] item key, item JSON, item key, item JSON, ... (a key the sink holds is ignored)
  Reply: {new items, the next task's lease as claim.lua's reply, or its refusal code}; or a refusal
    of the completion (nothing written, nothing claimed): R_UNKNOWN, R_WAITING, R_STALE_TOKEN,
    R_DELAYED, R_COMPLETED, R_DEAD
]]
--#include _common
-- The record geometry that the fencing check's load() reads first (_records.lua's rec_geometry), read
-- here with the shard's migration mark (as claim.lua reads it): no extra command. A worker frozen
-- through a migration completes the task it held, and starts no other one here.
local geometry = redis.call('HMGET', K_GEOM, 'l', 's', 'mv')
rec_level, rec_split = tonumber(geometry[1]) or 0, tonumber(geometry[2]) or 0
rec_mod = 2 ^ rec_level
local now = now_ms()
local added, refusal = complete_with_items(ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), now,
  ARGV[6], 10)
if not added then return refusal end
if geometry[3] then return {added, R_UNKNOWN} end
local st, payload = load(ARGV[7])
if not st then return {added, R_UNKNOWN} end
return {added, grant(ARGV[7], st, payload, ARGV[8], tonumber(ARGV[9]), now, false)}
