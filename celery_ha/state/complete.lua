--[[ Complete a task under its lease (its checkpoint is dropped, its record joins the history).
  KEYS[1]  tasks
  KEYS[5]  running
  KEYS[7]  completed
  KEYS[8]  done (a dedup id is remembered, with its completion time)
  KEYS[9]  ckpt
  KEYS[10] stats
  KEYS[12] hist (the runtime histogram counts the completion)
  ARGV[1] namespace prefix
  ARGV[2] task id
  ARGV[3] fencing token
  ARGV[4] history_max (completed records kept)
  ARGV[5] history_age (ms a completed record is kept)
  Reply: 1 completed, or a refusal (nothing written): R_UNKNOWN, R_WAITING, R_STALE_TOKEN, R_DELAYED,
    R_COMPLETED, R_DEAD
]]
--#include _common
local done = complete_task(ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), now_ms())
if done == true then return 1 end
return done
