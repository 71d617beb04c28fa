--#include _common
-- Claim one named task (a Celery message carried its id). ARGV: prefix, id, worker, ttl_ms.
-- Reply: {id, token, expiry_ms, record, checkpoint|false}, or false when the task is not claimable
-- (unknown, already running, waiting for a retry, completed or dead): the message is then dropped.
local st, payload = load(ARGV[2])
if not st then return false end
local r = grant(ARGV[2], st, payload, ARGV[3], tonumber(ARGV[4]), now_ms(), false)
return r or false
