--[[ Shared include: the prelude of every proxy-pool script (pulled in with --#include _common).
  P below is the pool's key prefix (``cha:{ns}:px:``, ARGV[1] of every script); K is the list of score
  constants parsed from the ARGV string built by celery_ha/proxy/scoring.py (SCORE_ARG), in the order
  w_success w_latency w_lifetime decay prior_success prior_weight latency_ref latency_prior_weight.
  Defines:
    now_ms(), now_us_score()      the Redis clock (from --#include clock; integer ms keep every score
                                  exact when Lua formats it)
    numargs(text) -> {number}     a space-separated ARGV string as numbers
    score_from(s, t, ln, ld, added, expires, now, K) -> score   the formula of scoring.py
    score_of(P, pid, now, K) -> score   the same, from the proxy's stored hash
    lengthen(key, ms)             give key a TTL of ms unless it already lives longer (shared keys:
                                  a short lease must never cut a long lease's reservation short;
                                  PEXPIRE GT is Redis 7 only)
    clear_domain_bans(P, pid)     lift the proxy's per-domain bans and block counts (index pd:<id>)
    forget(P, pid)                drop every trace of one proxy (expiry, explicit removal)
    bury(P, pid, now)             forget an expired proxy, keeping its ban in a tombstone tomb:<id>
    housekeeping(P, now, limit, by_time) -> leases reaped   expire proxies, empty the in-use zone of
                                  dead leases, and (by_time: no health check configured) end due
                                  temporary bans and admit the proxies waiting in 'new' unchecked
    backoff(base, cap, n, jitter) -> ms   jittered exponential backoff
    temp_ban(P, pid, now, base, cap, max_tbans, jitter, reason) -> 'tban' | 'pban'
    make_available(P, pid, now, K) -> score   (re)join the available zone (bumps the pool's
                                  generation `gen`: acquire's exhausted-domain markers are void)
  and runs the same_slot check (--#include same_slot): every key a script builds from P shares the
  Redis Cluster slot of KEYS[1].
]]
--#include clock
--#include same_slot

local function numargs(text)
  local out = {}
  for w in string.gmatch(text, '%S+') do out[#out + 1] = tonumber(w) end
  return out
end

-- The score of scoring.py: success rate, latency score and remaining lifetime, weighted by K.
local function score_from(s, t, ln, ld, added, expires, now, K)
  local sr = (s + K[6] * K[5]) / (t + K[6])
  local lat = (ln + K[8] * K[7]) / (ld + K[8])
  local ls = K[7] / (K[7] + lat)
  local lr = 1
  if expires > 0 then
    lr = (expires - now) / math.max(1, expires - added)
    if lr < 0 then lr = 0 elseif lr > 1 then lr = 1 end
  end
  return K[1] * sr + K[2] * ls + K[3] * lr
end

local function score_of(P, pid, now, K)
  local m = redis.call('HMGET', P .. 'm:' .. pid, 's', 't', 'ln', 'ld', 'added_at', 'expires_at')
  return score_from(tonumber(m[1]) or 0, tonumber(m[2]) or 0, tonumber(m[3]) or 0, tonumber(m[4]) or 0,
    tonumber(m[5]) or now, tonumber(m[6]) or 0, now, K)
end

-- Move a proxy (back) into the available zone, ranked by its current score.
local function make_available(P, pid, now, K)
  redis.call('ZREM', P .. 'tb', pid)
  redis.call('ZREM', P .. 'new', pid)
  redis.call('ZREM', P .. 'pb', pid)
  local sc = score_of(P, pid, now, K)
  redis.call('ZADD', P .. 'av', sc, pid)
  redis.call('HSET', P .. 'm:' .. pid, 'state', 'avail', 'ban_until', 0, 'score', sc)
  redis.call('HDEL', P .. 'm:' .. pid, 'ck') -- a health claim in flight no longer applies
  redis.call('INCR', P .. 'gen')
  return sc
end

-- A TTL that only ever grows: keys shared by leases of different lengths (a group's semaphore, a
-- domain's budget) must live as long as the longest lease in them.
local function lengthen(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end

-- Per-domain bans and block counts of one proxy, found through its index pd:<id> (release adds a
-- domain when it records a block there). Unban and forget lift them; otherwise they expire by TTL.
local function clear_domain_bans(P, pid)
  local pd = P .. 'pd:' .. pid
  for _, d in ipairs(redis.call('SMEMBERS', pd)) do
    redis.call('HDEL', P .. 'blk:' .. d, pid)
    redis.call('ZREM', P .. 'dban:' .. d, pid)
  end
  redis.call('DEL', pd)
end

-- Drop every trace of one proxy (used for expiry and explicit removal).
local function forget(P, pid)
  clear_domain_bans(P, pid)
  redis.call('ZREM', P .. 'av', pid)
  redis.call('ZREM', P .. 'new', pid)
  redis.call('ZREM', P .. 'tb', pid)
  redis.call('ZREM', P .. 'pb', pid)
  redis.call('ZREM', P .. 'exp', pid)
  redis.call('SREM', P .. 'all', pid)
  redis.call('HDEL', P .. 'grp', pid)
  redis.call('DEL', P .. 'm:' .. pid)
end

-- How long a tombstone outlives the temporary ban it remembers (ms): a day, so a provider re-adding
-- the proxy meanwhile gets it back banned and with its escalation count (tbans), not as fresh.
local TOMB_MS = 86400000

-- Forget a proxy whose provider lifetime ended. A banned one (or one with bans on its record) leaves
-- a tombstone tomb:<id> that add.lua reads: a permanent ban's lives until `proxies unban`/`remove`
-- (a few dozen bytes each), a temporary one's until a day after its ban ends.
local function bury(P, pid, now)
  local m = redis.call('HMGET', P .. 'm:' .. pid, 'state', 'tbans', 'ban_until', 'ban_reason')
  local tbans = tonumber(m[2]) or 0
  if m[1] == 'pban' or m[1] == 'tban' or tbans > 0 then
    local tk = P .. 'tomb:' .. pid
    redis.call('DEL', tk)
    redis.call('HSET', tk, 'state', m[1], 'tbans', tbans, 'ban_until', m[3] or 0, 'ban_reason', m[4] or '')
    if m[1] ~= 'pban' then
      redis.call('PEXPIRE', tk, math.max(0, (tonumber(m[3]) or 0) - now) + TOMB_MS)
    end
  end
  forget(P, pid)
end

-- Bounded housekeeping run by acquire: proxies whose provider lifetime ended, and leases whose
-- borrower died (their lock keys already expired by TTL; this empties the in-use zone). With by_time
-- (no health check configured), temporary bans whose time is up end here, and proxies added with
-- verify leave the 'new' zone unchecked (counted as admitted_unchecked): nothing else would ever end
-- either wait. A 'new' proxy a checker has claimed (its due time pushed past now) waits for that probe.
local function housekeeping(P, now, limit, by_time, K)
  local gone = redis.call('ZRANGEBYSCORE', P .. 'exp', '-inf', now, 'LIMIT', 0, limit)
  for _, pid in ipairs(gone) do bury(P, pid, now) end
  if #gone > 0 then redis.call('HINCRBY', P .. 'stats', 'expired', #gone) end
  local dead = redis.call('ZRANGEBYSCORE', P .. 'iu', '-inf', now, 'LIMIT', 0, limit)
  for _, member in ipairs(dead) do
    redis.call('ZREM', P .. 'iu', member)
    local pid = string.match(member, '^([^|]+)|')
    if pid and redis.call('EXISTS', P .. 'm:' .. pid) == 1 then
      redis.call('HINCRBY', P .. 'm:' .. pid, 'n_abandoned', 1)
    end
  end
  if #dead > 0 then redis.call('HINCRBY', P .. 'stats', 'reaped', #dead) end
  if by_time then
    local due = redis.call('ZRANGEBYSCORE', P .. 'tb', '-inf', now, 'LIMIT', 0, limit)
    for _, pid in ipairs(due) do make_available(P, pid, now, K) end
    if #due > 0 then redis.call('HINCRBY', P .. 'stats', 'unbanned_by_time', #due) end
    local waiting = redis.call('ZRANGEBYSCORE', P .. 'new', '-inf', now, 'LIMIT', 0, limit)
    for _, pid in ipairs(waiting) do make_available(P, pid, now, K) end
    if #waiting > 0 then redis.call('HINCRBY', P .. 'stats', 'admitted_unchecked', #waiting) end
  end
  return #dead
end

-- Jittered exponential backoff in ms: base * 2^(n-1) scaled into [0.75, 1.25), never above cap.
local function backoff(base, cap, n, jitter)
  local d = base * (2 ^ math.max(0, n - 1)) * (0.75 + 0.5 * jitter)
  if d > cap then d = cap end
  return math.floor(d)
end

-- Put a proxy in the temporary-ban zone, or the permanent one once it has been banned too often.
-- Returns the new state ('tban' or 'pban').
local function temp_ban(P, pid, now, base, cap, max_tbans, jitter, reason)
  local mk = P .. 'm:' .. pid
  local n = redis.call('HINCRBY', mk, 'tbans', 1)
  redis.call('ZREM', P .. 'av', pid)
  redis.call('ZREM', P .. 'new', pid)
  redis.call('HSET', mk, 'cf', 0, 'okst', 0, 'ban_reason', reason)
  redis.call('HDEL', mk, 'ck') -- a health claim in flight no longer applies
  if n > max_tbans then
    redis.call('ZREM', P .. 'tb', pid)
    redis.call('ZADD', P .. 'pb', now, pid)
    redis.call('HSET', mk, 'state', 'pban', 'ban_until', 0)
    redis.call('HINCRBY', P .. 'stats', 'banned_permanently', 1)
    return 'pban'
  end
  local untl = now + backoff(base, cap, n, jitter)
  redis.call('ZADD', P .. 'tb', untl, pid)
  redis.call('HSET', mk, 'state', 'tban', 'ban_until', untl)
  redis.call('HINCRBY', P .. 'stats', 'banned_temporarily', 1)
  return 'tban'
end
