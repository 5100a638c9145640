-- cellrate: one atomic batch over GCRA buckets in Redis (spend, refund or reset).
--
-- Times are integer nanoseconds carried as two exact parts {seconds, nanoseconds}: Lua
-- numbers are doubles, exact only up to 2^53, and Unix nanoseconds (~1.8e18) are beyond
-- that (and tostring would print 14 significant digits). Parts stay below 2^53, so every
-- addition, subtraction and comparison here is exact.
--
-- The script decides only what it must decide atomically: which buckets to write. It
-- returns `now` and every bucket's TAT as read, and cellrate recomputes every reported
-- number from them in Rust, with the same code as the memory store: the answers are
-- identical by construction.
--
-- KEYS: the buckets, each named once.
-- ARGV[1]: "spend", "refund" or "reset".
-- ARGV[2]: now in nanoseconds, or "" to read Redis TIME (microsecond resolution).
-- spend:  then per key three values: increment (ei * cost), burst offset (ei * burst),
--         mode ("0" check_and_spend, "1" check_only, "2" spend_only).
-- refund: then per key the increment (ei * cost).
-- Returns {now, tat_1, ..., tat_n}, each TAT the stored value before the call or "".
-- A written TAT expires when it is reached: PX is the time until it, rounded up.

local BILLION = 1000000000
-- The last whole second of Unix nanoseconds in an int64 (2262): no TAT is stored past it.
local MAX_SECONDS = 9223372035

local function parse(s)
  local len = #s
  if len <= 9 then
    return {0, tonumber(s)}
  end
  return {tonumber(string.sub(s, 1, len - 9)), tonumber(string.sub(s, len - 8))}
end

local function format(t)
  if t[1] == 0 then
    return string.format('%.0f', t[2])
  end
  return string.format('%.0f%09.0f', t[1], t[2])
end

local function add(a, b)
  local s, n = a[1] + b[1], a[2] + b[2]
  if n >= BILLION then
    n = n - BILLION
    s = s + 1
  end
  return {s, n}
end

local function sub(a, b)
  local s, n = a[1] - b[1], a[2] - b[2]
  if n < 0 then
    n = n + BILLION
    s = s - 1
  end
  return {s, n}
end

local function less(a, b)
  return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2])
end

local function max(a, b)
  if less(a, b) then
    return b
  end
  return a
end

-- Milliseconds from now until t, rounded up, at least 1.
local function ttl_ms(t, now)
  local d = sub(t, now)
  local ms = d[1] * 1000 + math.ceil(d[2] / 1000000)
  if ms < 1 then
    ms = 1
  end
  return ms
end

local op = ARGV[1]
local now
if ARGV[2] == '' then
  local time = redis.call('TIME')
  now = {tonumber(time[1]), tonumber(time[2]) * 1000}
else
  now = parse(ARGV[2])
end

local n = #KEYS
local tats = {}
for i = 1, n do
  tats[i] = redis.call('GET', KEYS[i])
end

if op == 'spend' then
  -- Decide every item against the current state; write only if every counting item
  -- (not spend_only) is allowed, and then only allowed items that spend something.
  local allowed = true
  local news, oks = {}, {}
  for i = 1, n do
    local at = 2 + (i - 1) * 3
    local inc, bo, mode = parse(ARGV[at + 1]), parse(ARGV[at + 2]), ARGV[at + 3]
    local t = now
    if tats[i] then
      t = max(now, parse(tats[i]))
    end
    local new = add(t, inc)
    local ok = not less(now, sub(new, bo)) and new[1] < MAX_SECONDS
    news[i], oks[i] = new, ok
    if not ok and mode ~= '2' then
      allowed = false
    end
  end
  if allowed then
    for i = 1, n do
      local at = 2 + (i - 1) * 3
      if oks[i] and ARGV[at + 3] ~= '1' and ARGV[at + 1] ~= '0' then
        redis.call('SET', KEYS[i], format(news[i]), 'PX', ttl_ms(news[i], now))
      end
    end
  end
elseif op == 'refund' then
  -- Never fuller than full, never a new bucket; a bucket refunded to full is deleted.
  for i = 1, n do
    if tats[i] then
      local tat = parse(tats[i])
      if not less(tat, now) then
        local new = max(sub(tat, parse(ARGV[2 + i])), now)
        if less(new, tat) then
          if less(now, new) then
            redis.call('SET', KEYS[i], format(new), 'PX', ttl_ms(new, now))
          else
            redis.call('DEL', KEYS[i])
          end
        end
      end
    end
  end
elseif op == 'reset' then
  for i = 1, n do
    redis.call('DEL', KEYS[i])
  end
else
  return redis.error_reply('cellrate: unknown op ' .. tostring(op))
end

local out = {format(now)}
for i = 1, n do
  out[i + 1] = tats[i] or ''
end
return out
