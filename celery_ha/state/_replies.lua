--[[ Shared include: the refusal codes of the task-state scripts (pulled in by _common).
  A script that refuses a transition changes nothing and returns one of these negative integers in
  place of its success reply (which is never a negative integer). celery_ha/state/replies.py turns a
  code into the caller's result (None, 0) or error (LeaseLost, TaskNotFound) with its reason; a test
  checks that both lists agree.
    -1 R_UNKNOWN       no record with that id: never enqueued, or finished and trimmed from history
    -2 R_WAITING       the task is queued or dispatched, waiting for a claim: no lease is held on it
                       (a lease on it expired and was reclaimed, or was released)
    -3 R_STALE_TOKEN   the task is running under another token: a newer claim holds it
    -4 R_OTHER_WORKER  the task is running, held by another worker than the one named
    -5 R_RUNNING       the task is already running (a claim needs it queued or dispatched)
    -6 R_DELAYED       the task failed and waits in `delayed` for its retry
    -7 R_COMPLETED     the task is completed
    -8 R_DEAD          the task is dead
    -9 R_EMPTY         no queued task could be claimed
  Defines: the R_* constants above; refusal_in(s) -> the code for a task found in state `s` (a
  one-letter state code) when the transition needed another state.
]]

local R_UNKNOWN = -1
local R_WAITING = -2
local R_STALE_TOKEN = -3
local R_OTHER_WORKER = -4
local R_RUNNING = -5
local R_DELAYED = -6
local R_COMPLETED = -7
local R_DEAD = -8
local R_EMPTY = -9

local function refusal_in(s)
  if s == 'r' then return R_RUNNING end
  if s == 'w' then return R_DELAYED end
  if s == 'c' then return R_COMPLETED end
  if s == 'x' then return R_DEAD end
  return R_WAITING -- 'q' queued, 'd' dispatched
end
