--[[ Shared include: push one message per dispatched task onto a list of another database of the same
  server (a broker's queue lists), rendered from a template the caller passes. Used by
  complete_dispatch.lua after fill_window, as its last step: the SELECT it may run moves the rest of
  the script to that database (a script's SELECT never outlives the script, on 6.2 as on 7).
  ARGV[from .. to], the push section (celery_ha/state/list_push.py builds it):
    from         database to SELECT, or '' for the script's own
    from+1..+10  the list key of message priority 0..9; a task of priority p gets message priority
                 clamp(3 - p, 0, 9) (0 is served first, as celery_ha.integration.dispatch.pump.celery_priority)
    from+11      a nonce unique to this call (random: no two calls share one)
    from+12..to  the template: fragment, code, fragment, ..., code, fragment; each one-letter code
                 stands for a value put between its two fragments: i task id, n task name,
                 p message priority, x a token unique to the message (the nonce and the message's
                 place in the batch)
  Only a task that is not a re-send (those may still have a message waiting, which the caller
  checks) and whose id and name are plain (letters, digits, . _ : -: nothing the template's JSON
  would need to escape) is pushed; every other one is left to the caller, and so is the rest after
  a refused command (an ACL without SELECT, a full Redis).
  Defines: push_messages(out, from, to) -> (the quadruples of `out` left to the caller, as a flat
    list; how many were pushed; the refusal's text or false).
]]

local PLAIN = '^[%w%._:%-]+$'

local function push_messages(out, from, to)
  local left, pushed, err = {}, 0, false
  local selected = ARGV[from] == ''
  local nonce = ARGV[from + 11]
  local values = {}
  for j = 1, #out, 4 do
    local id, name, p = out[j], out[j + 1], out[j + 2]
    local plain = out[j + 3] == 0 and string.find(id, PLAIN) and string.find(name, PLAIN)
    if plain and not err and not selected then
      local r = redis.pcall('SELECT', ARGV[from])
      if type(r) == 'table' and r.err then err = r.err else selected = true end
    end
    local done = false
    if plain and not err then
      local mp = 3 - (tonumber(p) or 0)
      if mp < 0 then mp = 0 elseif mp > 9 then mp = 9 end
      values.i, values.n, values.p, values.x = id, name, tostring(mp), nonce .. '-' .. ((j + 3) / 4)
      local parts = {ARGV[from + 12]}
      for k = from + 13, to, 2 do
        parts[#parts + 1] = values[ARGV[k]]
        parts[#parts + 1] = ARGV[k + 1]
      end
      local r = redis.pcall('LPUSH', ARGV[from + 1 + mp], table.concat(parts))
      if type(r) == 'table' and r.err then err = r.err else done = true end
    end
    if done then
      pushed = pushed + 1
    else
      for k = j, j + 3 do left[#left + 1] = out[k] end
    end
  end
  return left, pushed, err
end
