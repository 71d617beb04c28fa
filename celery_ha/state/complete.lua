--[[ Complete a task under its lease (its checkpoint is dropped, its record joins the history).
  KEYS[1]  tasks
  KEYS[5]  running
  KEYS[7]  completed
  KEYS[9]  ckpt
  KEYS[10] stats
  KEYS[12] hist (the runtime histogram counts the completion)
  Same slot: the record buckets (_records.lua: t:<i>, tg), a gated task's host keys (_hosts.lua: h,
    hb, hl, hq, hcfg, hosts, hready, hwait), the refetch schedule's (_refetch.lua: sched, rfb, refetch)
    and the bucket that remembers a dedup id with its completion hour (_remembered.lua: d:<3 chars>
    or d:~; its bit in the bitmap dk) are named from ARGV[1], the prefix every KEYS entry starts with
    (its {hash tag} included), so they share KEYS[1]'s slot (_common checks it).
  ARGV[1] namespace prefix
  ARGV[2] task id
  ARGV[3] fencing token
  ARGV[4] history_max (completed records kept)
  ARGV[5] history_age (ms a completed record is kept)
  ARGV[6] (optional) the run's output verdict for its refetch schedule: '' none, '=' unchanged,
    else its signature (_refetch.lua)
  Reply: 1 completed, or a refusal (nothing written): R_UNKNOWN, R_WAITING, R_STALE_TOKEN, R_DELAYED,
    R_COMPLETED, R_DEAD
]]
--#include _common
local done = complete_task(ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), now_ms(), nil, ARGV[6])
if done == true then return 1 end
return done
