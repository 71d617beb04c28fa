--#include _common
-- Complete a task and claim the next one in the same step: one round trip per task for a busy
-- standalone worker. ARGV: prefix, id, token, history_max, history_age_ms, worker, ttl_ms,
-- promote_limit. Reply: {0} (lease lost: nothing written), {1} (completed, queue empty) or
-- {1, lease} (completed, and `lease` is the next task's).
local now = now_ms()
if not complete_task(ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), now) then return {0} end
local nxt = claim_best(ARGV[6], tonumber(ARGV[7]), ARGV[8], now)
if nxt then return {1, nxt} end
return {1}
