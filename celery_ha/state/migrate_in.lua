--[[ Take in what `celery-ha migrate` (state/migrate.py) moves from another namespace into this shard:
  task records as the source stored them (only their ids may be new), remembered finished ids, and
  sink items. Idempotent: an id this shard holds a record of, a remembered id and an item key it
  holds are left alone, so a migration that stopped half-way is finished by running it again.
  A record keeps its attempts, stalls, errors, fencing token, dedup flag, meta, trace and refetch
  state; it is filed by its state:
    q queued, d dispatched (its message belongs to the source): queued, at the back of its band or
      of its host's queue (st.h, _hosts.lua), in the order of the rows
    r running: no holder can be left (migrate.py refuses while the source's workers live): a stall,
      as a reclaim counts it (dead past max_stalls, else queued with the rows' queued tasks)
    w delayed: the delayed index at its due time
    x dead: the dead letters at its time of death (ut)
    c completed: in the completed history when the row gives a time for it (a record the source kept
      only for its refetch schedule is in no history); remembered when it is a dedup task (its
      completion hour), unless it waits for a scheduled run
    a completed or dead record that waits for a scheduled run (_refetch.lua: with iv; a retryable
      death keeps its schedule) is indexed in rfb at its due time (ut + iv) and counted in stats
      refetch_waiting: its record is its dedup memory
  KEYS[1]  tasks
  KEYS[2]  readyp
  KEYS[3]  delayed
  KEYS[6]  dead
  KEYS[7]  completed (the bounded history)
  KEYS[9]  checkpoints
  KEYS[10] stats (refetch_waiting)
  KEYS[11] wake (one token per task queued, for blocked claim_next callers)
  Same slot: the record buckets (_records.lua: t:<i>, tg), the ready lists r:<priority>, the host
    gate's keys (_hosts.lua: h, hb, hl, hq, hcfg, hosts, hready, hwait), the buckets of remembered
    ids (_remembered.lua: d:<3 chars>, d:~, dk), the carried ids (cd:<3 chars>, cd:~, their bitmap
    cdk), migmap, the
    refetch index (_refetch.lua: rfb) and the sink (items, itemlog) are named from ARGV[1], the
    prefix every KEYS entry starts with (its {hash tag} included), so they share KEYS[1]'s slot
    (_common checks it).
  ARGV[1] namespace prefix
  ARGV[2] what the rows are: 'r' records, 'm' remembered ids, 'c' carried ids, 'i' items
  ARGV[3..] 'r': 6 per task: id, record (_record_codec.lua), checkpoint JSON or '', refetch due (ms) or ''
              (not read: the record's ut + iv says it),
              its time in the source's completed history (ms) or '', and its id in the source when
              the task was renamed ('' when it keeps it): kept in migmap (id -> source id) while the
              migration runs, so a renamed id another task holds is told from a re-run's
            'm': 2 per id: id, completion hour (_remembered.lua)
            'c': 2 per id: id, completion hour, kept as a carried id: a remembered id of an ancestor
                 namespace whose ids depended on its shard count (state/carried.py), in buckets
                 laid out as the remembered ones, named cd:<3 chars> / cd:~ instead of d:..., with
                 the bitmap cdk of the buckets holding ids (as dk), read by the enqueue of the
                 namespace from Python
            'i': 2 per item: item key, item JSON (appended to the commit log when new)
  Reply: one character per row, in order: '1' taken in, '0' present already (nothing written); for
    'r', 'R' taken in and remembered now (a finished dedup task), 'C' not taken: its new id is held by
    another task (the caller gives it its next one)
]]
--#include _common
local now = now_ms()
local mode = ARGV[2]
local reply = {}

if mode == 'm' then
  for i = 3, #ARGV, 2 do
    reply[#reply + 1] = tostring(remember(ARGV[i], now, ARGV[i + 1], true))
  end
  return table.concat(reply)
end

if mode == 'c' then
  local marks = PREFIX .. 'cdk'
  for i = 3, #ARGV, 2 do
    local key, field, bucket = done_slot(ARGV[i])
    key = PREFIX .. 'c' .. string.sub(key, #PREFIX + 1)
    local added = redis.call('HSETNX', key, field, ARGV[i + 1])
    -- marked whether new or not: a re-run marks what a run before the bitmap was kept wrote
    if bucket < DONE_BUCKETS then redis.call('SETBIT', marks, tostring(bucket), '1') end
    reply[#reply + 1] = tostring(added)
  end
  return table.concat(reply)
end

if mode == 'i' then
  local items, log = PREFIX .. 'items', PREFIX .. 'itemlog'
  for i = 3, #ARGV, 2 do
    local added = redis.call('HSETNX', items, ARGV[i], ARGV[i + 1])
    if added == 1 then redis.call('RPUSH', log, ARGV[i]) end
    reply[#reply + 1] = tostring(added)
  end
  return table.concat(reply)
end

local queued, woken = band_batch(), 0
rec_batch()
local K_MIGMAP = PREFIX .. 'migmap'
for i = 3, #ARGV, 6 do
  local id, raw, ckpt, history = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 4]
  local from = ARGV[i + 5]
  local remembered = false
  if rec_get(id) then
    -- a re-run's own task, or (renamed) another task's id: only migmap tells them apart
    if from ~= '' and redis.call('HGET', K_MIGMAP, id) ~= from then
      reply[#reply + 1] = 'C'
    else
      reply[#reply + 1] = '0'
    end
  else
    if from ~= '' then redis.call('HSET', K_MIGMAP, id, from) end
    local st, payload = decode(raw)
    local s = st.s
    if s == 'q' or s == 'd' then
      st.s = 'q'
      band_add(queued, st.p or '0', id, st.h)
      woken = woken + 1
    elseif s == 'r' then
      if stall(id, st, now, 'moved by celery-ha migrate while running', queued) == 'q' then
        woken = woken + 1
      end
    elseif s == 'w' then
      redis.call('ZADD', K_DELAYED, st.due or fmt(now), id)
    elseif s == 'x' then
      redis.call('ZADD', K_DEAD, fmt((tonumber(st.ut) or now) * 1000), id)
    elseif s == 'c' then
      if st.dd == '1' and not waiting_due(st)
          and remember(id, now, done_hour(tonumber(st.ut) or now), true) == 1 then
        remembered = true
      end
      if history ~= '' then redis.call('ZADD', K_COMPLETED, history, id) end
    end
    -- A waiting one keeps its schedule (_refetch.lua), indexed before its record is written (a split
    -- copies the index entry); a running one that died here was indexed by its death (to_dead).
    local due = (s == 'x' or s == 'c') and waiting_due(st)
    if due then
      local bucket = string.format('%d', rec_index(rec_hash(id))) -- its record's (_records.lua)
      redis.call('ZADD', PREFIX .. 'rfb', 'LT', fmt(due), bucket)
      incr('refetch_waiting', 1)
    end
    if s == 'w' or s == 'x' or s == 'c' then
      rec_set(id, raw)
    else
      save(id, st, payload)
    end
    if ckpt ~= '' then redis.call('HSET', K_CKPT, id, ckpt) end
    reply[#reply + 1] = remembered and 'R' or '1'
  end
end
rec_settle()
band_flush(queued, 'RPUSH', now)
wake(woken)
return table.concat(reply)
