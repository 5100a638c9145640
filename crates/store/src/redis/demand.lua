-- cellrate: the demand that each replica's Envoy RLQS streams report for each limit key,
-- shared so that every replica divides a limit among all reporters, not only its own.
--
-- KEYS: one hash per limit key, `<prefix>{rlqs}:<number>:<id>` (the hash tag puts them all
-- in one cluster slot). Its fields: one per replica, "<reporters> <known> <sum> <expires ms>":
-- how many buckets report for the key to that replica, how many of them have a known
-- demand, the sum of those demands (requests per second), and when this expires (Redis
-- TIME, milliseconds: exact in Lua's doubles).
--
-- ARGV[1]: this replica's id. ARGV[2]: how long an entry lives, in milliseconds. Then three
-- values per key: reporters, known, sum (reporters 0: this replica has none any more).
-- Returns, per key, "<reporters> <known> <sum>" over every other replica's live entry, and
-- deletes the expired ones.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me, ttl = ARGV[1], tonumber(ARGV[2])
if ttl == nil or #ARGV ~= 2 + 3 * #KEYS then
  return redis.error_reply('cellrate rlqs demand: bad arguments')
end
local out = {}
for i, key in ipairs(KEYS) do
  local base = 2 + (i - 1) * 3
  local n, known, sum = ARGV[base + 1], ARGV[base + 2], ARGV[base + 3]
  if tonumber(n) ~= nil and tonumber(n) > 0 then
    redis.call('HSET', key, me, n .. ' ' .. known .. ' ' .. sum .. ' ' .. string.format('%.0f', now + ttl))
    redis.call('PEXPIRE', key, ttl)
  else
    redis.call('HDEL', key, me)
  end
  local all = redis.call('HGETALL', key)
  local rn, rk, rs = 0, 0, 0
  for j = 1, #all, 2 do
    if all[j] ~= me then
      local a, b, c, e = string.match(all[j + 1], '^(%d+) (%d+) (%S+) (%d+)$')
      local expires = tonumber(e or '')
      if expires ~= nil and expires > now and tonumber(c) ~= nil then
        rn = rn + tonumber(a)
        rk = rk + tonumber(b)
        rs = rs + tonumber(c)
      else
        redis.call('HDEL', key, all[j])
      end
    end
  end
  out[#out + 1] = string.format('%.0f %.0f %.17g', rn, rk, rs)
end
return out
