--[[ Finish a task under its lease in one step: store its last emitted items, complete it, and refill
  the broker window (what dispatch.lua does), so the pump sends the next messages without a commit,
  a complete and a dispatch round trip of their own. A stale lease writes nothing and moves nothing.
  KEYS[1]  tasks
  KEYS[2]  readyp (the refill pops ready bands)
  KEYS[3]  delayed (due retries are promoted)
  KEYS[4]  inflight (the refill; the window counts it)
  KEYS[5]  running
  KEYS[7]  completed
  KEYS[8]  done (a dedup id is remembered, with its completion time)
  KEYS[9]  ckpt (dropped with the completion)
  KEYS[10] stats
  KEYS[12] hist (the runtime histogram counts the completion)
  KEYS[13] items (hash: item key -> item JSON)
  KEYS[14] itemlog (list: item keys in commit order)
  Same slot: the ready lists r:<priority> it may touch are named from ARGV[1], the prefix every KEYS
    entry starts with (its {hash tag} included), so they share KEYS[1]'s slot (_common checks it).
  ARGV[1] namespace prefix
  ARGV[2] task id
  ARGV[3] fencing token
  ARGV[4] history_max (completed records kept)
  ARGV[5] history_age (ms a completed record is kept)
  ARGV[6] window (most tasks dispatched at once), or '' for no refill (the caller pumps later)
  ARGV[7] redispatch_after (ms a dispatched task may wait for its claim before it is sent again)
  ARGV[8] promote limit (due retries moved per call)
  ARGV[9..] item key, item JSON, item key, item JSON, ... (a key the sink holds is ignored)
  Reply: {new items (0 or more), flat list of {id, task name, priority, resent} as dispatch.lua's},
    the list empty without a refill; or a refusal (nothing written, nothing dispatched): R_UNKNOWN,
    R_WAITING, R_STALE_TOKEN, R_DELAYED, R_COMPLETED, R_DEAD
]]
--#include _common
--#include _dispatch
local now = now_ms()
local added, held = 0, nil
if #ARGV > 8 then
  -- Items first, as commit.lua: HSETNX is then the script's first write, so a Redis over maxmemory
  -- refuses the whole step (OOM, nothing written: the runner hands the task back) rather than
  -- letting a completion that began with a ZREM write on past the limit. Fenced before any write;
  -- the record it read is handed to complete_task (storing items does not touch it).
  local st, payload, refusal = fenced(ARGV[2], ARGV[3])
  if refusal then return refusal end
  added = store_items(9)
  held = {st, payload}
end
local done = complete_task(ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), now, held)
if done ~= true then return done end -- only without items: fenced() above already passed
if ARGV[6] == '' then return {added, {}} end
return {added, fill_window(now, tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8])}
