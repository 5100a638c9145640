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
-- restore ARGV[2]: the version of the copy a replica holds; then per override: field,
--         time left in µs, record. Puts that copy back when the table is gone (Redis
--         restarted empty) or was put back from an older copy with no change made since
--         ("restored_from" below the caller's version: the newest copy wins); otherwise
--         changes nothing. Returns {now, "restored"} or {now, "kept"}.
--
-- The field "restored_from" (the version of the copy put back) lives until the next put or
-- remove: after an operator's change, no copy is put back over it (nothing cleared since
-- comes back).

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

-- Fields that are no override.
local function meta(field)
  return field == 'version' or field == 'restored_from'
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

-- A change by an operator: no older copy may be put back over it any more.
local function changed()
  redis.call('HDEL', key, 'restored_from')
  bump()
end

if op == 'fetch' then
  local version = redis.call('HGET', key, 'version') or ''
  local out = {fmt(now), version, redis.call('HGET', key, 'restored_from') or ''}
  if version == ARGV[2] then
    return out
  end
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    local e = expiry(all[i + 1])
    if not meta(all[i]) and (e == nil or e > now) then
      out[#out + 1] = all[i]
      out[#out + 1] = all[i + 1]
    end
  end
  return out
elseif op == 'put' then
  local field, record = ARGV[2], ARGV[3]
  local ttl, max = tonumber(ARGV[4]), tonumber(ARGV[5])
  if meta(field) or ttl == nil or max == nil then
    return redis.error_reply('cellrate overrides: bad put')
  end
  local all = redis.call('HGETALL', key)
  local held, replacing = 0, false
  for i = 1, #all, 2 do
    local f = all[i]
    if not meta(f) then
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
  changed()
  return {fmt(now), 'ok'}
elseif op == 'remove' then
  local field = ARGV[2]
  local v = not meta(field) and redis.call('HGET', key, field)
  if not v then
    return {fmt(now), '0'}
  end
  redis.call('HDEL', key, field)
  changed()
  local e = expiry(v)
  if e ~= nil and e > now then
    return {fmt(now), '1'}
  end
  return {fmt(now), '0'}
elseif op == 'restore' then
  local held = tonumber(ARGV[2])
  if held == nil or (#ARGV - 2) % 3 ~= 0 then
    return redis.error_reply('cellrate overrides: bad restore')
  end
  local version = redis.call('HGET', key, 'version')
  local from = tonumber(redis.call('HGET', key, 'restored_from') or '')
  if version and not (from ~= nil and from < held) then
    return {fmt(now), 'kept'}
  end
  redis.call('DEL', key)
  for i = 3, #ARGV, 3 do
    local field, left = ARGV[i], tonumber(ARGV[i + 1])
    if not meta(field) and left ~= nil and left > 0 then
      redis.call('HSET', key, field, fmt(now + left) .. ' ' .. ARGV[i + 2])
    end
  end
  redis.call('HSET', key, 'restored_from', fmt(held))
  bump()
  return {fmt(now), 'restored'}
end
return redis.error_reply('cellrate overrides: unknown operation')
