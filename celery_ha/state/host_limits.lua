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
    km (the host key mode, defaults only); value '' drops the override (the host follows the
    defaults again). Two fields say how the call touches the gate's switch, hcfg 'on':
    on  '1' / '0' (defaults only): switched on or off explicitly, by the operator;
        '' (any key): a setting the fetcher learnt (robots' Crawl-delay, read by a task that may be
        draining after `hosts off`): it switches on only a namespace never switched (HSETNX), so an
        explicit off stays off;
        left out: an operator's setting, or a process started with the gate on: switches it on.
    rf  (defaults only, with no other field): go on with the re-file of every host under way (see
        below); nothing is written, nothing switched.
  Reply: 1 while hosts are left to file again after new defaults (call again with rf), else 0.
  A changed limit takes effect at once: the host is placed again. Defaults whose value changed file
  every host again, in steps of about 1,000 hosts per call (hosts_refile of _hosts.lua: a host
  parked for its budget or concurrency has no event to come, so every one must be reached). The
  caller calls again until the reply is 0; a step it leaves undone (it died) is done by the next
  dispatches and claims, which go on with the cursor kept in hcfg.
]]
--#include _common
local now = now_ms()
local host = ARGV[2]
local key = host == '' and K_HCFG or hkey(host)
local LIMITS = {iv = true, dl = true, cc = true, bg = true}
local switch = 'on' -- 'on' (HSET), 'unset' (HSETNX: a namespace never switched only), 'keep'
local changed = false -- a default limit changed: every host is filed again
for i = 3, #ARGV, 2 do
  local field, value = ARGV[i], ARGV[i + 1]
  if field == 'on' then
    if value == '' then
      if switch == 'on' then switch = 'unset' end
    elseif host == '' then
      switch = 'keep'
      redis.call('HSET', K_HCFG, 'on', value == '1' and '1' or '0')
    end
  elseif field == 'rf' then
    switch = 'keep'
  else
    if host == '' and LIMITS[field] and redis.call('HGET', K_HCFG, field) ~= (value ~= '' and value or false) then
      changed = true
    end
    if value == '' then
      redis.call('HDEL', key, field)
    else
      redis.call('HSET', key, field, value)
    end
  end
end
if switch == 'on' then
  redis.call('HSET', K_HCFG, 'on', '1')
elseif switch == 'unset' then
  redis.call('HSETNX', K_HCFG, 'on', '1')
end
if host ~= '' then
  redis.call('SADD', K_HOSTS, host)
  host_place(host, host_load(host), now)
  return 0
end
if changed then
  redis.call('HSET', K_HCFG, 'rf', '0') -- from the start again, when a re-file was under way
  host_defaults = nil -- the new defaults are read again
end
return hosts_refile(now, 1000) and 1 or 0
