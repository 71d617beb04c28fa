--[[ Shared include (pulled in by _common before _records and _remembered, and by records.lua): the
  alphabet of task ids (celery_ha/state/ids.py), for the scripts that read an id's characters as
  base-62 digits: the record buckets (_records.lua) and the remembered ids (_remembered.lua).
  Defines: ALPHA; IDX (character byte -> index 0-61); CHR (index -> character byte).
]]
local ALPHA = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'
local IDX, CHR = {}, {}
for j = 1, 62 do
  IDX[string.byte(ALPHA, j)] = j - 1
  CHR[j - 1] = string.byte(ALPHA, j)
end
