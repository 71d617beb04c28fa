--[[ Shared include of _common: the host gate (the design is in celery_ha/state/hosts.py).
  A task whose record carries a host key (st.h) is "gated": while queued it waits in its host's queue
  instead of a priority band, and only a host that is eligible now hands a task out. A task without
  st.h never touches anything here (one nil check per transition).
  Keys, all named from PREFIX (ARGV[1], which carries KEYS[1]'s hash tag: same slot, see same_slot):
    hcfg       hash: the namespace's defaults iv (rate spacing, ms), dl (delay, ms), cc (concurrency,
               0 = none), bg (budget, -1 = none); on ('1': enqueue gates tasks that have a host);
               counters lrs (serve order), nq (tasks queued in host queues); hl ('1': host queues
               are lists, set by the first script of this layout) and lq (tasks left in the zsets
               of an earlier release, counted down as they leave; seq was their queue order); rf
               (hosts' SSCAN cursor while new defaults file every host again: hosts_refile)
    hready     zset: hosts with queued tasks that may hand one out now,
               score = band * 1e12 + lr (band = 1000 - priority of the host's best task; lr = when
               the host was last served): the best band first, then the least recently served host
    hwait      zset: hosts with queued tasks that may not, score = the ms (Redis clock) they may, or
               SLOT (9e15) when an event must come first (a freed concurrency slot, the claim of the
               host's dispatched task, more budget): every such event places the host again
    h:<host>   hash: overrides iv dl cc bg, cd (robots Crawl-delay, ms); state a (active: dispatched
               + running), d (dispatched, unclaimed), u (handed out, counted against the budget),
               ne (next eligible, ms), bu (blocked until, ms), bl (backoff level), br (block
               reason), lb (last block, ms), ls (last start, ms: a claim or a request), rs (the last
               request's start or answer, ms: host_block.lua's 'request' spaces requests from it),
               lr (serve order); counters done, dead; requests in flight and held slots (only under a
               concurrency limit): f:<id> ('<token>:<until ms>': task <id>'s request, let go under
               that lease by host_block.lua's 'request', may be in flight until then; its answer or
               'unsent' drops it), x:<id>:<token> ('<until ms>': the task ended, released or
               reclaimed, with such a request unreported, so the site may still be answering it: the
               slot stays taken until then), xu (the latest x: until: none is live after it)
    hosts      set: every host that ever queued a task or got a setting (the listing reads it)
    hl:<band>:<host>  list: the host's queued ids of one band (band = 1000 - priority), oldest
               first; new work goes to the back, reclaimed work to the front. A list entry costs ~14 B
               where a sorted-set entry past 128 per host cost ~95 B. An id taken out of its queue
               directly (unready: a direct claim, cancel) stays as a stale entry that the pop skips
               (it was uncounted from nq then), as the priority bands do.
    hb:<host>  zset: the host's bands that have a list, member and score the band: the best is the
               first; a band leaves it when a pop empties its list
    hq:<host>  zset of an earlier release (score = band * 1e12 + 5e11 ± seq): still read, and popped
               first within a band, while hcfg's lq says some are left; nothing writes it any more
  Defines: host_load, host_interval, host_due, host_place, host_refile, host_batch, host_add,
    host_flush, host_push, host_out, host_claimed, host_end, host_dead, hosts_refile, hosts_due,
    host_pop, host_sweep, host_over.
]]

local K_HCFG, K_HREADY, K_HWAIT, K_HOSTS
--#per-call
K_HCFG, K_HREADY, K_HWAIT = PREFIX .. 'hcfg', PREFIX .. 'hready', PREFIX .. 'hwait'
K_HOSTS = PREFIX .. 'hosts'
--#end-per-call
local BAND, SLOT = 1e12, 9e15
-- Whether hready may hold a host (nil = not known yet), and whether hready or hwait may (nil = not
-- known yet: one EXISTS of both tells, once per script), so a namespace whose gate holds no host
-- pays one command per script on the pop path, for hosts_due and the pop together. host_place sets
-- both when it files a host.
local hready_maybe, gate_maybe
--#per-call
hready_maybe, gate_maybe = nil, nil
--#end-per-call

local function gate_busy()
  if gate_maybe == nil then gate_maybe = redis.call('EXISTS', K_HREADY, K_HWAIT) > 0 end
  return gate_maybe
end

local function hkey(h) return PREFIX .. 'h:' .. h end
local function hqkey(h) return PREFIX .. 'hq:' .. h end
local function hbkey(h) return PREFIX .. 'hb:' .. h end
local function hlkey(band, h) return PREFIX .. 'hl:' .. band .. ':' .. h end

local function hash_table(raw)
  local t = {}
  for i = 1, #raw, 2 do t[raw[i]] = raw[i + 1] end
  return t
end

local host_defaults
--#per-call
host_defaults = nil
--#end-per-call
local function hcfg()
  if not host_defaults then host_defaults = hash_table(redis.call('HGETALL', K_HCFG)) end
  return host_defaults
end

local function host_load(h)
  return hash_table(redis.call('HGETALL', hkey(h)))
end

-- A limit of the host: its override, else the namespace default, else `dflt`.
local function hnum(hs, field, dflt)
  local v = hs[field]
  if v == nil or v == '' then v = hcfg()[field] end
  return tonumber(v) or dflt
end

local function n0(v) return tonumber(v) or 0 end

-- Whether zsets of an earlier release may still hold queued ids (hcfg lq > 0). The first script of
-- this layout to look (hcfg without hl) takes nq, what those zsets held, as lq: every later hand-out
-- or removal from them counts it down, and at 0 no script looks at them again. nq never counts an
-- entry too few (it counted every id the zsets took), so no zset is left behind unread.
local function legacy_queues()
  local cfg = hcfg()
  if not cfg.hl then
    cfg.hl, cfg.lq = '1', cfg.nq or '0'
    redis.call('HSET', K_HCFG, 'hl', '1', 'lq', cfg.lq)
  end
  return n0(cfg.lq) > 0
end

-- Count `by` in hcfg's counter `field`, in Redis and in the cached copy hcfg() returns.
local function hcfg_add(field, by)
  hcfg()[field] = tostring(redis.call('HINCRBY', K_HCFG, field, by))
end

-- The band of the head of host h's earlier-release zset, or nil (none left, or it has none).
local function legacy_band(h)
  if not legacy_queues() then return nil end
  local head = redis.call('ZRANGE', hqkey(h), 0, 0, 'WITHSCORES')
  if #head > 0 then return math.floor(tonumber(head[2]) / BAND) end
  return nil
end

-- The best band (1000 - priority) among host h's queued ids, or nil when it has none.
local function host_head_band(h)
  local band = tonumber(redis.call('ZRANGE', hbkey(h), 0, 0)[1])
  local old = legacy_band(h)
  if old and (not band or old < band) then band = old end
  return band
end

-- Take host h's best queued id out of its queue: its id and whether it came from an earlier
-- release's zset (counted out of nq and lq here: the zsets counted every entry), or nil. Within a
-- band the zset's ids go first (they are older). A list id is uncounted by the caller once it is
-- known to be live (a stale one was uncounted when it became stale). `hint`: the host's best band as
-- hready's score says (every event that changes it files the host again), tried first, which saves
-- the ZRANGE of hb; a hint that finds no list falls back to hb.
local function host_take(h, hint)
  local old = legacy_band(h)
  if hint and not old then
    local key = hlkey(hint, h)
    local id = redis.call('LPOP', key)
    if id then
      if redis.call('LLEN', key) == 0 then redis.call('ZREM', hbkey(h), hint) end
      return id, false
    end
  end
  for _ = 1, 2002 do -- every band at most once
    local top = redis.call('ZRANGE', hbkey(h), 0, 0)
    local band = tonumber(top[1])
    if old and (not band or old <= band) then
      local popped = redis.call('ZPOPMIN', hqkey(h))
      hcfg_add('nq', -1)
      hcfg_add('lq', -1)
      return popped[1], true
    end
    if not band then return nil end
    local key = hlkey(top[1], h)
    local id = redis.call('LPOP', key)
    if id and redis.call('LLEN', key) > 0 then return id, false end
    redis.call('ZREM', hbkey(h), top[1])
    if id then return id, false end
  end
  return nil
end

-- The spacing between two hand-outs of the host (ms): the largest of its rate's spacing, its delay
-- and its robots.txt Crawl-delay.
local function host_interval(hs)
  return math.max(hnum(hs, 'iv', 0), hnum(hs, 'dl', 0), n0(hs.cd))
end

-- The host's held slots live now (x: fields, see the header): how many, and the earliest end.
local function held_slots(hs, now)
  local n, first = 0, nil
  if n0(hs.xu) <= now then return 0, nil end -- none live: no field to look at
  for f, v in pairs(hs) do
    if string.sub(f, 1, 2) == 'x:' then
      local t = n0(v)
      if t > now then
        n = n + 1
        if not first or t < first then first = t end
      end
    end
  end
  return n, first
end

-- When the host may hand out its next task: 0 now, a time (ms), or SLOT (after an event).
local function host_due(hs, now)
  local bg = hnum(hs, 'bg', -1)
  if bg >= 0 and n0(hs.u) >= bg then return SLOT end
  local cc = hnum(hs, 'cc', 0)
  local held = 0
  if cc > 0 then
    if n0(hs.a) >= cc then return SLOT end
    -- A slot held for a request an ended task may still have in flight counts until its end: the
    -- host is due again when the first ends (then looked at again).
    local n, first = held_slots(hs, now)
    if n > 0 and n0(hs.a) + n >= cc then held = first end
  end
  -- A paced host has at most one unclaimed message: its next hand-out is timed from that claim, so
  -- the starts a site sees are spaced however long a message waits in the broker.
  local iv = host_interval(hs)
  if n0(hs.d) > 0 and iv > 0 then return SLOT end
  -- Timed from the last start too, so a spacing learnt after it (a Crawl-delay read by that very
  -- task, a new rate) already counts for the next one.
  local t = math.max(n0(hs.ne), n0(hs.bu), iv > 0 and n0(hs.ls) + iv or 0, held)
  if t > now then return t end
  return 0
end

-- File the host where its state says: in no index (no queued task), hready or hwait. `known`: the
-- index the caller knows it is in ('ready' or 'wait'; nil = unknown), so a host staying put costs
-- one command instead of two.
local function host_place(h, hs, now, known)
  local band = host_head_band(h)
  if not band then
    redis.call('ZREM', K_HREADY, h)
    redis.call('ZREM', K_HWAIT, h)
    return
  end
  local due = host_due(hs, now)
  if due == 0 then
    redis.call('ZADD', K_HREADY, string.format('%.0f', band * BAND + n0(hs.lr)), h)
    if known ~= 'ready' then redis.call('ZREM', K_HWAIT, h) end
    hready_maybe, gate_maybe = true, true
  else
    redis.call('ZADD', K_HWAIT, string.format('%.0f', due), h)
    if known ~= 'wait' then redis.call('ZREM', K_HREADY, h) end
    gate_maybe = true
  end
end

-- host_place after a change that left every input of host_due but the clock as it was (a slot freed
-- without a concurrency limit, a claim without a spacing): the host is filed where its last
-- placement put it, in hready (or in no index: no queued task) or in hwait with the same due time, so
-- only a wait that has ended since moves it. One ZSCORE instead of host_place's three commands. The
-- host is likely filed, so the pop path may look at the gate without its EXISTS (a hint: harmless
-- when wrong, the pop's own read tells).
local function host_refile(h, hs, now)
  if gate_maybe == nil then gate_maybe = true end
  if host_due(hs, now) ~= 0 then return end
  if hready_maybe == nil then hready_maybe = true end
  if redis.call('ZSCORE', K_HWAIT, h) then host_place(h, hs, now, 'wait') end
end

-- Ids headed for their hosts' queues, grouped by host, so a batch costs one ZADD per host.
local function host_batch()
  return {order = {}, items = {}, n = 0}
end

local function host_add(batch, h, p, id)
  local items = batch.items[h]
  if not items then
    items = {}
    batch.items[h] = items
    batch.order[#batch.order + 1] = h
  end
  items[#items + 1] = p
  items[#items + 1] = id
  batch.n = batch.n + 1
end

-- Queue every collected id in its host's queue, at the back of its band (or the front), in the
-- order collected (at the front: as if pushed one by one, the last one first), then place each host.
-- A host that already had queued ids in a band at least as good as the best new one is filed where
-- it stays (new ids change neither its head band nor its due time), so it costs a ZRANGE and a push
-- per band instead of a placement (HGETALL, ZRANGE, ZADD, ZREM): the enqueue into a deep backlog.
local function host_flush(batch, front, now)
  if batch.n == 0 then return end
  local legacy = legacy_queues() -- also marks the layout before its first list is written
  redis.call('HINCRBY', K_HCFG, 'nq', batch.n)
  local push = front and 'LPUSH' or 'RPUSH'
  for _, h in ipairs(batch.order) do
    local items, by_band, bands = batch.items[h], {}, {}
    local best
    for j = 1, #items, 2 do
      local band = string.format('%d', 1000 - tonumber(items[j]))
      local ids = by_band[band]
      if not ids then
        ids = {}
        by_band[band] = ids
        bands[#bands + 1] = band
        if not best or tonumber(band) < best then best = tonumber(band) end
      end
      ids[#ids + 1] = items[j + 1]
    end
    local head = not legacy and redis.call('ZRANGE', hbkey(h), 0, 0)[1]
    for _, band in ipairs(bands) do
      local ids = by_band[band]
      for j = 1, #ids, 2000 do
        redis.call(push, hlkey(band, h), unpack(ids, j, math.min(j + 1999, #ids)))
      end
      if band ~= head then redis.call('ZADD', hbkey(h), band, band) end
    end
    if not head or best < tonumber(head) then
      redis.call('SADD', K_HOSTS, h)
      host_place(h, host_load(h), now)
    end
  end
end

local function host_push(id, st, front, now)
  local batch = host_batch()
  host_add(batch, st.h, st.p or '0', id)
  host_flush(batch, front, now)
end

-- A task of host h leaves its queue for a worker: `mode` 'd' dispatched (one more unclaimed
-- message) or 'c' claimed at once. Counts it against the concurrency and the budget, marks the host
-- served, and moves its next eligible time one interval on.
local function host_out(h, now, mode, hs, known)
  hs = hs or host_load(h)
  local iv = host_interval(hs)
  hs.a = tostring(n0(hs.a) + 1)
  hs.u = tostring(n0(hs.u) + 1)
  hs.lr = tostring(redis.call('HINCRBY', K_HCFG, 'lrs', 1))
  if mode == 'd' then hs.d = tostring(n0(hs.d) + 1) else hs.ls = string.format('%.0f', now) end
  if iv > 0 then hs.ne = string.format('%.0f', math.max(n0(hs.ne), now + iv)) end
  redis.call('HSET', hkey(h), 'a', hs.a, 'u', hs.u, 'lr', hs.lr, 'd', hs.d or '0', 'ls', hs.ls or '0',
             'ne', hs.ne or '0')
  host_place(h, hs, now, known)
end

-- A dispatched task of host h was claimed: its message is no longer waiting, and the next hand-out
-- is timed from this start.
local function host_claimed(h, now, hs)
  hs = hs or host_load(h)
  local iv = host_interval(hs)
  hs.d = tostring(math.max(0, n0(hs.d) - 1))
  hs.ls = string.format('%.0f', now)
  hs.ne = string.format('%.0f', math.max(n0(hs.ne), now + iv))
  redis.call('HSET', hkey(h), 'd', hs.d, 'ls', hs.ls, 'ne', hs.ne)
  if iv > 0 then host_place(h, hs, now) else host_refile(h, hs, now) end
end

-- Drop the host's in-flight marks and held slots whose time is over (f: and x: fields, see the
-- header), from Redis and from hs; xu goes with the last held slot.
local function host_sweep(h, hs, now)
  local gone = {}
  for f, v in pairs(hs) do
    local head = string.sub(f, 1, 2)
    if (head == 'x:' and n0(v) <= now)
        or (head == 'f:' and n0(string.match(v, ':(%d+)$')) <= now) then
      gone[#gone + 1] = f
    end
  end
  if hs.xu and n0(hs.xu) <= now then gone[#gone + 1] = 'xu' end
  for _, f in ipairs(gone) do hs[f] = nil end
  if #gone > 0 then redis.call('HDEL', hkey(h), unpack(gone)) end
end

-- The request task `id` let go under lease `token` is over (answered, failed, or never sent): its
-- in-flight mark goes, and so does a slot held for it (its lease ended meanwhile: a woken zombie
-- whose request got its answer after all). Returns whether a held slot went (the host's due time may
-- be earlier now).
local function host_over(h, hs, id, token)
  local gone, freed = {}, false
  local mark = hs['f:' .. id]
  if mark and string.match(mark, '^(%d+):') == token then gone[1] = 'f:' .. id end
  local held = 'x:' .. id .. ':' .. token
  if hs[held] then
    gone[#gone + 1], freed = held, true
  end
  for _, f in ipairs(gone) do hs[f] = nil end
  if #gone > 0 then redis.call('HDEL', hkey(h), unpack(gone)) end
  return freed
end

-- A task of host h ends under lease `token` with a request it let go never reported over (its f:
-- mark): the site may still be answering it (its holder was killed mid-request, or stopped past its
-- lease), so the slot is held until the request's in-flight bound (x:<id>:<token>), for the HSET of
-- the caller (`fields`, the field-value list it writes); the mark goes.
local function host_hold(h, hs, id, token, now, fields)
  local key = 'f:' .. id
  local mark = hs[key]
  if not mark then return end
  redis.call('HDEL', hkey(h), key)
  hs[key] = nil
  local k, untl = string.match(mark, '^(%d+):(%d+)$')
  if k ~= token or n0(untl) <= now then return end
  local held = 'x:' .. id .. ':' .. k
  hs[held] = untl
  hs.xu = string.format('%.0f', math.max(n0(hs.xu), n0(untl)))
  local n = #fields
  fields[n + 1], fields[n + 2], fields[n + 3], fields[n + 4] = held, untl, 'xu', hs.xu
end

-- A task of host h stops holding one of its slots (it was running, or dispatched when `dispatched`):
-- completed (`done`), failed, handed back, reclaimed or cancelled. The host may be eligible again.
-- `unused`: a dispatched task goes back to its queue unstarted (grant: its host was blocked since),
-- so its hand-out is given back to the budget too: it is counted when it goes out again. `id` and
-- `token` (a release, a reclaim, a failure, a cancel of a running task: its holder may have died, been
-- cut by a time limit or be still running mid-request): the task and its lease, whose request still
-- unreported holds the slot until it can no longer be in flight (host_hold). A completion passes
-- none: its requests were reported (the fetcher's 'start'); one whose code caught what cut a request
-- frees the slot at once, its mark left to go with its own time (host_sweep).
local function host_end(h, now, done, dispatched, unused, id, token)
  local hs = host_load(h)
  local fields = {'a', tostring(math.max(0, n0(hs.a) - 1))}
  hs.a = fields[2]
  if dispatched then
    hs.d = tostring(math.max(0, n0(hs.d) - 1))
    fields[3], fields[4] = 'd', hs.d
  end
  if unused then
    hs.u = tostring(math.max(0, n0(hs.u) - 1))
    local n = #fields
    fields[n + 1], fields[n + 2] = 'u', hs.u
  end
  if done then -- the counter in the same HSET: the script read it, nothing else writes meanwhile
    hs.done = tostring(n0(hs.done) + 1)
    local n = #fields
    fields[n + 1], fields[n + 2] = 'done', hs.done
  end
  if id then
    host_sweep(h, hs, now)
    host_hold(h, hs, id, token, now, fields)
  end
  redis.call('HSET', hkey(h), unpack(fields))
  -- The active count matters to host_due only under a concurrency limit, the dispatched one only
  -- with a spacing: without them the host's filing is what it was.
  if unused or hnum(hs, 'cc', 0) > 0 or (dispatched and host_interval(hs) > 0) then
    host_place(h, hs, now)
  else
    host_refile(h, hs, now)
  end
end

local function host_dead(h)
  redis.call('HINCRBY', hkey(h), 'dead', 1)
end

-- File every host again after the namespace's limits changed (host_limits.lua): a host parked at
-- SLOT for its budget or concurrency has no event to come, so new defaults that free it must place
-- it. hcfg's rf holds the hosts set's SSCAN cursor while a re-file is under way (kept in Redis, so a
-- caller that dies between two calls leaves it to the next pops: hosts_due goes on with it). One
-- call files the hosts of one SSCAN step of about `count` hosts, and only the filed ones again.
-- Returns whether hosts are left.
local function hosts_refile(now, count)
  local cursor = hcfg().rf
  if not cursor then return false end
  local step = redis.call('SSCAN', K_HOSTS, cursor, 'COUNT', count)
  for _, h in ipairs(step[2]) do
    local known = redis.call('ZSCORE', K_HWAIT, h) and 'wait' or redis.call('ZSCORE', K_HREADY, h) and 'ready'
    if known then host_place(h, host_load(h), now, known) end
  end
  if step[1] == '0' then
    redis.call('HDEL', K_HCFG, 'rf')
    hcfg().rf = nil
    return false
  end
  redis.call('HSET', K_HCFG, 'rf', step[1])
  hcfg().rf = step[1]
  return true
end

-- Move the hosts whose waiting time has come to hready (at most 1000 per call; the rest next call),
-- after a step of a re-file under way (hosts_refile).
local function hosts_due(now)
  if not gate_busy() then return end
  hosts_refile(now, 250)
  local due = redis.call('ZRANGEBYSCORE', K_HWAIT, '-inf', string.format('%.0f', now), 'LIMIT', '0', '1000')
  for _, h in ipairs(due) do host_place(h, host_load(h), now) end
end

-- The host whose task host_pop handed out last in 'c' mode, with its state as read then (grant()
-- counts the hand-out without reading it again).
local popped_host, popped_state
--#per-call
popped_host, popped_state = nil, nil
--#end-per-call

-- Hosts moved behind their peers in this call for a stale entry at their head (host_pop).
local host_bumped
--#per-call
host_bumped = nil
--#end-per-call

-- Take the best queued task of the best eligible host (`first`, `first_band`: hready's first host
-- and its band, when the caller just read them), or nil when no host is eligible. In 'd' mode the
-- hand-out is counted here (host_out); in 'c' mode grant() counts it. Returns id, state, payload.
-- A stale entry (an id cancelled or claimed directly while queued) is skipped against the call's
-- STALE_BUDGET, shared with the bands (past it: nil and stale_cut, so claim_best leaves its wake
-- token), and its host goes behind the hosts of its band, once per call (its serve order moves on,
-- as a hand-out's would): a long run of stale entries at one host's head holds up no other host.
local function host_pop(now, mode, first, first_band)
  if hready_maybe == nil then hready_maybe = gate_busy() end -- then the ZRANGE below tells
  if not hready_maybe then return nil end
  local refiled = 0
  while refiled < 64 do
    local h, band = first, first_band
    first = nil
    if not h then
      local top = redis.call('ZRANGE', K_HREADY, 0, 0, 'WITHSCORES')
      if #top == 0 then
        hready_maybe = false
        return nil
      end
      h, band = top[1], string.format('%d', math.floor(tonumber(top[2]) / BAND))
    end
    local hs = host_load(h)
    -- hready is kept by the events that change a host, but a limit lowered since (or a count
    -- changed by a concurrent path of this script) is checked again at the pop.
    local id, counted
    if host_due(hs, now) == 0 then id, counted = host_take(h, band) end
    if not id then
      refiled = refiled + 1
      host_place(h, hs, now)
    else
      local st, payload = load(id)
      if st and st.s == 'q' and st.h == h then
        if not counted then redis.call('HINCRBY', K_HCFG, 'nq', -1) end
        if mode == 'd' then
          host_out(h, now, 'd', hs, 'ready') -- popped from hready: it is filed there
        else
          popped_host, popped_state = h, hs
        end
        return id, st, payload
      end
      if not (host_bumped and host_bumped[h]) then -- a stale id: dropped
        host_bumped = host_bumped or {}
        host_bumped[h] = true
        hs.lr = tostring(redis.call('HINCRBY', K_HCFG, 'lrs', 1))
        redis.call('HSET', hkey(h), 'lr', hs.lr)
      end
      host_place(h, hs, now, 'ready')
      stale_left = stale_left - 1
      if stale_left <= 0 then
        stale_cut = true
        return nil
      end
    end
  end
  return nil
end

-- The best band among the eligible hosts, as a priority, and the host at its head with that band
-- (1000 - priority, as text); or nil.
local function host_top_priority()
  if hready_maybe == nil then hready_maybe = gate_busy() end -- then the ZRANGE below tells
  if not hready_maybe then return nil end
  local top = redis.call('ZRANGE', K_HREADY, 0, 0, 'WITHSCORES')
  if #top == 0 then
    hready_maybe = false
    return nil
  end
  local band = math.floor(tonumber(top[2]) / BAND)
  return 1000 - band, top[1], string.format('%d', band)
end

-- The state host_pop read for host h in 'c' mode (taken once), or nil.
local function host_popped(h)
  if popped_host ~= h then return nil, nil end
  local hs = popped_state
  popped_host, popped_state = nil, nil
  return hs, 'ready'
end
