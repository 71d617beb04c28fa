--#include _common
-- Enqueue a batch in one round trip. ARGV: prefix, then 7 values per task:
--   id, priority, dedup (1/0), task name, max_attempts, max_stalls, payload JSON.
-- Per task the reply holds 1 (new), 0 (duplicate of a live or finished task), -1 (id collision).
local now = now_ms()
local reply = {}
local created = 0
local i = 2
while i <= #ARGV do
  local id, p, dd, name, payload = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], ARGV[i + 3], ARGV[i + 6]
  local ma, ms = tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5])
  i = i + 7
  if redis.call('HEXISTS', K_TASKS, id) == 1 or redis.call('SISMEMBER', K_SEEN, id) == 1 then
    if dd == '1' then
      reply[#reply + 1] = 0
      incr('duplicates', 1)
    else
      reply[#reply + 1] = -1
    end
  else
    local st = {n = name, ct = now, ma = ma, ms = ms}
    if p ~= 0 then st.p = p end
    if dd == '1' then st.dd = 1 end
    push_ready(id, st, false)
    save(id, st, payload)
    created = created + 1
    reply[#reply + 1] = 1
  end
end
incr('enqueued', created)
wake(created)
return reply
