-- cellrate: one atomic call over GCRA buckets in Redis (spend, refund or reset).
--
-- Times are integer nanoseconds carried as two exact parts, seconds and nanoseconds (two
-- values, not a table: no allocation per number): Lua numbers are doubles, exact only up
-- to 2^53, and Unix nanoseconds (~1.8e18) are beyond that (and tostring would print 14
-- significant digits). Parts stay below 2^53, so every addition, subtraction and
-- comparison here is exact.
--
-- The script decides only what it must decide atomically: which buckets to write. It
-- returns `now` and the TATs it decided from, and cellrate recomputes every reported
-- number from them in Rust, with the same code as the memory store: the answers are
-- identical by construction.
--
-- ARGV[1]: "spend", "refund" or "reset".
-- ARGV[2]: now in nanoseconds, or "" to read Redis TIME (microsecond resolution).
--
-- spend: one or more batches (requests coalesced into one call), decided in order, each
--   all-or-nothing against the state the batches before it left.
--   KEYS: each item's bucket, in the order of the items (a bucket named by several items
--   is named again: its state is kept by name, so later batches decide from what earlier
--   ones wrote).
--   ARGV[3]: the number of shapes S, then per shape three values: increment (ei * cost),
--   burst offset (ei * burst), mode ("0" check_and_spend, "1" check_only, "2" spend_only,
--   "3" charge: written even when its batch is denied, into debt if need be, the TAT at
--   most two burst offsets past now). A call's items share a few shapes, whose numbers
--   are parsed once here, not per item.
--   A calendar window's shape has its period's letter after the mode digit (s m h d, o for
--   a month, y for a year; w, t, z for envoyproxy/ratelimit's fixed 7, 30 and 365 days;
--   "0o"), its cost in tokens for the increment and its count for
--   the burst offset; its bucket holds W + used, W the end of its window (UTC, on this
--   script's now), and belongs to the current window while it is at least that end.
--   A charge keeps at most twice the count used (one count of debt), or, when the count is
--   sent as "<count>/<most>" (envoyproxy/ratelimit's windows, which count every hit), at
--   most <most>: below the window's shortest length in nanoseconds, and at most 2^52, so
--   that used, and W + used in its two parts, stay exact (a cost beyond 2^53 is not
--   exact, but its sum is above <most> either way and is cut to it).
--   A window in a time zone or from an anchor day has x and four boundaries in whole
--   seconds instead of a letter ("0x<b0>,<b1>,<b2>,<b3>": the previous window's start,
--   the current one's start and end, the next one's end, placed by cellrate's zone
--   database around its own clock); W is the first boundary after this script's now,
--   and a now outside [b0, b3) is an error (no window is guessed).
--   A lease key's shape (a concurrency limit, docs/concurrency.md) has mode "4" acquire,
--   "5" release or "6" holders (a peek), its hold in nanoseconds for the increment and its
--   count for the burst offset.
--   Then the batches: per batch its item count n, then per item the index of its shape
--   (from 1), for an acquire or release followed by a colon and its lease id ("3:req-7").
--   Returns {now, then per item the TAT its batch started from, or "", or for a lease key
--   "L<held>,<before>,<after>,<expired>": whether the id held a live lease, the key's live
--   leases before the batch and after the item's write, each as "<count>,<oldest>,<latest>"
--   (Unix nanoseconds, 0 when none), and how many expired leases it dropped}. A batch with a
--   bucket whose value is no TAT is not decided (and writes nothing); its reply carries
--   that value, which cellrate reports as that batch's data error.
-- refund: KEYS the buckets (a bucket named again is refunded again, from what the item
--   before left; one refunded to full is deleted); ARGV[3...] per key the increment
--   (ei * cost), or "#<lease id>" to take back a lease (a cross-slot batch's compensation),
--   or for a calendar window its letter and the cost in tokens ("o12"), for a zoned one
--   its boundaries and the cost ("x<b0>,<b1>,<b2>,<b3>:12").
-- reset: KEYS the buckets (a lease key's value read as its latest live expiry).
--   Both return {now, tat_1, ..., tat_n}, each TAT the stored value before its item (after
--   the items before it) or "".
-- A written TAT expires when it is reached: PX is the time until it, rounded up.
--
-- Once under a token (a kept Check's spend, docs/concurrency.md "A Check cut short"): the
-- last key is the token's marker (in the batch's slot), and ARGV[1] is "once:<ttl ms>"
-- (a spend of one batch), "resolve:<ttl ms>" (sent as once is; its buckets unread) or
-- "undo:<ttl ms>" (a refund). A marker holds "void" (nothing spent, nothing will be) or
-- the reply of the spend that wrote under it, lines of text. once: a marker found is
-- answered ({"void"}, or the reply it holds) and nothing is spent; else the batch is
-- decided as a spend, and when it wrote anything its reply is kept in the marker.
-- resolve: no marker becomes "void"; answers as once does. undo: a marker holding a
-- reply becomes "void" and its buckets are refunded (as refund); any other refunds
-- nothing ({"void"}). Every marker expires after its ttl.

-- Globals are table lookups: the ones used per item are made locals.
local tonumber, string_sub, string_format, string_find = tonumber, string.sub, string.format, string.find
local KEYS, ARGV = KEYS, ARGV

local BILLION = 1000000000
-- The mode digits that change what is written, exactly those of cellrate's
-- store/redis/wire.rs (its `Action`, whose unit test reads this line); '0' is check and
-- spend.
local CHECK_ONLY, SPEND_ONLY, CHARGE = '1', '2', '3'
-- The mode digits of a lease key, those of wire.rs's `Action` too.
local ACQUIRE, RELEASE, HOLDERS = '4', '5', '6'
-- The last whole second of Unix nanoseconds in an int64 (2262): no TAT is stored past it.
local MAX_SECONDS = 9223372035

-- Seconds and nanoseconds of a decimal string of nanoseconds.
local function parse(s)
  local len = #s
  if len <= 9 then
    return 0, tonumber(s)
  end
  return tonumber(string_sub(s, 1, len - 9)), tonumber(string_sub(s, len - 8))
end

-- Whether a stored value is a TAT cellrate can read: digits that fit an int64.
local function readable(s)
  local len = #s
  if len == 0 or len > 19 or not string_find(s, '^%d+$') then
    return false
  end
  return len < 19 or s <= '9223372036854775807'
end

-- Printed as integers ('%d' casts to a C long, 64 bits here, exact below 2^53): '%.0f' and
-- Lua's own number-to-text go through glibc's arbitrary-precision float printing, which was
-- the largest single cost of a decision in Redis's profile.
local function format(s, n)
  if s == 0 then
    return string_format('%d', n)
  end
  return string_format('%d%09d', s, n)
end

local function add(as, an, bs, bn)
  local s, n = as + bs, an + bn
  if n >= BILLION then
    return s + 1, n - BILLION
  end
  return s, n
end

local function sub(as, an, bs, bn)
  local s, n = as - bs, an - bn
  if n < 0 then
    return s - 1, n + BILLION
  end
  return s, n
end

local function less(as, an, bs, bn)
  return as < bs or (as == bs and an < bn)
end

-- Milliseconds from now until t, rounded up, at least 1, as text (see format).
local function ttl_ms(ts, tn, nows, nown)
  local s, n = sub(ts, tn, nows, nown)
  local ms = s * 1000 + math.ceil(n / 1000000)
  if ms < 1 then
    ms = 1
  end
  return string_format('%d', ms)
end

-- Calendar days (UTC) as clock.rs counts them: eras of 400 years from 0000-03-01. Every
-- value stays far below 2^53, so the doubles are exact integers.
local floor = math.floor

local function civil_from_days(z)
  z = z + 719468
  local era = floor(z / 146097)
  local doe = z - era * 146097
  local yoe = floor((doe - floor(doe / 1460) + floor(doe / 36524) - floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + floor(yoe / 4) - floor(yoe / 100))
  local mp = floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then
    y = y + 1
  end
  return y, m
end

local function days_from_civil(y, m)
  if m <= 2 then
    y = y - 1
  end
  local era = floor(y / 400)
  local yoe = y - era * 400
  local mp = m > 2 and m - 3 or m + 9
  local doe = yoe * 365 + floor(yoe / 4) - floor(yoe / 100) + floor((153 * mp + 2) / 5)
  return era * 146097 + doe - 719468
end

-- A zoned window's boundaries, from their text ("<b0>,<b1>,<b2>,<b3>").
local function zoned(text)
  local b, i = {}, 0
  for v in string.gmatch(text, '%d+') do
    i = i + 1
    b[i] = tonumber(v)
  end
  if i ~= 4 then
    error({err = 'cellrate: a zoned window needs four boundaries'})
  end
  return b
end

-- The calendar letters, exactly those of cellrate's store/redis/wire.rs (its `LETTERS`,
-- whose unit test reads these two lines): spans fixed since the epoch, in seconds, and the
-- UTC month and year.
local FIXED = { s = 1, m = 60, h = 3600, d = 86400, w = 604800, t = 2592000, z = 31536000 }
local MONTH, YEAR = 'o', 'y'

-- The end, in whole seconds, of the calendar window of letter `cal` (or of a zoned
-- window's boundaries) that holds now.
local function window_end(cal, nows)
  if type(cal) == 'table' then
    if nows >= cal[1] then
      for i = 2, 4 do
        if nows < cal[i] then
          return cal[i]
        end
      end
    end
    error({err = 'cellrate: the Redis clock is over a zoned window away from cellrate\'s'})
  end
  local len = FIXED[cal]
  if len then
    return (floor(nows / len) + 1) * len
  end
  if cal ~= MONTH and cal ~= YEAR then
    error({err = 'cellrate: unknown calendar letter ' .. tostring(cal)})
  end
  local y, m = civil_from_days(floor(nows / 86400))
  if cal == YEAR or m == 12 then
    return days_from_civil(y + 1, 1) * 86400
  end
  return days_from_civil(y, m + 1) * 86400
end

-- Tokens a calendar bucket (cs, cn: nil when none) has used in the window ending at ws.
local function window_used(cs, cn, ws)
  if cs and not less(cs, cn, ws, 0) then
    local us, un = sub(cs, cn, ws, 0)
    return us * BILLION + un
  end
  return 0
end

-- W + used as seconds and nanoseconds.
local function window_value(ws, used)
  return add(ws, 0, floor(used / BILLION), used % BILLION)
end

local op = ARGV[1]
-- Under a token (see above): its marker and ttl, the marker out of KEYS.
local marker, marker_ttl
if op ~= 'spend' and op ~= 'refund' and op ~= 'reset' then
  local colon = string_find(op, ':', 1, true)
  if colon then
    marker, marker_ttl, op = KEYS[#KEYS], string_sub(op, colon + 1), string_sub(op, 1, colon - 1)
    KEYS = {unpack(KEYS, 1, #KEYS - 1)}
    local found = redis.call('GET', marker)
    if op == 'undo' then
      if not found or found == 'void' then
        if not found then
          redis.call('SET', marker, 'void', 'PX', marker_ttl)
        end
        return {'void'}
      end
      redis.call('SET', marker, 'void', 'PX', marker_ttl)
      op = 'refund'
    elseif found then
      if found == 'void' then
        return {'void'}
      end
      local reply = {}
      for line in string.gmatch(found, '([^\n]*)\n') do
        reply[#reply + 1] = line
      end
      return reply
    elseif op == 'resolve' then
      redis.call('SET', marker, 'void', 'PX', marker_ttl)
      return {'void'}
    elseif op == 'once' then
      op = 'spend'
    else
      return redis.error_reply('cellrate: unknown op ' .. tostring(ARGV[1]))
    end
  end
end
local nows, nown
if ARGV[2] == '' then
  local time = redis.call('TIME')
  nows, nown = tonumber(time[1]), tonumber(time[2]) * 1000
else
  nows, nown = parse(ARGV[2])
end

-- Leases of a concurrency limit: one sorted set per key, a lease's member its id (as given:
-- printable, 0x21-0x7e) and its score its expiry in nanoseconds after the key's base, a
-- whole second kept as the member ' <seconds>' at score -inf (no id starts with a space).
-- Scores so stay exact integers below 2^53 (Unix nanoseconds are not): the base moves to
-- now, and every score with it, once it is REBASE seconds old; a key whose base is older
-- than REBASE plus the longest hold (a day) holds no live lease. A lease is live while now
-- < its expiry; a key keeps its base member only while it holds a lease, and expires (PX)
-- with its latest lease.
local REBASE, LONGEST_HOLD = 2097152, 86400

-- The key's base in seconds and now after it in nanoseconds, after dropping its expired
-- leases (nil when it holds none: the key is gone), and how many it dropped.
local function lease_open(k)
  local first = redis.call('ZRANGE', k, 0, 0)[1]
  if not first then
    return nil, nil, 0
  end
  local base = string_sub(first, 1, 1) == ' ' and tonumber(string_sub(first, 2))
  if not base then
    error({err = 'cellrate: lease key ' .. k .. ' has no base; reset it'})
  end
  local age = nows - base
  if age > REBASE + LONGEST_HOLD + 1 then
    local dropped = redis.call('ZCARD', k) - 1
    redis.call('DEL', k)
    return nil, nil, dropped
  end
  local rel = age * BILLION + nown
  local dropped = redis.call('ZREMRANGEBYSCORE', k, '(-inf', rel)
  if redis.call('ZCARD', k) <= 1 then
    redis.call('DEL', k)
    return nil, nil, dropped
  end
  if age > REBASE then
    local live = redis.call('ZRANGE', k, 1, -1, 'WITHSCORES')
    redis.call('ZREM', k, first)
    redis.call('ZADD', k, '-inf', ' ' .. string_format('%d', nows))
    for i = 1, #live, 2 do
      redis.call('ZADD', k, tonumber(live[i + 1]) - age * BILLION, live[i])
    end
    base, rel = nows, nown
  end
  return base, rel, dropped
end

-- A score after `base` as Unix nanoseconds (text).
local function lease_time(base, score)
  local v = tonumber(score)
  local s = floor(v / BILLION)
  return format(base + s, v - s * BILLION)
end

-- The key's live leases (after lease_open) as "<count>,<oldest>,<latest>"; with `expire`,
-- the key is set to expire with its latest lease (and deleted when it holds none).
local function lease_summary(k, base, rel, expire)
  if not base then
    return '0,0,0', 0
  end
  local n = redis.call('ZCARD', k) - 1
  if n <= 0 then
    redis.call('DEL', k)
    return '0,0,0', 0
  end
  local lo = redis.call('ZRANGE', k, 1, 1, 'WITHSCORES')[2]
  local hi = redis.call('ZRANGE', k, -1, -1, 'WITHSCORES')[2]
  if expire then
    local ms = math.ceil((tonumber(hi) - rel) / 1000000)
    redis.call('PEXPIRE', k, string_format('%d', ms < 1 and 1 or ms))
  end
  return string_format('%d', n) .. ',' .. lease_time(base, lo) .. ',' .. lease_time(base, hi), n
end

-- A lease item's decision against its key as it stands: the key's base and now after it,
-- whether `id` holds a live lease, the key's summary and count. `ok`: an acquire may take
-- (or already holds) its lease, a release frees one.
local function lease_decide(k, mode, count, id)
  local base, rel, dropped = lease_open(k)
  local held = base ~= nil and id ~= nil and redis.call('ZSCORE', k, id) ~= false
  local before, n = lease_summary(k, base, rel, false)
  local ok
  if mode == ACQUIRE then
    ok = held or n < count
  else
    ok = held
  end
  return {base = base, rel = rel, held = held, before = before, ok = ok, dropped = dropped}
end

-- Applies a decided lease item: an acquire when its batch is allowed, a release whatever
-- the batch decides (neither when it cannot be decided); returns its reply.
local leases_wrote = false
local function lease_write(k, mode, hold, id, d, decidable, allowed)
  local wrote = false
  if not decidable then
    wrote = false
  elseif mode == ACQUIRE and allowed and d.ok and not d.held then
    if not d.base then
      d.base, d.rel = nows, nown
      redis.call('ZADD', k, '-inf', ' ' .. string_format('%d', nows))
    end
    redis.call('ZADD', k, d.rel + hold, id)
    wrote = true
  elseif mode == RELEASE and d.held then
    redis.call('ZREM', k, id)
    wrote = true
  end
  local after = d.before
  if wrote then
    leases_wrote = true
    after = lease_summary(k, d.base, d.rel, true)
  end
  local reply = 'L' .. (d.held and '1,' or '0,') .. d.before .. ',' .. after
  return reply .. ',' .. string_format('%d', d.dropped)
end

if op == 'spend' then
  -- By key name: its current TAT (seconds, nanoseconds) when readable, and its text: as
  -- stored ('' when absent), or as written by an earlier batch (nil until a later batch or
  -- the final SET needs it).
  local curs, curn, text, dirty = {}, {}, {}, {}
  -- One MGET, not a GET per key: every command a script runs has a fixed cost in Redis.
  local stored = redis.call('MGET', unpack(KEYS))
  for g = 1, #KEYS do
    local k = KEYS[g]
    if text[k] == nil then
      local v = stored[g]
      if v then
        text[k] = v
        if readable(v) then
          curs[k], curn[k] = parse(v)
        end
      else
        text[k] = ''
      end
    end
  end
  -- The shapes: per shape its mode digit, calendar letter (nil for GCRA), whether it
  -- spends anything, and its numbers (GCRA: increment and burst offset as two parts;
  -- calendar: cost and count in tokens).
  local shapes = tonumber(ARGV[3])
  local smode, scal, szero, sis, sin, sbs, sbn, smost = {}, {}, {}, {}, {}, {}, {}, {}
  for j = 1, shapes do
    local p = 1 + 3 * j
    local mode = ARGV[p + 2]
    if mode == ACQUIRE or mode == RELEASE or mode == HOLDERS then
      -- A lease key: the hold and the count.
      sis[j], sbs[j] = tonumber(ARGV[p]), tonumber(ARGV[p + 1])
    elseif #mode > 1 then
      scal[j] = string_sub(mode, 2, 2)
      if scal[j] == 'x' then
        scal[j] = zoned(string_sub(mode, 3))
      end
      mode = string_sub(mode, 1, 1)
      -- The count, or "<count>/<most used>" (see above); by default twice the count.
      local count = ARGV[p + 1]
      local slash = string_find(count, '/', 1, true)
      if slash then
        sbs[j], smost[j] = tonumber(string_sub(count, 1, slash - 1)), tonumber(string_sub(count, slash + 1))
      else
        sbs[j] = tonumber(count)
        smost[j] = 2 * sbs[j]
      end
      sis[j] = tonumber(ARGV[p])
    else
      sis[j], sin[j] = parse(ARGV[p])
      sbs[j], sbn[j] = parse(ARGV[p + 1])
    end
    smode[j], szero[j] = mode, ARGV[p] == '0'
  end
  local out, o = {''}, 1
  local news, newn, oks = {}, {}, {}
  -- Per item of the batch: its shape, its lease id, and a lease item's decision.
  local js, ids, leases = {}, {}, {}
  local at, first = 4 + 3 * shapes, 0
  while at <= #ARGV do
    local n = tonumber(ARGV[at])
    at = at + 1
    -- Decide every item against the state before this batch; write only if every counting
    -- item (not spend_only) is allowed, and then only allowed items that spend something;
    -- charges are written whatever the batch decides (unless it cannot be decided).
    local allowed, decidable = true, true
    for i = 1, n do
      local k, arg = KEYS[first + i], ARGV[at + i - 1]
      local j = tonumber(arg)
      ids[i] = nil
      if not j then
        local colon = string_find(arg, ':', 1, true)
        j, ids[i] = tonumber(string_sub(arg, 1, colon - 1)), string_sub(arg, colon + 1)
      end
      js[i] = j
      local lmode = smode[j]
      if lmode == ACQUIRE or lmode == RELEASE or lmode == HOLDERS then
        -- A lease key: decided against the key as it stands; its reply after the writes.
        local d = lease_decide(k, lmode, sbs[j], ids[i])
        leases[i] = d
        o = o + 1
        d.out = o
        if lmode == ACQUIRE and not d.ok then
          allowed = false
        end
      else
        leases[i] = nil
        if text[k] == nil then
          text[k] = format(curs[k], curn[k])
        end
        o = o + 1
        out[o] = text[k]
        if text[k] ~= '' and not curs[k] then
          -- No TAT: the batch is not decided (and its stale oks are never read).
          allowed, decidable = false, false
        else
          local mode, cal = smode[j], scal[j]
          local ns, nn, ok
          if cal then
            -- A calendar window: at most count per window; a charge's use at most the
            -- shape's most used (twice the count, or the window's room).
            local ws = window_end(cal, nows)
            local used = window_used(curs[k], curn[k], ws)
            local count = sbs[j]
            local after = used + sis[j]
            ok = after <= count
            if not ok then
              if after > smost[j] then
                after = smost[j]
              end
              if after < used then
                after = used
              end
            end
            ns, nn = window_value(ws, after)
            ok = ok and ns < MAX_SECONDS
          else
            local ts, tn = nows, nown
            if curs[k] and less(nows, nown, curs[k], curn[k]) then
              ts, tn = curs[k], curn[k]
            end
            local bs, bn = sbs[j], sbn[j]
            ns, nn = add(ts, tn, sis[j], sin[j])
            local ls, ln = sub(ns, nn, bs, bn)
            ok = not less(nows, nown, ls, ln) and ns < MAX_SECONDS
            if not ok and mode == CHARGE then
              -- A charge that does not fit goes into debt, at most one burst deep, never back.
              local cs, cn = add(nows, nown, bs, bn)
              cs, cn = add(cs, cn, bs, bn)
              if less(cs, cn, ns, nn) then
                ns, nn = cs, cn
              end
              if less(ns, nn, ts, tn) then
                ns, nn = ts, tn
              end
            end
          end
          news[i], newn[i], oks[i] = ns, nn, ok
          if not ok and mode ~= SPEND_ONLY then
            allowed = false
          end
        end
      end
    end
    for i = 1, n do
      local d = leases[i]
      if d then
        local j = js[i]
        local k = KEYS[first + i]
        out[d.out] = lease_write(k, smode[j], sis[j], ids[i], d, decidable, allowed)
      end
    end
    if decidable then
      for i = 1, n do
        local j = js[i]
        local mode = smode[j]
        local write
        if leases[i] then
          write = false
        elseif mode == CHARGE then
          write = not szero[j] and news[i] < MAX_SECONDS
        else
          write = allowed and oks[i] and mode ~= CHECK_ONLY and not szero[j]
        end
        if write then
          local k = KEYS[first + i]
          curs[k], curn[k], text[k] = news[i], newn[i], nil
          dirty[k] = true
        end
      end
    end
    at, first = at + n, first + n
  end
  local wrote = leases_wrote
  for k in pairs(dirty) do
    local v = text[k] or format(curs[k], curn[k])
    redis.call('SET', k, v, 'PX', ttl_ms(curs[k], curn[k], nows, nown))
    wrote = true
  end
  out[1] = format(nows, nown)
  if marker and wrote then
    -- Each line ended by a newline (a reply's values hold none: digits, or a lease's).
    redis.call('SET', marker, table.concat(out, '\n') .. '\n', 'PX', marker_ttl)
  end
  return out
end

-- Each item from what the items before it left: a bucket named twice is refunded (or
-- reset) twice, as the memory store does, not once with the last write winning. `cur` is
-- by key name the value so far (false once deleted); `tats` per item the value it found.
local n = #KEYS
local tats, cur = {}, {}
local function found(i)
  local k = KEYS[i]
  if cur[k] == nil then
    cur[k] = redis.call('GET', k)
  end
  tats[i] = cur[k]
  return k
end

if op == 'refund' then
  -- Never fuller than full, never a new bucket; a bucket refunded to full is deleted.
  for i = 1, n do
    local arg = ARGV[2 + i]
    local cal = string_sub(arg, 1, 1)
    local k = KEYS[i]
    if cal == '#' then
      -- A lease taken back (a compensation), its key dropped when it holds no other.
      redis.call('ZREM', k, string_sub(arg, 2))
      if redis.call('ZCARD', k) <= 1 then
        redis.call('DEL', k)
      end
    else
      found(i)
    end
    if cal == '#' then
      -- Done above.
    elseif tats[i] and string_find(cal, '%a') then
      -- A calendar window: tokens back to the current window, never below none used.
      local back
      if cal == 'x' then
        local colon = string_find(arg, ':', 1, true) or #arg + 1
        cal, back = zoned(string_sub(arg, 2, colon - 1)), tonumber(string_sub(arg, colon + 1))
      else
        back = tonumber(string_sub(arg, 2))
      end
      local ws = window_end(cal, nows)
      local cs, cn = parse(tats[i])
      local used = window_used(cs, cn, ws)
      if used > 0 then
        local left = used - back
        if left > 0 then
          local vs, vn = window_value(ws, left)
          cur[k] = format(vs, vn)
          redis.call('SET', k, cur[k], 'PX', ttl_ms(vs, vn, nows, nown))
        else
          -- None used: full, no bucket.
          cur[k] = false
          redis.call('DEL', k)
        end
      end
    elseif tats[i] then
      local ts, tn = parse(tats[i])
      if not less(ts, tn, nows, nown) then
        local ns, nn = sub(ts, tn, parse(ARGV[2 + i]))
        if less(ns, nn, nows, nown) then
          ns, nn = nows, nown
        end
        if less(ns, nn, ts, tn) then
          if less(nows, nown, ns, nn) then
            cur[k] = format(ns, nn)
            redis.call('SET', k, cur[k], 'PX', ttl_ms(ns, nn, nows, nown))
          else
            cur[k] = false
            redis.call('DEL', k)
          end
        end
      end
    end
  end
elseif op == 'reset' then
  for i = 1, n do
    local k = KEYS[i]
    if cur[k] == nil and redis.call('TYPE', k).ok == 'zset' then
      -- A lease key: read as its latest live expiry ('' when none, or unreadable), all
      -- freed at once.
      local fine, base = pcall(lease_open, k)
      cur[k] = false
      if fine and base then
        cur[k] = lease_time(base, redis.call('ZRANGE', k, -1, -1, 'WITHSCORES')[2])
      end
      redis.call('DEL', k)
    end
    found(i)
    if cur[k] then
      cur[k] = false
      redis.call('DEL', k)
    end
  end
else
  return redis.error_reply('cellrate: unknown op ' .. tostring(op))
end

local out = {format(nows, nown)}
for i = 1, n do
  out[i + 1] = tats[i] or ''
end
return out
