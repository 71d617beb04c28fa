--[[ Extend a short lock its holder still holds (compare-and-pexpire): a live holder keeps its lock for
  as long as its work takes, while a dead or frozen one's lapses after one short time to live.
  KEYS[1] lock key
  ARGV[1] the holder's token
  ARGV[2] the new time to live, ms
  Reply: 1 extended, 0 not held by this token (expired, or another holder's)
]]
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
