--[[ The pump: keep at most `window` tasks dispatched (sent to the broker, not yet claimed).
  1. promote due retries; 2. re-stamp dispatched tasks never claimed within redispatch_after_ms
  (their message may be lost) and send them again; 3. move ready tasks to inflight up to the window
  (fill_window, in _dispatch.lua: complete_dispatch.lua does the same after a completion).
  KEYS[1]  tasks
  KEYS[2]  readyp
  KEYS[3]  delayed
  KEYS[4]  inflight
  KEYS[10] stats
  Same slot: the record buckets (_records.lua: t:<i>, tg), the ready lists r:<priority> and the host gate's keys (_hosts.lua: h, hb, hl, hq, hcfg,
    hosts, hready, hwait) it may touch are
    named from ARGV[1], the prefix every KEYS entry starts with (its {hash tag} included), so they
    share KEYS[1]'s slot (_common checks it).
  ARGV[1] namespace prefix
  ARGV[2] window (most tasks dispatched at once)
  ARGV[3] redispatch_after (ms a dispatched task may wait for its claim before it is sent again)
  ARGV[4] promote limit (due retries moved per call)
  Reply: flat list of {id, task name, priority, resent (1 = sent before, its message may be lost)},
    possibly empty; the caller sends one Celery message each
]]
--#include _common
--#include _dispatch
return fill_window(now_ms(), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4])
