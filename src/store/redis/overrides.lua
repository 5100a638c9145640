-- cellrate: the temporary overrides every replica applies, in one hash (one key: one
-- cluster slot, and every change atomic).
--
-- KEYS[1]: the hash. Its fields: "version", the Redis time (µs) of the last change, made
-- strictly increasing; and one field per override, "<number>:<id>", whose value is
-- "<expires µs> <record>" (the record is cellrate's JSON; this script reads only the
-- expiry). Times are microseconds of Redis TIME, ~1.8e15: exact in Lua's doubles (below
-- 2^53), printed with %.0f (tostring would print 14 significant digits).
--
-- ARGV[1]: the operation.
-- fetch   ARGV[2]: the version the caller holds. Returns {now, version} when it is the
--         current one, else {now, version, field_1, value_1, ...} of every entry not
--         expired (unreadable ones included: cellrate reports them).
-- put     ARGV[2] field, ARGV[3] record, ARGV[4] ttl in µs, ARGV[5] most overrides in
--         force. Drops the expired; writes unless the field is new and the most are in
--         force. Returns {now, "ok"} or {now, "full", held}.
-- remove  ARGV[2] field. Returns {now, "1"} when an override in force was removed, else
--         {now, "0"}.

local key = KEYS[1]
local op = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local function fmt(x)
  return string.format('%.0f', x)
end

-- The expiry of a value, or nil when it has none cellrate wrote.
local function expiry(value)
  local digits = string.match(value, '^(%d+) ')
  if digits == nil or #digits > 16 then
    return nil
  end
  return tonumber(digits)
end

local function bump()
  local v = tonumber(redis.call('HGET', key, 'version') or '') or 0
  if now > v then
    v = now
  else
    v = v + 1
  end
  redis.call('HSET', key, 'version', fmt(v))
end

if op == 'fetch' then
  local version = redis.call('HGET', key, 'version') or ''
  local out = {fmt(now), version}
  if version == ARGV[2] then
    return out
  end
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    local e = expiry(all[i + 1])
    if all[i] ~= 'version' and (e == nil or e > now) then
      out[#out + 1] = all[i]
      out[#out + 1] = all[i + 1]
    end
  end
  return out
elseif op == 'put' then
  local field, record = ARGV[2], ARGV[3]
  local ttl, max = tonumber(ARGV[4]), tonumber(ARGV[5])
  if field == 'version' or ttl == nil or max == nil then
    return redis.error_reply('cellrate overrides: bad put')
  end
  local all = redis.call('HGETALL', key)
  local held, replacing = 0, false
  for i = 1, #all, 2 do
    local f = all[i]
    if f ~= 'version' then
      local e = expiry(all[i + 1])
      if e ~= nil and e <= now then
        redis.call('HDEL', key, f)
      elseif f == field then
        replacing = true
      elseif e ~= nil then
        held = held + 1
      end
    end
  end
  if not replacing and held >= max then
    return {fmt(now), 'full', fmt(held)}
  end
  redis.call('HSET', key, field, fmt(now + ttl) .. ' ' .. record)
  bump()
  return {fmt(now), 'ok'}
elseif op == 'remove' then
  local field = ARGV[2]
  local v = field ~= 'version' and redis.call('HGET', key, field)
  if not v then
    return {fmt(now), '0'}
  end
  redis.call('HDEL', key, field)
  bump()
  local e = expiry(v)
  if e ~= nil and e > now then
    return {fmt(now), '1'}
  end
  return {fmt(now), '0'}
end
return redis.error_reply('cellrate overrides: unknown operation')
