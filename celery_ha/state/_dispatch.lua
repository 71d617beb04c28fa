--[[ Shared include: the pump's window fill, used by dispatch.lua and complete_dispatch.lua (after
  --#include _common, whose K_* keys, load/save, pop_ready and promote_due it uses).
  Touches KEYS[1] tasks, KEYS[2] readyp, KEYS[3] delayed, KEYS[4] inflight, KEYS[10] stats, and the
  ready lists r:<priority> and the host gate's keys (_hosts.lua: h, hb, hl, hq, hcfg,
    hosts, hready, hwait) named from ARGV[1] (same hash tag as
  KEYS[1]).
  Defines: to_send(out, id, st, resent) (a quadruple below), to_inflight(id, st, payload, now, out)
  (one popped task dispatched, added to `out`);
  fill_window(now, window, redispatch_after_ms, promote_limit) -> flat list of {id, task
  name, priority, resent} quadruples: 1. promote due retries; 2. re-stamp dispatched tasks never
  claimed within redispatch_after_ms (their message may be lost), resent = 1; 3. move ready tasks to
  inflight until `window` are dispatched, resent = 0: the best of the ready bands and of the hosts
  eligible now (pop_best), so a gated host that may not hand out a task keeps its tasks queued. The caller sends one Celery message per id.
]]

-- A message to send: its {id, task name, priority, resent} quadruple added to `out`.
local function to_send(out, id, st, resent)
  out[#out + 1] = id
  out[#out + 1] = st.n
  out[#out + 1] = st.p or '0'
  out[#out + 1] = resent
end

-- A queued task popped for a message: dispatched (in `inflight`), its quadruple added to `out`.
local function to_inflight(id, st, payload, now, out)
  st.s = 'd'
  st.qt = st.qt or st.ut or st.ct -- its wait goes on in the broker: keep when it became ready
  st.ut = fmt(now)
  save(id, st, payload)
  redis.call('ZADD', K_INFLIGHT, fmt(now), id)
  to_send(out, id, st, 0)
end

local function fill_window(now, window, redispatch_after_ms, promote_limit)
  promote_due(now, promote_limit)
  local out = {}
  local stale = redis.call('ZRANGEBYSCORE', K_INFLIGHT, '-inf', fmt(now - redispatch_after_ms), 'LIMIT', '0', '1000')
  for _, id in ipairs(stale) do
    local st = load(id)
    if st and st.s == 'd' then
      redis.call('ZADD', K_INFLIGHT, fmt(now), id)
      to_send(out, id, st, 1)
    else
      redis.call('ZREM', K_INFLIGHT, id)
    end
  end
  if #stale > 0 then incr('redispatched', #stale) end
  local room = window - redis.call('ZCARD', K_INFLIGHT)
  -- Hosts whose wait is over go to hready even when there is no room (a full window, a pause): hwait's
  -- head is then a time to come, which a worker's pump timer waits for, not one gone by (a timer armed
  -- for it would fire at once, again and again, until a slot freed).
  hosts_due(now)
  while room > 0 do
    local id, st, payload = pop_best(now, 'd')
    if not id then break end
    if st and st.s == 'q' then
      to_inflight(id, st, payload, now, out)
      room = room - 1
    end
  end
  return out
end
