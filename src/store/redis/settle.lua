-- cellrate: Checks kept for Settle, shared by every replica (one slot: every key is tagged
-- {settle}, so each call is atomic in Redis Cluster too).
--
-- KEYS[1]: the index, a sorted set of record keys by expiry (ms of Redis TIME).
-- KEYS[2]: the record of one request id: "P<check>" while open, and once claimed
--          "S<8-digit length of the costs><costs><check>". Each expires with its window.
--
-- ARGV[1]: the operation.
-- open    ARGV[2] check, ARGV[3] window in ms, ARGV[4] most records. Drops the expired
--         from the index; unless the id is kept already, pushes out the oldest records
--         while the index holds the most, and keeps the check. Returns {written, evicted}.
-- forget  Drops the record. Returns {"1"}.
-- claim   ARGV[2] costs. Returns {"0"} for no record, {"1", check} when it was open (now
--         claimed at costs), {"2", costs, check} when it was claimed before.
-- unclaim Opens a claimed record again. Returns {"1"}.

local index, key = KEYS[1], KEYS[2]
local op = ARGV[1]

if op == 'open' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZREMRANGEBYSCORE', index, '-inf', now)
  if redis.call('EXISTS', key) == 1 then
    return {'0', '0'}
  end
  local max = tonumber(ARGV[4])
  local evicted = 0
  while redis.call('ZCARD', index) >= max do
    local oldest = redis.call('ZPOPMIN', index)
    if #oldest == 0 then break end
    evicted = evicted + redis.call('DEL', oldest[1])
  end
  local window = tonumber(ARGV[3])
  redis.call('SET', key, 'P' .. ARGV[2], 'PX', window)
  redis.call('ZADD', index, now + window, key)
  return {'1', tostring(evicted)}
elseif op == 'forget' then
  redis.call('DEL', key)
  redis.call('ZREM', index, key)
  return {'1'}
elseif op == 'claim' then
  local value = redis.call('GET', key)
  if not value then
    return {'0'}
  end
  if string.sub(value, 1, 1) == 'S' then
    local n = tonumber(string.sub(value, 2, 9))
    return {'2', string.sub(value, 10, 9 + n), string.sub(value, 10 + n)}
  end
  local costs = ARGV[2]
  redis.call('SET', key, 'S' .. string.format('%08d', #costs) .. costs .. string.sub(value, 2),
    'KEEPTTL')
  return {'1', string.sub(value, 2)}
elseif op == 'unclaim' then
  local value = redis.call('GET', key)
  if value and string.sub(value, 1, 1) == 'S' then
    local n = tonumber(string.sub(value, 2, 9))
    redis.call('SET', key, 'P' .. string.sub(value, 10 + n), 'KEEPTTL')
  end
  return {'1'}
end
return redis.error_reply('unknown operation')
