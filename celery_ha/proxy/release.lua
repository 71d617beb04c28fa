--[[ Return a borrowed proxy with the outcome of its request, in one round trip: free the lock (only with
  its token), re-stamp the rate-window hit with the time the response came back, and fold the outcome
  into the proxy's statistics, score and ban state.
  KEYS[1] the available zone
  Same slot: the keys it builds (blk:<domain>, bud:<domain>, dban:<domain>, dx:<domain>, gen, grp, iu,
    lk:<id>|<domain>, m:<id>, new, pb, pd:<id>, rw:<id>|<domain>, sem:<group>, stats, tb, each under
    cha:{ns}:px:) are named from
    ARGV[1], the prefix KEYS[1] starts with ({hash tag} included), so they share KEYS[1]'s slot (_common
    checks it).
  ARGV[1] the pool's key prefix
  ARGV[2] the proxy id
  ARGV[3] the domain
  ARGV[4] the lease token ('<token>/<group>' for a group's proxy: the slot to free is named in it)
  ARGV[5] outcome: ok | permanent | blocked | server | transport | aborted | unused
  ARGV[6] latency (ms; -1 = unknown)
  ARGV[7] HTTP status (0 = none)
  ARGV[8] Retry-After (ms; 0 = none): a block bans the domain at least this long
  ARGV[9] jitter in [0, 1) for the ban backoffs
  ARGV[10] "max_fails ban_base_ms ban_cap_ms max_temp_bans block_base_ms block_cap_ms"
  ARGV[11] score constants (scoring.py SCORE_ARG)
  Reply: {status, state, score}
    status 'ok' (the lease was current), 'late' (the lock expired but the lease was still recorded:
      outcome folded) or 'stale' (already released or reaped: nothing folded; state and score '')
    state the proxy's state after the fold ('gone' when it was removed meanwhile)
    score the new score as a string; '' for an unused lease, a gone proxy, or one this release banned
]]
--#include _common
local P, pid, domain, token, outcome = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local latency, status, retry_ms, jitter = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local cfg = numargs(ARGV[10])
local K = numargs(ARGV[11])
local max_fails, ban_base, ban_cap, max_tbans, blk_base, blk_cap = cfg[1], cfg[2], cfg[3], cfg[4], cfg[5], cfg[6]
local av = KEYS[1]
local now = now_ms()
local stamp = now + 1 -- never earlier than the real return time (now is floored)

local lk = P .. 'lk:' .. pid .. '|' .. domain
local mine = redis.call('GET', lk) == token
if mine then redis.call('DEL', lk) end
local live = redis.call('ZREM', P .. 'iu', pid .. '|' .. domain .. '|' .. token) == 1

local win = P .. 'rw:' .. pid .. '|' .. domain
local bud = P .. 'bud:' .. domain
if outcome == 'unused' then
  redis.call('ZREM', win, token)
  redis.call('ZREM', bud, token)
else
  redis.call('ZADD', win, 'XX', stamp, token)
  redis.call('ZADD', bud, 'XX', stamp, token)
end
-- No cool-down entry to clear: while this lease held the lock, acquires stopped at the lock and never
-- judged this window; the next acquire judges it afresh from the re-stamped hits. The domain's
-- exhausted marker goes (the lock is free now), and a freed group slot may serve any domain.
redis.call('DEL', P .. 'dx:' .. domain)
-- The group named in the token, not the proxy's current one: a session removed or expired while
-- borrowed has no group entry left, and its slot must still free now, not at lease expiry.
local grp = string.match(token, '/(.+)$') or redis.call('HGET', P .. 'grp', pid)
if grp and redis.call('ZREM', P .. 'sem:' .. grp, token) == 1 then redis.call('INCR', P .. 'gen') end

if not (mine or live) then return {'stale', '', ''} end
local result = mine and 'ok' or 'late'
local mk = P .. 'm:' .. pid
local m = redis.call('HMGET', mk, 'state', 's', 't', 'ln', 'ld', 'cf', 'okst', 'tbans', 'added_at', 'expires_at')
local state = m[1]
if not state then return {result, 'gone', ''} end
redis.call('HINCRBY', P .. 'stats', 'out_' .. outcome, 1)
if outcome == 'unused' then return {result, state, ''} end

local s, t, ln, ld = tonumber(m[2]) or 0, tonumber(m[3]) or 0, tonumber(m[4]) or 0, tonumber(m[5]) or 0
local cf, okst, tbans = tonumber(m[6]) or 0, tonumber(m[7]) or 0, tonumber(m[8]) or 0
local decay = K[4]
local counter = nil

if latency >= 0 and outcome ~= 'transport' then
  ln = ln * decay + latency
  ld = ld * decay + 1
end
if outcome == 'ok' or outcome == 'permanent' then
  s = s * decay + 1
  t = t * decay + 1
  cf = 0
  okst = okst + 1
  if okst >= 20 and tbans > 0 then tbans = tbans - 1; okst = 0 end
  redis.call('HDEL', P .. 'blk:' .. domain, pid)
  counter = outcome == 'ok' and 'n_ok' or 'n_perm'
elseif outcome == 'transport' then
  -- The proxy itself failed: counts against it everywhere.
  s = s * decay
  t = t * decay + 1
  cf = cf + 1
  okst = 0
  counter = 'n_tr'
elseif outcome == 'blocked' then
  -- The site refused this exit: counts against the proxy for this domain only.
  local blk = P .. 'blk:' .. domain
  local c = redis.call('HINCRBY', blk, pid, 1)
  local d = backoff(blk_base, blk_cap, c, jitter)
  if retry_ms > d then d = retry_ms end
  local dban = P .. 'dban:' .. domain
  redis.call('ZADD', dban, now + d, pid)
  lengthen(dban, d + 1000)
  -- Block counts are forgotten two caps after the domain's last block: the doubling has long
  -- reached its cap by then, and the domain's keys must not outlive its proxies for ever.
  local keep = 2 * math.max(blk_cap, d) + 1000
  lengthen(blk, keep)
  -- The proxy's index of blocked domains (unban/forget lift them), bounded: beyond 1000 domains
  -- the entries are left to their TTLs.
  local pd = P .. 'pd:' .. pid
  if redis.call('SCARD', pd) < 1000 then redis.call('SADD', pd, domain) end
  lengthen(pd, keep)
  counter = 'n_blk'
elseif outcome == 'server' then
  -- 5xx: the site's trouble, not the proxy's; recorded, score untouched.
  counter = 'n_5xx'
else
  -- aborted: the caller was interrupted mid-request; nothing to learn about the proxy.
  counter = 'n_abort'
end
redis.call('HINCRBY', mk, counter, 1)

local sc = score_from(s, t, ln, ld, tonumber(m[9]) or now, tonumber(m[10]) or 0, now, K)
redis.call('HSET', mk, 'last_outcome', outcome, 'last_status', status, 'last_release_at', now,
  's', s, 't', t, 'ln', ln, 'ld', ld, 'cf', cf, 'okst', okst, 'tbans', tbans, 'score', sc,
  'lat_ewma', ld > 0 and math.floor(ln / ld) or -1)
if state ~= 'avail' then return {result, state, tostring(sc)} end
if cf >= max_fails then
  return {result, temp_ban(P, pid, now, ban_base, ban_cap, max_tbans, jitter, 'transport errors'), ''}
end
redis.call('ZADD', av, 'XX', sc, pid)
return {result, state, tostring(sc)}
