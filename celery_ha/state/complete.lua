--#include _common
-- Complete a task under its lease. ARGV: prefix, id, token, history_max, history_age_ms.
-- Reply: 1, or false when the lease is lost.
return complete_task(ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), now_ms()) and 1 or false
