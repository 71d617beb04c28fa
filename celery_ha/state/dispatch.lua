--[[ The pump: keep at most `window` tasks dispatched (sent to the broker, not yet claimed).
  1. promote due retries; 2. re-stamp dispatched tasks never claimed within redispatch_after_ms
  (their message may be lost) and send them again; 3. move ready tasks to inflight up to the window.
  KEYS[1]  tasks
  KEYS[2]  readyp
  KEYS[3]  delayed
  KEYS[4]  inflight
  KEYS[10] stats
  Same slot: the ready lists r:<priority> it may touch are named from ARGV[1], the prefix every KEYS
    entry starts with (its {hash tag} included), so they share KEYS[1]'s slot (_common checks it).
  ARGV[1] namespace prefix
  ARGV[2] window (most tasks dispatched at once)
  ARGV[3] redispatch_after (ms a dispatched task may wait for its claim before it is sent again)
  ARGV[4] promote limit (due retries moved per call)
  Reply: flat list of {id, task name, priority, resent (1 = sent before, its message may be lost)},
    possibly empty; the caller sends one Celery message each
]]
--#include _common
local now = now_ms()
promote_due(now, ARGV[4])
local out = {}
local stale = redis.call('ZRANGEBYSCORE', K_INFLIGHT, '-inf', fmt(now - tonumber(ARGV[3])), 'LIMIT', 0, 1000)
for _, id in ipairs(stale) do
  local st = load(id)
  if st and st.s == 'd' then
    redis.call('ZADD', K_INFLIGHT, fmt(now), id)
    out[#out + 1] = id
    out[#out + 1] = st.n
    out[#out + 1] = st.p or '0'
    out[#out + 1] = 1
  else
    redis.call('ZREM', K_INFLIGHT, id)
  end
end
if #stale > 0 then incr('redispatched', #stale) end
local room = tonumber(ARGV[2]) - redis.call('ZCARD', K_INFLIGHT)
while room > 0 do
  local id = pop_ready()
  if not id then break end
  local st, payload = load(id)
  if st and st.s == 'q' then
    st.s = 'd'
    st.qt = st.qt or st.ut or st.ct -- its wait goes on in the broker: keep when it became ready
    st.ut = fmt(now)
    save(id, st, payload)
    redis.call('ZADD', K_INFLIGHT, fmt(now), id)
    out[#out + 1] = id
    out[#out + 1] = st.n
    out[#out + 1] = st.p or '0'
    out[#out + 1] = 0
    room = room - 1
  end
end
return out
