--[[ Shared include: the proof that a script's computed keys share the slot of its declared ones
  (pulled in with --#include same_slot, by the preludes whose scripts name keys from a prefix).
  A script that builds a key as ARGV[1] .. name stays in one Redis Cluster slot when KEYS[1] starts
  with ARGV[1] and ARGV[1] holds a whole {hash tag}: every such key then hashes on that tag. A call that
  breaks the rule is refused before anything is read or written.
  Defines: nothing; it stops the script with an error reply when the rule does not hold.
]]
--#per-call
if not KEYS[1] or string.sub(KEYS[1], 1, #ARGV[1]) ~= ARGV[1] or not string.find(ARGV[1], '{[^}]+}') then
  return redis.error_reply('ERR celery-ha: the key prefix ' .. tostring(ARGV[1]) ..
    ' does not carry the hash tag of KEYS[1] (computed keys would leave its Redis Cluster slot)')
end
--#end-per-call
