--[[ Compare-and-delete a short lock: only the holder of the token frees it, so a lock that expired and
  was taken by someone else is never deleted by the previous holder.
  KEYS[1] lock key
  ARGV[1] the holder's token
  Reply: 1 freed, 0 not held by this token (expired, or another holder's)
]]
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
