--#include _common
-- Move dead tasks back to ready with failures and stalls reset. ARGV: prefix, id or '', batch.
-- With an id: that task only (reply 1, or 0 if it is not dead). Without: up to `batch` of the
-- oldest dead tasks (reply: how many moved).
local function revive(id)
  local st, payload = load(id)
  redis.call('ZREM', K_DEAD, id)
  if not st or st.s ~= 'x' then return 0 end
  st.a = nil
  st.st = nil
  st.pe = st.e
  st.e = nil
  st.ut = fmt(now_ms())
  push_ready(id, st, false)
  save(id, st, payload)
  return 1
end
local moved = 0
if ARGV[2] ~= '' then
  if redis.call('ZSCORE', K_DEAD, ARGV[2]) then moved = revive(ARGV[2]) end
else
  for _, id in ipairs(redis.call('ZRANGE', K_DEAD, 0, tonumber(ARGV[3]) - 1)) do
    moved = moved + revive(id)
  end
end
incr('redriven', moved)
wake(moved)
return moved
