--[[ Shared include (pulled in by _common, after _records, once K_TASKS and PREFIX are defined): a task
  record's format, and the functions that read and write one.
  A record is "<state head>\n<payload>": Lua decodes only the small state head; the payload stays an
  opaque string, so user JSON is never re-encoded by cjson. The payload is the JSON {"u": url[, "m":
  meta][, "t": trace]}, or the bare URL when that is all it holds and the URL needs no JSON escaping
  (state/enqueue_args.py), an https URL without its scheme: 'https://host/p' is stored '//host/p'.
  So a payload starting with '{' is JSON, one starting with '/' is an https URL ('https:' goes back
  in front: url_host of _refetch.lua, TaskInfo.parse of records.py), any other a bare URL as it is
  (http://, or an https URL a record of an earlier release holds whole). The JSON payload keeps the
  URL whole. encode() writes a bare 'https://' payload of an earlier release in the '//' form.
  The state head is compact: the values of the fields of HEAD_FIELDS, in that fixed order (the one
  source of truth with HEAD_FIELDS of celery_ha/state/records.py; fields are only added at the end),
  joined by the byte 0x1F, an absent field empty, trailing empty fields left out. Every value is a
  string as the scripts made it, integers and timestamps (decimal ms) included. The dedup flag
  (dd '1') is folded into the state letter: a dedup task's letter is written upper-case (Q D R W C
  X) and its dd field left empty, so a freshly queued dedup task's head is 'Q<1F>1733333333333' (15
  bytes; 'q<1F>1733333333333<1F>1', 17, before the fold; the JSON head was 39). decode() gives the
  scripts the lower-case letter and dd '1' back (a head with dd '1' and a lower-case letter, as
  earlier releases wrote, reads the same): the scripts see the lower-case st.s and st.dd only, and
  none reads the letter from the raw record. A state the compact head cannot hold (a field it does
  not know; a value that is empty, not a string, or holds 0x1F or a newline, as an error text may;
  a state st.s that starts with '{' or is one of the upper-case letters) is written as the JSON
  object of string values of earlier releases, which starts with '{' (a compact head never does)
  and is read as before: records of earlier releases stay readable and are written compact at
  their next write. Fields at their default are left out: n (the task name) when it is fetch_page,
  ma and ms (max_attempts, max_stalls) when they are 3, and h (the host gate's key) when it is the
  host the bare-URL payload names as written: the compact head then starts with '~' (payload_host).
  One-letter states (st.s): q queued, d dispatched, r running, w delayed, c completed, x dead (in a
  compact head, Q D R W C X for a dedup task's).
  Timestamps in the state part (ms, Redis clock): ct created, ut last transition (for a running task:
  its claim), due (a delayed task's retry time), qt (when a waiting task became ready, kept from a
  retry's promotion or a dispatch until its claim; otherwise ut or ct say it).
  The waiting head: a record that waits for a scheduled run (state c or x with iv, _refetch.lua) is
  kept for days, so its size is what a scheduled crawl pays per URL; its head takes a second form,
  ~25 bytes where the compact head takes ~71 (encode() writes it for those states only: the hot path
  keeps the compact head and its cost). It starts with WAIT_MARK '@' (no other head does: encode()
  writes a state st.s starting with '@' or '~' as a JSON head), then the state letter (C X for a
  dedup task's, as in the compact head), then ut in base 62 (the alphabet of _base62.lua: 7
  characters hold ms until 2081), then each present field as a tag character and its value, in the
  order of WAIT_FORMS (its first row):
    ,  ct  ut - ct            ^ p   * ma   & ms   ( qt   + a   = st   ) due   ? f   | iv
    :  k   k - ct (when shorter than ut - k)       .  k   ut - k         !  iv  iv / 1000
    %  sg  16 lower-case hex digits, as two 6-character base-62 numbers (a ctx.signature's)
    ~  h   the host its bare-URL payload names (no value; as HOST_MARK)    /  h   the text
    _  sg  # n   $ w   < e   > pe   the text, up to the next 0x1F (that ends it) or the head's end
  A number (every tag but the texts') is base-62 digits up to the next tag. The second row of
  WAIT_FORMS says each tag's kind: i the integer, u ut minus it, c ct plus it, s it x 1000, x the hex,
  h the host, t the text. encode() takes the first form a value fits; a state with a value no form
  holds (an integer with a sign, a leading zero or over 15 digits, ct after ut, a text with 0x1F or a
  newline, dd other than '1', a field of a later release) is written in the compact or the JSON head
  as before. decode() gives back the same strings (decimal ms, as fmt writes them): no script sees
  the form. (A scheduled record that is queued or running keeps the compact head.)
  Defines: fmt (integers as strings), decode, load, encode, save, payload_host, and HEAD_FIELDS,
  compact_head (the compact head), WAIT_FORMS, b62_bytes, wait_encode and wait_decode (the waiting
  head). Uses rec_get and rec_set of _records.lua, IDX and CHR of _base62.lua.
]]
-- Integers as strings: ZADD scores, and the record's timestamps. Lua would format a number argument
-- of redis.call with '%.17g' and cjson with '%.14g' (slow for 13-digit milliseconds, and lossy for
-- cjson); scripts format the same `now` several times, so the last result is kept.
-- (fmt_n and fmt_s are locals of a block: a function library's main chunk holds at most 200 locals.)
local fmt
do
  local fmt_n, fmt_s
  function fmt(n)
    if n ~= fmt_n then
      fmt_n, fmt_s = n, string.format('%.0f', n)
    end
    return fmt_s
  end
end

-- The task name a record leaves out (st.n absent): decode() puts it back, encode() leaves it out.
local DEFAULT_TASK = 'fetch_page'

-- The compact state head (see the header). HEAD_FIELDS is the order, the one source of truth with
-- HEAD_FIELDS of celery_ha/state/records.py (tests/state/test_compact_head.py checks that the two
-- and the unrolled code below agree); fields are only ever added at the end. The first 12 (every
-- field of a queued, dispatched, running or completed task) are read and written by unrolled code
-- (about as fast as cjson was); a state with any of the others goes through the general loops.
local HEAD_FIELDS = {'s', 'ct', 'dd', 'n', 'p', 'h', 'ma', 'ms', 'ut', 'k', 'w', 'qt', 'a', 'st', 'due',
                     'e', 'pe', 'f', 'iv', 'sg'}
local HEAD_SEP = '\31'
-- The state letter of a dedup task (dd '1'), written upper-case with the dd field left empty, and
-- back (tests/state/test_compact_head.py checks these against DEDUP_LETTERS of records.py).
local DD_UP = {q = 'Q', d = 'D', r = 'R', w = 'W', c = 'C', x = 'X'}
local DD_DOWN = {Q = 'q', D = 'd', R = 'r', W = 'w', C = 'c', X = 'x'}
-- The first 12 fields, the rest of the head, and where the head ends. One literal, so no pattern is
-- built at each call: ('([^\31\n]*)\31?' x 12) .. '([^\n]*)()'.
local HEAD_HOT = '^([^\31\n]*)\31?([^\31\n]*)\31?([^\31\n]*)\31?([^\31\n]*)\31?([^\31\n]*)\31?([^\31\n]*)\31?([^\31\n]*)\31?([^\31\n]*)\31?([^\31\n]*)\31?([^\31\n]*)\31?([^\31\n]*)\31?([^\31\n]*)\31?([^\n]*)()'
local head_pos -- field -> position, built at the first need (the general ways only)
local function head_position(key)
  if not head_pos then
    head_pos = {}
    for j, name in ipairs(HEAD_FIELDS) do head_pos[name] = j end
  end
  return head_pos[key]
end
-- States that encode() must not take the unrolled way: decoded from a JSON head with a field the
-- compact head does not know or a value it cannot hold, or from a compact head with positions past
-- HEAD_FIELDS (a later release's).
local head_odd
--#per-call
head_odd = {}
--#end-per-call

-- Fields 13 on of a compact head (`rest`: their values, HEAD_SEP-separated) into `st`.
local function head_rest(st, rest)
  local j, from, len = 13, 1, #rest
  while from <= len do
    local to = string.find(rest, HEAD_SEP, from, true) or len + 1
    if to > from then
      local key = HEAD_FIELDS[j]
      if not key then
        key = j
        head_odd[st] = true
      end
      st[key] = string.sub(rest, from, to - 1)
    end
    j = j + 1
    from = to + 1
  end
end

-- A stored record -> (state table, payload string). A head starting with '{' is the JSON object of
-- earlier releases (or of a state the compact head cannot hold); any other is the compact head.
-- The host a bare-URL payload names: what follows '//' up to the path, query or fragment, as
-- written ('//host/p', the https form, or 'scheme://host/p'); nil for a JSON payload. A record whose
-- host key is exactly that leaves it out and starts with HOST_MARK instead (encode, decode): the
-- host gate's key is the URL's host for most tasks, ~20 bytes a record. records.py's payload_host
-- reads the same text the same way.
local HOST_MARK = 126 -- '~'
local function payload_host(payload)
  local first = string.byte(payload, 1)
  if first == 47 then return string.match(payload, '^//([^/?#]*)') end
  if first == 123 then return nil end
  return string.match(payload, '^%a[%w+.-]*://([^/?#]*)')
end

-- The waiting head's forms (see the header): three rows of 21, the tags in the order wait_encode writes
-- them (a field's forms next to each other, the first tried first) at 1-21, each one's kind at 23-43,
-- its field as a position in HEAD_FIELDS ('A' + position - 1) at 45-65. wait_head.py has the same
-- (tests/state/test_compact_head.py checks it). The head starts with WAIT_MARK, '@'.
local WAIT_FORMS = ',^*&:.(+=)?!|%_~/#$<> uiiicuiiiiisixthttttt BEGHJJLMNORSSTTFFDKPQ'

-- The base-62 digits (ALPHA of _base62.lua) of a non-negative integer below 2^53, as byte values, the
-- least significant first: string.reverse(string.char(b62_bytes(x))) is its text (no table: twice as
-- fast as one).
local function b62_bytes(x)
  if x < 62 then return CHR[x] end
  local d = x % 62
  return CHR[d], b62_bytes((x - d) / 62)
end

-- The waiting head of `st` (a state c or x with iv, st.n left out at its default), or nil when a value
-- fits none of its forms.
local function wait_encode(st, payload)
  if head_odd[st] then return nil end
  local letter, dd, ut = st.s, st.dd, st.ut
  if dd then
    if dd ~= '1' then return nil end
    letter = DD_UP[letter]
  end
  -- An integer as fmt writes it (no sign, no leading zero, at most 15 digits: exact in a double).
  local utn = type(ut) == 'string' and (ut == '0' or #ut <= 15 and string.find(ut, '^[1-9]%d*$'))
    and tonumber(ut)
  if not utn then return nil end
  local kinds, pos = {string.byte(WAIT_FORMS, 23, 43)}, {string.byte(WAIT_FORMS, 45, 65)}
  local out, o, count, open = {'@', letter, string.reverse(string.char(b62_bytes(utn)))}, 3, dd and 3 or 2,
    false
  local ctn
  local j = 1
  while j <= 21 do
    local at = pos[j]
    local e = j
    while pos[e + 1] == at do e = e + 1 end
    local field = HEAD_FIELDS[at - 64]
    local v = st[field]
    if v ~= nil then
      if type(v) ~= 'string' or v == '' then return nil end
      local enc, tag
      for m = j, e do
        local kind = kinds[m]
        if kind == 116 then -- t: the text
          if not string.find(v, '[\31\n]') then enc = v end
        elseif kind == 104 then -- h: the payload's host
          if v == payload_host(payload) then enc = '' end
        elseif kind == 120 then -- x: 16 lower-case hex digits, as two 6-digit halves
          if #v == 16 and not string.find(v, '[^0-9a-f]') then
            local hi = string.reverse(string.char(b62_bytes(tonumber(string.sub(v, 1, 8), 16))))
            local lo = string.reverse(string.char(b62_bytes(tonumber(string.sub(v, 9), 16))))
            enc = string.rep('0', 6 - #hi) .. hi .. string.rep('0', 6 - #lo) .. lo
          end
        else
          local x = (v == '0' or #v <= 15 and string.find(v, '^[1-9]%d*$')) and tonumber(v)
          if not x then return nil end
          local n
          if kind == 105 then n = x -- i
          elseif kind == 117 then -- u: ut minus it
            if x <= utn then n = utn - x end
          elseif kind == 99 then -- c: ct plus it, when shorter than ut minus it
            if ctn and x >= ctn and (x > utn or x - ctn < utn - x) then n = x - ctn end
          elseif x % 1000 == 0 then n = x / 1000 -- s
          end
          if n then enc = string.reverse(string.char(b62_bytes(n))) end
          if field == 'ct' then ctn = x end
        end
        if enc then
          tag = m
          break
        end
      end
      if not enc then return nil end
      if open then
        o = o + 1
        out[o] = HEAD_SEP -- a text ends at the next 0x1F
      end
      out[o + 1], out[o + 2], o = string.sub(WAIT_FORMS, tag, tag), enc, o + 2
      open = kinds[tag] == 116
      count = count + 1
    end
    j = e + 1
  end
  for _ in pairs(st) do count = count - 1 end
  if count ~= 0 then return nil end -- a field the waiting head does not know
  return table.concat(out, '', 1, o)
end

-- The state and payload of a record whose head (ending at nl) is a waiting head. Its first number
-- (ut) has no tag. The head's bytes are read at once, and base-62 digits by their ranges (0-9 A-Z
-- a-z: ALPHA of _base62.lua), which a tag is in none of: ~30% faster than a byte and an IDX look-up
-- each.
local function wait_decode(raw, nl)
  local st, s = {n = DEFAULT_TASK}, string.sub(raw, 2, 2)
  local low = DD_DOWN[s]
  if low then s, st.dd = low, '1' end
  st.s = s
  local b = {string.byte(raw, 1, nl)}
  local pos, utn, ctn, host = 3, nil, nil, false
  while pos < nl do
    local field, kind = 'ut', 105
    if utn then
      local tag = string.find(WAIT_FORMS, string.sub(raw, pos, pos), 1, true)
      if not tag or tag > 21 then
        error('celery-ha: a waiting record head with an unknown tag: ' .. string.sub(raw, 1, nl - 1))
      end
      field, kind = HEAD_FIELDS[string.byte(WAIT_FORMS, 44 + tag) - 64], string.byte(WAIT_FORMS, 22 + tag)
      pos = pos + 1
    end
    if kind == 116 then -- t: the text
      local to = string.find(raw, HEAD_SEP, pos, true)
      if not to or to > nl then to = nl end
      st[field] = string.sub(raw, pos, to - 1)
      pos = to < nl and to + 1 or nl
    elseif kind == 104 then -- h: the payload's host
      host = true
    elseif kind == 120 then -- x: two 6-digit halves of 16 hex digits
      local hi, lo = 0, 0
      for p = pos, pos + 5 do hi = hi * 62 + IDX[b[p]] end
      for p = pos + 6, pos + 11 do lo = lo * 62 + IDX[b[p]] end
      st[field], pos = string.format('%08x%08x', hi, lo), pos + 12
    else -- a number: its base-62 digits, up to the next tag (or the newline)
      local x = 0
      while true do
        local c = b[pos]
        if c >= 97 then
          if c > 122 then break end
          x = x * 62 + c - 61
        elseif c >= 65 then
          if c > 90 then break end
          x = x * 62 + c - 55
        elseif c >= 48 and c <= 57 then
          x = x * 62 + c - 48
        else
          break
        end
        pos = pos + 1
      end
      if not utn then utn = x
      elseif kind == 117 then x = utn - x
      elseif kind == 99 then x = ctn + x
      elseif kind == 115 then x = x * 1000 end
      if field == 'ct' then ctn = x end
      st[field] = fmt(x)
    end
  end
  local payload = string.sub(raw, nl + 1)
  if host then st.h = payload_host(payload) end
  return st, payload
end

local function decode(raw)
  local st, nl
  local first = string.byte(raw, 1)
  if first == 123 then
    nl = string.find(raw, '\n', 1, true)
    st = cjson.decode(string.sub(raw, 1, nl - 1))
    for key, v in pairs(st) do
      if not head_position(key) or type(v) ~= 'string' or v == '' or string.find(v, '[\31\n]')
          or key == 's' and (string.find(v, '^[{@~]') or DD_DOWN[v]) then
        head_odd[st] = true
        break
      end
    end
    if not st.n then st.n = DEFAULT_TASK end
  elseif first == 64 then -- '@', a waiting head's WAIT_MARK
    return wait_decode(raw, string.find(raw, '\n', 1, true))
  else
    local s, ct, dd, n, p, h, ma, ms, ut, k, w, qt, rest
    local marked = first == HOST_MARK
    s, ct, dd, n, p, h, ma, ms, ut, k, w, qt, rest, nl = string.match(raw, HEAD_HOT, marked and 2 or 1)
    local low = DD_DOWN[s]
    if low then s, dd = low, '1' end -- a dedup task's letter (the dd field of earlier heads: as is)
    st = {s = s ~= '' and s or nil, ct = ct ~= '' and ct or nil, dd = dd ~= '' and dd or nil,
          n = n ~= '' and n or DEFAULT_TASK, p = p ~= '' and p or nil, h = h ~= '' and h or nil,
          ma = ma ~= '' and ma or nil, ms = ms ~= '' and ms or nil, ut = ut ~= '' and ut or nil,
          k = k ~= '' and k or nil, w = w ~= '' and w or nil, qt = qt ~= '' and qt or nil}
    if rest ~= '' then head_rest(st, rest) end
    if marked then
      local payload = string.sub(raw, nl + 1)
      st.h = payload_host(payload)
      return st, payload
    end
  end
  return st, string.sub(raw, nl + 1)
end

local function load(id)
  local raw = rec_get(id)
  if not raw then return nil, nil end
  return decode(raw)
end

-- The compact head of any state, or nil when it cannot say it (a field it does not know, a value
-- that is not a non-empty string or holds HEAD_SEP or a newline, a state starting with '{', '@' or '~').
local function compact_head(st)
  local vals, last = {}, 0
  for key, v in pairs(st) do
    local j = head_position(key) or (type(key) == 'number' and key > #HEAD_FIELDS and key % 1 == 0 and key)
    if not j or type(v) ~= 'string' or v == '' or string.find(v, '[\31\n]') then return nil end
    vals[j] = v
    if j > last then last = j end
  end
  local s = vals[1]
  -- A head starting with '{' would read as a JSON head, '@' as a waiting head, '~' as one whose host is
  -- its payload's, an upper-case letter as a dedup task's.
  if s and (string.find(s, '^[{@~]') or DD_DOWN[s]) then return nil end
  if vals[3] == '1' and DD_UP[s] then -- the dedup flag goes into the state letter
    vals[1], vals[3] = DD_UP[s], nil
    while last > 0 and not vals[last] do last = last - 1 end
  end
  for j = 1, last do
    if not vals[j] then vals[j] = '' end
  end
  return table.concat(vals, HEAD_SEP, 1, last)
end

-- The record of (st, payload): the compact head when it can hold the state, else the JSON head. The
-- common states (fields 1-12 only) take the unrolled way, which looks for HEAD_SEP and newlines
-- only in the free-text values (n, h, w): the others are made by the scripts (states, counters,
-- validated priorities and limits, times from fmt), or come from a JSON head whose odd values
-- decode() marked in head_odd.
local function encode(st, payload)
  if string.byte(payload, 1) == 104 and string.sub(payload, 1, 8) == 'https://' then
    payload = string.sub(payload, 7) -- the scheme-relative form (see the header)
  end
  local s, ct, dd, name, p, h, ma, ms = st.s, st.ct, st.dd, st.n, st.p, st.h, st.ma, st.ms
  local ut, k, w, qt = st.ut, st.k, st.w, st.qt
  local n = name ~= DEFAULT_TASK and name or nil
  if head_odd[st] or st.a or st.st or st.due or st.e or st.pe or st.f or st.iv or st.sg
      or n and (n == '' or string.find(n, '[\31\n]')) or h and (h == '' or string.find(h, '[\31\n]'))
      or w and (w == '' or string.find(w, '[\31\n]')) or s == '' or ct == '' or dd == '' or p == ''
      or ma == '' or ms == '' or ut == '' or k == '' or qt == '' or DD_DOWN[s] then
    st.n = n
    local head = st.iv and (s == 'c' or s == 'x') and wait_encode(st, payload) or compact_head(st)
      or cjson.encode(st)
    st.n = name
    return head .. '\n' .. payload
  end
  if dd == '1' and DD_UP[s] then s, dd = DD_UP[s], nil end -- the dedup flag in the state letter
  local mark = ''
  if h and h == payload_host(payload) then mark, h = '~', nil end -- the URL's own host (HOST_MARK)
  local last = qt and 12 or w and 11 or k and 10 or ut and 9 or ms and 8 or ma and 7 or h and 6
    or p and 5 or n and 4 or dd and 3 or ct and 2 or 1
  local head = (s or '') .. '\31' .. (ct or '') .. '\31' .. (dd or '') .. '\31' .. (n or '') .. '\31'
    .. (p or '') .. '\31' .. (h or '') .. '\31' .. (ma or '') .. '\31' .. (ms or '') .. '\31' .. (ut or '')
    .. '\31' .. (k or '') .. '\31' .. (w or '') .. '\31' .. (qt or '')
  return mark .. string.sub(head, 1, #head - 12 + last) .. '\n' .. payload
end

-- Write a record back; returns it (a lease's reply carries it without encoding it twice).
local function save(id, st, payload)
  local rec = encode(st, payload)
  rec_set(id, rec)
  return rec
end
