--[[ Set a host's politeness limits (overrides of the namespace defaults), or the defaults, and switch
  the namespace's host gate on (enqueue then queues a task with a host in its host's queue).
  KEYS: the task-state layout (_common); none is touched but through the prefix.
  Same slot: the host gate's keys (_hosts.lua: h, hb, hl, hq, hcfg,
    hosts, hready, hwait) are named from ARGV[1], the prefix every KEYS entry
    starts with (its {hash tag} included), so they share KEYS[1]'s slot (_common checks it).
  ARGV[1] namespace prefix
  ARGV[2] host key, or '' for the namespace defaults
  ARGV[3..] field, value pairs: iv (rate spacing, ms), rate (its text, for display), dl (delay, ms),
    cc (concurrency, 0 = none), bg (budget, -1 = none), cd (robots Crawl-delay, ms; a host only);
    km (the host key mode, defaults only); on ('1' / '0', defaults only: the gate switched on or off
    explicitly; without it every call switches the gate on); value '' drops the override (the host
    follows the defaults again)
  Reply: 1
  A changed limit takes effect at once: the host is placed again (for the defaults, the eligible and
  the waiting hosts, at most 1,000 of each per call: the others at their next event, due time or pop).
]]
--#include _common
local now = now_ms()
local key = ARGV[2] == '' and K_HCFG or hkey(ARGV[2])
local switched = false -- the call names the gate's switch ('on'): no implicit switching on then
for i = 3, #ARGV, 2 do
  if ARGV[i] == 'on' then
    if ARGV[2] == '' then
      switched = true
      redis.call('HSET', K_HCFG, 'on', ARGV[i + 1] == '1' and '1' or '0')
    end
  elseif ARGV[i + 1] == '' then
    redis.call('HDEL', key, ARGV[i])
  else
    redis.call('HSET', key, ARGV[i], ARGV[i + 1])
  end
end
if not switched then redis.call('HSET', K_HCFG, 'on', '1') end
if ARGV[2] ~= '' then
  redis.call('SADD', K_HOSTS, ARGV[2])
  host_place(ARGV[2], host_load(ARGV[2]), now)
else
  -- New defaults may make a waiting host eligible or an eligible one full: both sets are filed again
  -- (at most 1,000 hosts each; a pop checks a host's limits again anyway, so one left in hready hands
  -- out nothing it may not).
  local ready = redis.call('ZRANGE', K_HREADY, '0', '999')
  local waiting = redis.call('ZRANGEBYSCORE', K_HWAIT, '-inf', '+inf', 'LIMIT', '0', '1000')
  for _, hosts in ipairs({ready, waiting}) do
    for _, h in ipairs(hosts) do
      host_place(h, host_load(h), now)
    end
  end
end
return 1
