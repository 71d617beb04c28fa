-- Compare-and-delete a short coordination lock (the API provider's fetch lock): only its holder frees it.
-- KEYS[1] = lock key; ARGV[1] = the holder's token. Returns 1 if freed.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
