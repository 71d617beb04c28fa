--#include _common
-- Standalone mode: claim the best queued task. ARGV: prefix, worker, ttl_ms, promote_limit.
-- Due retries are promoted first, so a lone worker needs no beat.
local now = now_ms()
promote_due(now, tonumber(ARGV[4]))
for _ = 1, 16 do
  local id = pop_ready()
  if not id then return false end
  local st, payload = load(id)
  if st and st.s == 'q' then
    st.s = 'd'  -- already popped from its band: let grant() treat it as dispatched
    return grant(id, st, payload, ARGV[2], tonumber(ARGV[3]), now)
  end
end
return false
