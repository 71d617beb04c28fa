--#include _common
-- Standalone mode: claim the best queued task. ARGV: prefix, worker, ttl_ms, promote_limit.
-- Due retries are promoted first, so a lone worker needs no beat. Reply: a lease or false.
return claim_best(ARGV[2], tonumber(ARGV[3]), ARGV[4], now_ms()) or false
