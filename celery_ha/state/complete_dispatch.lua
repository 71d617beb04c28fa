--[[ Finish a task under its lease in one step: store its last emitted items, complete it, refill the
  broker window (what dispatch.lua does) and, given a push section, push the refill's messages onto
  the broker's lists itself (_push.lua), so no commit, complete, dispatch or publish costs a round
  trip of its own. A stale lease writes nothing, moves nothing and pushes nothing.
  KEYS[1]  tasks
  KEYS[2]  readyp (the refill pops ready bands)
  KEYS[3]  delayed (due retries are promoted)
  KEYS[4]  inflight (the refill; the window counts it)
  KEYS[5]  running
  KEYS[7]  completed
  KEYS[9]  ckpt (dropped with the completion; a chained task's is read into its lease)
  KEYS[10] stats
  KEYS[12] hist (the runtime histogram counts the completion, the wait histogram a chained claim)
  KEYS[13] items (hash: item key -> item JSON)
  KEYS[14] itemlog (list: item keys in commit order)
  Same slot: the record buckets (_records.lua: t:<i>, tg), the ready lists r:<priority>, the host gate's keys (_hosts.lua: h, hb, hl, hq, hcfg,
    hosts, hready, hwait), the refetch schedule's (_refetch.lua: sched, rfb, refetch) and the bucket that
    remembers a dedup id with its completion hour (_remembered.lua: d:<3 chars> or d:~; its bit in
    the bitmap dk) it may touch are
    named from ARGV[1], the prefix every KEYS entry starts with (its {hash tag} included), so they
    share KEYS[1]'s slot (_common checks it). tg's field mv (state/migrate_marks.py) closes the shard:
    a migration moved (or is moving) its tasks to another namespace; the completion stands, nothing
    is refilled (no task of it goes out again here).
  ARGV[1] namespace prefix
  ARGV[2] task id
  ARGV[3] fencing token
  ARGV[4] history_max (completed records kept)
  ARGV[5] history_age (ms a completed record is kept)
  ARGV[6] window (most tasks dispatched at once), or '' for no refill (the caller pumps later)
  ARGV[7] redispatch_after (ms a dispatched task may wait for its claim before it is sent again)
  ARGV[8] promote limit (due retries moved per call)
  ARGV[9] the run's output verdict for its refetch schedule: '' none, '=' unchanged, else its
    signature (_refetch.lua)
  ARGV[10] '1': with a refill, the reply also tells when the host gate's first waiting host may
    hand out a task (a gated worker arms its pump timer with it: no round trip of its own); '' not
  ARGV[11] the chain (CELERY_HA_CHAIN): '' none; else the lease ttl (ms) of the next task this
    caller takes itself: after the refill, the best queued task (pop_best, as a claim takes it) is
    leased to ARGV[12] when its task name is ARGV[13] (claim.lua's grant: one script for a
    completion and the next claim); the best one of another task name stays queued (a gated one,
    whose host's pacing counted the pop, is dispatched, its message sent as the refill's are);
    nothing is taken with a window of 0 (a paused namespace's), when the refill left nothing queued,
    or when the shard is closed; without a refill (ARGV[6] '': a sharded namespace, whose caller
    pumps afterwards, and asks only while its window is open) the best task of this shard is taken
  ARGV[12] the chain's worker (the next lease's holder), '' without a chain
  ARGV[13] the chain's task name, '' without a chain
  ARGV[14] P, the length of the push section (0: the caller sends every message)
  ARGV[15..14+P] the push section (_push.lua), used only with a refill
  ARGV[15+P..] item key, item JSON, item key, item JSON, ... (a key the sink holds is ignored)
  Reply: {new items (0 or more), flat list of {id, task name, priority, resent} as dispatch.lua's
    for the caller to send (those not pushed), messages pushed, the push's refusal text or false,
    the gate's wait: {now (ms, Redis clock), hwait's first score or false when no host waits} when
    asked for and refilled, else false, the chained task's lease (as claim.lua's reply) or false},
    the list empty without a refill (but for a chain's dispatched gated task); or a refusal (nothing
    written, nothing dispatched): R_UNKNOWN, R_WAITING, R_STALE_TOKEN, R_DELAYED, R_COMPLETED, R_DEAD
]]
--#include _common
--#include _dispatch
--#include _push
-- The record geometry that the fencing check's load() reads first (_records.lua's rec_geometry), read
-- here with the shard's migration mark (as claim.lua reads it): no extra command.
local geometry = redis.call('HMGET', K_GEOM, 'l', 's', 'mv')
rec_level, rec_split = tonumber(geometry[1]) or 0, tonumber(geometry[2]) or 0
rec_mod = 2 ^ rec_level
local now = now_ms()
local push_to = 14 + tonumber(ARGV[14])
local items_from = push_to + 1
local added, refusal = complete_with_items(ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), now,
  ARGV[9], items_from)
if not added then return refusal end
if geometry[3] then return {added, {}, 0, false, false, false} end
local out, wait = {}, false
if ARGV[6] ~= '' then
  out = fill_window(now, tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8])
  if ARGV[10] == '1' then
    local head = gate_busy() and redis.call('ZRANGE', K_HWAIT, 0, 0, 'WITHSCORES') or {}
    wait = {now, head[2] or false}
  end
end
local chained = false
-- After the refill (it gives the others' messages their room first; a sharded namespace's caller
-- pumps after this script), never with a window of 0: a paused namespace's, or one a migration moved
-- away, where nothing may start.
if ARGV[11] ~= '' and (ARGV[6] == '' or tonumber(ARGV[6]) > 0) then
  if ARGV[6] == '' then hosts_due(now) end -- fill_window's, without a refill
  -- The best queued task (a few stale entries skipped): this caller's own when it has the chain's
  -- task name. Another task name's goes back to the front of its band, where the pop took it from
  -- (the chain ends: the caller's next task comes from the broker, and a refill sends this one);
  -- a gated one, which its host's pacing already counted, is dispatched as fill_window does.
  for _ = 1, 4 do
    local id, st, payload = pop_best(now, 'c')
    if not id then break end
    if st and st.s == 'q' then
      if st.n == ARGV[13] then
        chained = grant(id, st, payload, ARGV[12], tonumber(ARGV[11]), now, true)
      elseif not st.h then
        redis.call('LPUSH', ready_key(st.p or '0'), id)
      else
        host_out(st.h, now, 'd', host_popped(st.h))
        to_inflight(id, st, payload, now, out)
      end
      break
    end
  end
end
if push_to == 14 or #out == 0 then return {added, out, 0, false, wait, chained} end
local left, pushed, err = push_messages(out, 15, push_to)
return {added, left, pushed, err, wait, chained}
