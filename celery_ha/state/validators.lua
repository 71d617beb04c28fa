--[[ Remember the HTTP validators of a task's page (ETag or Last-Modified of its last fetch), bounded,
  and count a completion that found its page unchanged (a 304). Called after the task completed, so
  a validator never stands for a page whose items were not committed (state/validators.py).
  KEYS[1] the shard's validators hash (id -> validator text, at most ARGV[4] fields)
  KEYS[2] the shard's stats hash (counter 'unchanged')
  ARGV[1] the shard's key prefix (unused: every key is declared above)
  ARGV[2] task id
  ARGV[3] the validator text to keep ('' = leave the stored one as it is)
  ARGV[4] most fields the hash may hold: a new id in a full hash first drops random fields (a lost
          validator costs one unconditional fetch, nothing more)
  ARGV[5] '1' = count one 'unchanged' completion
  Reply: the number of fields dropped to make room
]]
local key, id, value = KEYS[1], ARGV[2], ARGV[3]
local cap = tonumber(ARGV[4])
local dropped = 0
if value ~= '' and cap and cap > 0 then
  if redis.call('HEXISTS', key, id) == 0 then
    local over = redis.call('HLEN', key) - cap + 1
    while over > 0 do  -- 1 in steady state; more only after the cap was lowered (100 per step)
      local victims = redis.call('HRANDFIELD', key, math.min(over, 100))
      redis.call('HDEL', key, unpack(victims))
      dropped = dropped + #victims
      over = over - #victims
    end
  end
  redis.call('HSET', key, id, value)
end
if ARGV[5] == '1' then
  redis.call('HINCRBY', KEYS[2], 'unchanged', 1)
end
return dropped
