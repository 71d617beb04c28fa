--[[ Shared include (pulled in by _common before _records and _remembered, and by records.lua): the
  alphabet of task ids (celery_ha/state/ids.py), for the scripts that read an id's characters as
  base-62 digits: the record buckets (_records.lua) and the remembered ids (_remembered.lua).
  Defines: ALPHA; IDX (character byte -> index 0-61, nil for any other byte or a nil);
  CHR (index 0-61 -> character byte).
  Both tables fill on the first use of each entry (a metatable's __index works it out and keeps it)
  rather than by a loop over the alphabet: the script's text runs in full at every call, and that
  loop was ~9 us of every task-state script's ~21 us prelude (benchmarks/RESULTS.md, "Where the
  rest goes"). They are made in a per-call block (a function library cannot call setmetatable when it
  loads) and kept there from call to call (celery_ha/redisio/functions.py).
]]
local ALPHA = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'
local IDX, CHR
--#per-call
if not IDX then -- a function library keeps them from call to call
  IDX = setmetatable({}, {__index = function(t, b)
    if type(b) ~= 'number' then return nil end
    local v
    if b >= 48 and b <= 57 then v = b - 48
    elseif b >= 65 and b <= 90 then v = b - 55
    elseif b >= 97 and b <= 122 then v = b - 61 end
    if v then rawset(t, b, v) end
    return v
  end})
  CHR = setmetatable({}, {__index = function(t, i)
    local v = type(i) == 'number' and i >= 0 and i <= 61 and i % 1 == 0 and string.byte(ALPHA, i + 1) or nil
    if v then rawset(t, i, v) end
    return v
  end})
end
--#end-per-call
