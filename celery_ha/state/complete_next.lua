--[[ Complete a task and claim the next queued one in the same step: one round trip per task for a
  busy standalone worker.
  KEYS[1]  tasks
  KEYS[2]  readyp
  KEYS[3]  delayed (due retries are promoted)
  KEYS[4]  inflight (in grant(), which leaves it alone for a task popped from its band)
  KEYS[5]  running
  KEYS[7]  completed
  KEYS[9]  ckpt
  KEYS[10] stats
  KEYS[11] wake (a token when a pop stopped at stale band entries: a blocked claim_next retries)
  KEYS[12] hist (the runtime and wait histograms count the completion and the next claim)
  Same slot: the record buckets (_records.lua: t:<i>, tg), the ready lists r:<priority>, the host gate's keys (_hosts.lua: h, hb, hl, hq, hcfg,
    hosts, hready, hwait), the refetch schedule's (_refetch.lua: sched, rfb, refetch) and the bucket that
    remembers a dedup id with its completion hour (_remembered.lua: d:<3 chars> or d:~; its bit in
    the bitmap dk) it may touch are
    named from ARGV[1], the prefix every KEYS entry starts with (its {hash tag} included), so they
    share KEYS[1]'s slot (_common checks it). tg's field mv (state/migrate_marks.py) closes the shard:
    a migration moved (or is moving) its tasks to another namespace; the completion stands, no next
    task is claimed.
  ARGV[1] namespace prefix
  ARGV[2] task id
  ARGV[3] fencing token
  ARGV[4] history_max (completed records kept)
  ARGV[5] history_age (ms a completed record is kept)
  ARGV[6] worker (of the next lease)
  ARGV[7] lease ttl (ms)
  ARGV[8] promote limit (due retries moved per call)
  ARGV[9] (optional) the run's output verdict for its refetch schedule: '' none, '=' unchanged,
    else its signature (_refetch.lua)
  Reply: {1} completed and the queue is empty (or the shard closed); {1, lease} completed, and `lease` (as claim's reply)
    is the next task's; or a refusal (nothing written, nothing claimed): R_UNKNOWN, R_WAITING,
    R_STALE_TOKEN, R_DELAYED, R_COMPLETED, R_DEAD
]]
--#include _common
-- The record geometry that the fencing check's load() reads first (_records.lua's rec_geometry), read
-- here with the shard's migration mark (as claim.lua reads it): no extra command.
local geometry = redis.call('HMGET', K_GEOM, 'l', 's', 'mv')
rec_level, rec_split = tonumber(geometry[1]) or 0, tonumber(geometry[2]) or 0
rec_mod = 2 ^ rec_level
local now = now_ms()
local done = complete_task(ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), now, nil, ARGV[9])
if done ~= true then return done end
if geometry[3] then return {1} end -- closed: the next task runs in the namespace the tasks moved to
local nxt = claim_best(ARGV[6], tonumber(ARGV[7]), ARGV[8], now)
if type(nxt) == 'table' then return {1, nxt} end
return {1}
