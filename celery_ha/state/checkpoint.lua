--#include _common
-- Save a checkpoint under the lease. ARGV: prefix, id, token, checkpoint JSON. Reply: 1 or false.
if not fenced(ARGV[2], ARGV[3]) then return false end
redis.call('HSET', K_CKPT, ARGV[2], ARGV[4])
return 1
