-- cellrate: Checks kept for Settle, shared by every replica (one slot: every key is tagged
-- {settle}, so each call is atomic in Redis Cluster too).
--
-- KEYS[1]: the index, a sorted set of record keys by expiry (ms of Redis TIME).
-- KEYS[2]: the record of one request id, a hash that expires with its window:
--          s  its state: "p" pending (its Check is being decided), "d" decided, "s" settled
--          c  the Check, o when it was opened, t when it was decided (µs of Redis TIME)
--          f  what the Check spent (once decided), k the costs it was settled at (settled)
--          A record that is no hash (kept by an older version) is unknown to claim.
--
-- ARGV[1]: the operation.
-- open    ARGV[2] check, ARGV[3] window in ms, ARGV[4] most records. Drops the expired
--         from the index; unless the id is kept already, pushes out the oldest records
--         while the index holds the most, and keeps the check pending. Returns {written,
--         evicted}.
-- decide  ARGV[2] facts. A pending record becomes decided. Returns {"1"} if it was
--         pending, else {"0"}.
-- forget  Drops the record. Returns {"1"}.
-- claim   ARGV[2] costs. Returns {"0"} for no record, {"3"} for a pending one (unchanged),
--         {"1", check, facts, opened, decided, now} for a decided one (now settled at
--         costs), {"2", costs, check, facts, opened, decided, now} for a settled one.
-- reopen  ARGV[2] facts. A settled record becomes decided again, with these facts.
--         Returns {"1"}.

local index, key = KEYS[1], KEYS[2]
local op = ARGV[1]

local t = redis.call('TIME')
local now_us = t[1] .. string.format('%06d', tonumber(t[2]))

-- The record's state, or nil when there is none (or it is no hash).
local function state()
  if redis.call('TYPE', key).ok ~= 'hash' then
    return nil
  end
  return redis.call('HGET', key, 's')
end

if op == 'open' then
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
  redis.call('HSET', key, 's', 'p', 'c', ARGV[2], 'o', now_us)
  redis.call('PEXPIRE', key, window)
  redis.call('ZADD', index, now + window, key)
  return {'1', tostring(evicted)}
elseif op == 'decide' then
  if state() ~= 'p' then
    return {'0'}
  end
  redis.call('HSET', key, 's', 'd', 'f', ARGV[2], 't', now_us)
  return {'1'}
elseif op == 'forget' then
  redis.call('DEL', key)
  redis.call('ZREM', index, key)
  return {'1'}
elseif op == 'claim' then
  local s = state()
  if not s then
    return {'0'}
  elseif s == 'p' then
    return {'3'}
  end
  local r = redis.call('HMGET', key, 'c', 'f', 'o', 't', 'k')
  if s == 'd' then
    redis.call('HSET', key, 's', 's', 'k', ARGV[2])
    return {'1', r[1], r[2], r[3], r[4], now_us}
  end
  return {'2', r[5], r[1], r[2], r[3], r[4], now_us}
elseif op == 'reopen' then
  if state() == 's' then
    redis.call('HSET', key, 's', 'd', 'f', ARGV[2])
    redis.call('HDEL', key, 'k')
  end
  return {'1'}
end
return redis.error_reply('unknown operation')
