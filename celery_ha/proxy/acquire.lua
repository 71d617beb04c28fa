--[[ Borrow the best-scored proxy for one domain: not banned (globally or for this domain), not locked for
  this domain, inside its rate window, and inside its group's concurrency cap (tunnels). One round trip.
  The hit is reserved in the rate window at lease expiry (the latest moment the request may still go
  out); release re-stamps it with the time the response came back. The target therefore never sees more
  than n requests inside any window, however late a request leaves the worker.
  KEYS[1] the available zone (routes the call; every other key shares its {ns} hash tag)
  KEYS[2] the domain counters (hash: "a:<domain>" leases granted, "n:<domain>" refusals), read by
    celery_ha/proxy/metrics.py; at most DOM_FIELDS fields: a new domain beyond that counts under
    "a:~other" / "n:~other", so the hash (read whole by every metrics scrape) stays bounded
  Same slot: the keys it builds (all, blk:<domain>, bud:<domain>, cd:<domain>, dban:<domain>, dcfg,
    dx:<domain>, exp, gcap, gen, grp, iu, lk:<id>|<domain>, m:<id>, new, pb, pd:<id>, rw:<id>|<domain>,
    sem:<group>, stats, tb, tomb:<id>, each under
    cha:{ns}:px:) are named from ARGV[1], the prefix KEYS[1] starts with ({hash tag} included), so they
    share KEYS[1]'s slot (_common checks it).
  ARGV[1] the pool's key prefix
  ARGV[2] the domain (normalized)
  ARGV[3] the borrowing worker's name
  ARGV[4] the lease token the lock will hold
  ARGV[5] lock ttl (ms)
  ARGV[6] rate: requests per window per proxy × domain (a stored domain override wins)
  ARGV[7] rate window (ms)
  ARGV[8] window margin (ms)
  ARGV[9] proxy ids the caller must not get (space separated, may be empty)
  ARGV[10] domain budget: requests per window across all proxies (0 = none)
  ARGV[11] budget window (ms)
  ARGV[12] '1': no health check configured, so housekeeping ends temporary bans whose time is up and
    admits the proxies waiting in 'new' (added with verify) unchecked
  ARGV[13] score constants (scoring.py SCORE_ARG)
  Reply: {'ok', pid, token, url, lease_expiry_ms, now_ms} on success, or
    {'none', retry_after_ms, reason} with reason 'budget' (the domain's budget is spent), 'empty' (no
    available proxy at all), 'excluded' (every available proxy was excluded by the caller) or 'busy'
    (locked, rate-limited, cooling down, banned for the domain or group full)
  The token of a lease on a group's proxy is ARGV[4] .. '/' .. group (tokens never hold '/'): release
    frees the group's slot by it even when the proxy (and its group entry) is gone meanwhile.
]]
--#include _common
local P, domain, worker, token = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local lock_ttl, rn, rw, margin = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local bn, bw = tonumber(ARGV[10]), tonumber(ARGV[11])
local av = KEYS[1]
local now = now_ms()
housekeeping(P, now, 20, ARGV[12] == '1', numargs(ARGV[13]))

local override = redis.call('HGET', P .. 'dcfg', domain)
if override then
  local o = numargs(override)
  if o[1] and o[1] > 0 then rn, rw = o[1], o[2] end
  if o[3] and o[3] > 0 then bn, bw = o[3], o[4] end
end

local stats = P .. 'stats'
local bud = P .. 'bud:' .. domain
local DOM_FIELDS = 4000
-- A grant ('a') or refusal ('n') for this domain, in a hash of bounded size.
local function count_domain(kind)
  local f = kind .. ':' .. domain
  if redis.call('HLEN', KEYS[2]) >= DOM_FIELDS and redis.call('HEXISTS', KEYS[2], f) == 0 then
    f = kind .. ':~other'
  end
  redis.call('HINCRBY', KEYS[2], f, 1)
end
-- A refusal: counted for the pool and for the domain.
local function refuse(wait, why)
  redis.call('HINCRBY', stats, 'no_proxy', 1)
  count_domain('n')
  return {'none', wait, why}
end
if bn > 0 then
  redis.call('ZREMRANGEBYSCORE', bud, '-inf', now - bw - margin)
  if redis.call('ZCARD', bud) >= bn then
    local o = redis.call('ZRANGE', bud, 0, 0, 'WITHSCORES')
    -- An in-flight reservation is scored at its lease expiry, but its release re-stamps it with the
    -- time the response came back, which is soon: as a hint it counts as sent now, so a full budget
    -- of in-flight requests says "one window from now", not "one window after the leases expire".
    return refuse(math.max(1, math.min(tonumber(o[2]), now) + bw + margin - now), 'budget')
  end
end

-- An exhausted domain is remembered, so the workers polling it cost a few commands, not a walk of
-- the pool: dx:<domain> holds the pool's generation (gen) when a full walk found every proxy busy,
-- and lives until the earliest moment one of them could be free (a rate window reopening, a ban
-- ending, a group slot's lease expiring; at most 250 ms while a lock is held, whose release may come
-- any time). What can free a proxy earlier clears it: release deletes its domain's marker, a change
-- of the domain's rate too, and whatever makes a proxy available or frees a group slot bumps gen.
local dx = P .. 'dx:' .. domain
local mark = redis.call('MGET', dx, P .. 'gen')
if mark[1] and mark[1] == (mark[2] or '0') then
  local left = redis.call('PTTL', dx)
  if left > 0 then return refuse(left, 'busy') end
end

local first = redis.call('ZREVRANGE', av, 0, 15)
if #first == 0 then
  local due = redis.call('ZRANGE', P .. 'tb', 0, 0, 'WITHSCORES')
  local wait = 5000
  if due[2] then wait = math.max(1000, tonumber(due[2]) - now) end
  return refuse(wait, 'empty')
end

local best = nil
local reason = 'busy'
local function note(ms)
  if best == nil or ms < best then best = ms end
end

-- Proxies known to be unusable for this domain right now are loaded in bulk, so an exhausted domain
-- costs a few calls instead of several per proxy: 'cd' (cool-down) holds the time a full rate window
-- reopens, 'dban' the end of a per-domain ban after a block.
local skip = {}
for p in string.gmatch(ARGV[9], '%S+') do skip[p] = 'excluded' end
local cdk = P .. 'cd:' .. domain
local dban = P .. 'dban:' .. domain
for _, zkey in ipairs({cdk, dban}) do -- stale entries are ignored here and vanish with the key's TTL
  local cool = redis.call('ZRANGEBYSCORE', zkey, '(' .. now, '+inf', 'WITHSCORES')
  for i = 1, #cool, 2 do
    if not skip[cool[i]] then skip[cool[i]] = 'cool' end
  end
  if cool[2] then note(tonumber(cool[2]) - now) end
end
local has_grp = redis.call('EXISTS', P .. 'grp') == 1
local group_full = {}
local usable = false

-- Candidates best first, in growing batches: the first few usually suffice.
local ids, start, batch = first, 0, 16
while #ids > 0 do
  for _, pid in ipairs(ids) do
    repeat -- 'break' below means 'next candidate'
      if skip[pid] then
        if skip[pid] == 'cool' then usable = true end
        break
      end
      usable = true
      local lk = P .. 'lk:' .. pid .. '|' .. domain
      local pttl = redis.call('PTTL', lk)
      -- A lock usually frees within a request's time: hint a short wait, not the whole lease.
      if pttl ~= -2 then note(math.min(pttl > 0 and pttl or lock_ttl, 250)); break end
      local win = P .. 'rw:' .. pid .. '|' .. domain
      if redis.call('ZCARD', win) >= rn then -- trim old hits only when the window looks full
        redis.call('ZREMRANGEBYSCORE', win, '-inf', now - rw - margin)
        if redis.call('ZCARD', win) >= rn then
          local o = redis.call('ZRANGE', win, 0, 0, 'WITHSCORES')
          -- As for the budget: an in-flight reservation (scored at its lease expiry) counts as sent
          -- now, since its release re-stamps it soon; the window is checked again when this passes.
          local reopen = math.max(now + 1, math.min(tonumber(o[2]), now) + rw + margin)
          redis.call('ZADD', cdk, reopen, pid)
          lengthen(cdk, lock_ttl + rw + margin + 1000)
          note(reopen - now)
          break
        end
      end
      local grp, sem = false, nil
      if has_grp then
        grp = redis.call('HGET', P .. 'grp', pid)
        if grp then
          if group_full[grp] then break end
          sem = P .. 'sem:' .. grp
          redis.call('ZREMRANGEBYSCORE', sem, '-inf', now)
          local cap = tonumber(redis.call('HGET', P .. 'gcap', grp)) or 0
          if cap > 0 and redis.call('ZCARD', sem) >= cap then
            local o = redis.call('ZRANGE', sem, 0, 0, 'WITHSCORES')
            note(math.max(1, tonumber(o[2]) - now))
            group_full[grp] = true
            break
          end
        end
      end
      -- Take it.
      local exp = now + lock_ttl
      if sem then token = token .. '/' .. grp end
      redis.call('SET', lk, token, 'PX', lock_ttl)
      redis.call('ZADD', win, exp, token)
      lengthen(win, lock_ttl + rw + margin + 1000)
      if bn > 0 then
        redis.call('ZADD', bud, exp, token)
        lengthen(bud, lock_ttl + bw + margin + 1000)
      end
      if sem then
        redis.call('ZADD', sem, exp, token)
        lengthen(sem, lock_ttl + 1000)
      end
      redis.call('ZADD', P .. 'iu', exp, pid .. '|' .. domain .. '|' .. token)
      local mk = P .. 'm:' .. pid
      redis.call('HSET', mk, 'last_used_by', worker, 'last_used_at', now)
      redis.call('HINCRBY', mk, 'n_acq', 1)
      count_domain('a')
      return {'ok', pid, token, redis.call('HGET', mk, 'url'), exp, now}
    until true
  end
  if #ids < batch then break end
  start = start + batch
  batch = batch * 4
  ids = redis.call('ZREVRANGE', av, start, start + batch - 1)
end

if not usable then
  reason = 'excluded' -- every available proxy was excluded by the caller
end
if best == nil then best = 1000
elseif reason == 'busy' and ARGV[9] == '' then
  -- Only a walk that excluded nothing speaks for every caller.
  redis.call('SET', dx, mark[2] or '0', 'PX', math.max(1, best))
end
return refuse(best, reason)
