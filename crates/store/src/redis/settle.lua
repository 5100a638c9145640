-- cellrate: Checks kept for Settle, shared by every replica (one slot: every key is tagged
-- {settle}, so each call is atomic in Redis Cluster too).
--
-- KEYS[1]: the index, a sorted set of record keys by expiry (ms of Redis TIME): the
--          records that may be pushed out (every record but the live holds).
-- KEYS[2]: the record of one request id, a hash that expires with its window:
--          s  its state: "p" pending (its Check is being decided), "d" decided, "s" settled
--          c  the Check, o when it was opened, t when it was decided (µs of Redis TIME)
--          f  what the Check spent (once decided), k the costs it was settled at (settled;
--             "" when it was claimed at its due, for its release)
--          u  a hold's due (ms of Redis TIME)
--          q  the queue of anonymous holds (KEYS[5]) a live hold is in, which it leaves
--             when it stops being one (so a queue holds live holds only)
--          b  the names of a hold's bucket keys (digests), one a line: those its live
--             hold counts against
--          A record that is no hash (kept by an older version) is unknown to claim.
-- KEYS[3]: the live holds, a sorted set of record keys by due (ms): holds opened and not
--          settled. They are never pushed out; the key of each expires one window past
--          its due.
-- KEYS[4]: the prefix of the live holds per bucket key: KEYS[4] .. <its name> is a sorted
--          set of its live holds (the SHA-1 of each record's key: short enough for Redis to
--          keep the set compact), by when each record's key expires (ms), so that one whose
--          key expired unclaimed drops out by itself. Every site
--          that adds a record to KEYS[3] or takes it out adds or takes it here too.
-- KEYS[5]: (queue and oldest only) a queue of anonymous holds (a bucket's, taken without
--          a request id): a sorted set of record keys by when each was queued (µs), so
--          the lowest is the oldest. It expires with the latest of its records' keys.
--
-- ARGV[1]: the operation.
-- open    ARGV[2] check, ARGV[3] window in ms, ARGV[4] most records, ARGV[5] hold in ms
--         ("0": no hold), ARGV[6] most live holds per bucket key, ARGV[7..] the names of
--         the hold's bucket keys. Drops the expired from the index; unless the id is kept already,
--         refuses a hold when one of its keys has the most live holds ({"3", "0", its
--         place in ARGV[7..], from 1}), or when the live holds are the most ({"2", "0"}),
--         else pushes out the oldest records of the index while both hold the most, and
--         keeps the check pending. Returns {written, evicted}.
-- decide  ARGV[2] facts. A pending record becomes decided. Returns {"1"} if it was
--         pending, else {"0"}.
-- forget  Drops the record. Returns {"1"}.
-- claim   ARGV[2] costs. Returns {"0"} for no record, {"3"} for a pending one (unchanged),
--         {"4"} for a hold past its due (unchanged: released by "due"), {"1", check,
--         facts, opened, decided, now} for a decided one (now settled at costs), {"2",
--         costs, check, facts, opened, decided, now} for a settled one.
-- reopen  ARGV[2] facts. A settled record becomes decided again, with these facts (a hold
--         is live again). Returns {"1"}.
-- due     ARGV[2] most. Claims decided holds whose due has come (settled at ""); hands
--         out pending ones (their Check's spend not known to be made: cut short, or its
--         replica gone) with facts "" and decided = opened, for their resolution, and
--         makes them due again RESOLVE_AGAIN_MS later (until they are decided or
--         forgotten, or their key expires). Returns {now, then per claimed or handed out:
--         key, check, facts, opened, decided}.
-- queue   KEYS[2] a record: queued in KEYS[5] if it is a live hold whose key has not
--         expired. Returns {"1"}.
-- oldest  ARGV[2] costs. Claims, as claim does, the oldest decided live hold of KEYS[5]
--         (among its first QUEUE_LOOK records: a pending one, or one past its due not yet
--         claimed by due, is passed over and stays). Returns {"0"} for none,
--         else {"1", its key, check, facts, opened, decided, now}.

local index, key, holds = KEYS[1], KEYS[2], KEYS[3]
local RESOLVE_AGAIN_MS = 1000
-- Records of a queue looked at per oldest, at most.
local QUEUE_LOOK = 32
local op = ARGV[1]

local t = redis.call('TIME')
local now_us = t[1] .. string.format('%06d', tonumber(t[2]))
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- The state of record `k`, or nil when there is none (or it is no hash).
local function state_of(k)
  if redis.call('TYPE', k).ok ~= 'hash' then
    return nil
  end
  return redis.call('HGET', k, 's')
end

local function state()
  return state_of(key)
end

-- The bucket keys record `k` counts against while it is a live hold.
local function keys_of(k)
  local out = {}
  if redis.call('TYPE', k).ok == 'hash' then
    local b = redis.call('HGET', k, 'b')
    if b then
      for part in string.gmatch(b, '[^\n]+') do
        table.insert(out, part)
      end
    end
  end
  return out
end

-- Counts record `k` (a live hold) against its keys, until its key expires.
local function count(k)
  local left = redis.call('PTTL', k)
  if left <= 0 then return end
  for _, b in ipairs(keys_of(k)) do
    local z = KEYS[4] .. b
    redis.call('ZADD', z, now + left, redis.sha1hex(k))
    if redis.call('PTTL', z) < left then
      redis.call('PEXPIRE', z, left)
    end
  end
end

-- Stops counting record `k` (no longer a live hold).
local function uncount(k)
  for _, b in ipairs(keys_of(k)) do
    redis.call('ZREM', KEYS[4] .. b, redis.sha1hex(k))
  end
end

-- The place (from 1) of the first of the hold's keys with `most` live holds, if any.
local function crowded(most)
  for i = 7, #ARGV do
    local z = KEYS[4] .. ARGV[i]
    redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
    if redis.call('ZCARD', z) >= most then
      return i - 6
    end
  end
  return nil
end

-- Takes record `k` out of the queue of anonymous holds it is in (its field q), if any.
local function dequeue(k)
  if redis.call('TYPE', k).ok == 'hash' then
    local q = redis.call('HGET', k, 'q')
    if q then
      redis.call('ZREM', q, k)
      redis.call('HDEL', k, 'q')
    end
  end
end

-- Moves record `k` from the live holds to the index, by when its key expires.
local function unhold(k)
  if redis.call('ZREM', holds, k) == 1 then
    dequeue(k)
    uncount(k)
    local left = redis.call('PTTL', k)
    if left > 0 then
      redis.call('ZADD', index, now + left, k)
    end
  end
end

if op == 'open' then
  redis.call('ZREMRANGEBYSCORE', index, '-inf', now)
  if redis.call('EXISTS', key) == 1 then
    return {'0', '0'}
  end
  redis.call('ZREM', holds, key)
  local hold = tonumber(ARGV[5])
  if hold > 0 then
    local at = crowded(tonumber(ARGV[6]))
    if at then
      return {'3', '0', tostring(at)}
    end
  end
  local max = tonumber(ARGV[4])
  if redis.call('ZCARD', holds) >= max then
    return {'2', '0'}
  end
  local evicted = 0
  while redis.call('ZCARD', index) + redis.call('ZCARD', holds) >= max do
    local oldest = redis.call('ZPOPMIN', index)
    if #oldest == 0 then break end
    evicted = evicted + redis.call('DEL', oldest[1])
  end
  local window = tonumber(ARGV[3])
  redis.call('HSET', key, 's', 'p', 'c', ARGV[2], 'o', now_us)
  if hold > 0 then
    redis.call('HSET', key, 'u', now + hold)
    if #ARGV >= 7 then
      local keys = {}
      for i = 7, #ARGV do
        table.insert(keys, ARGV[i])
      end
      redis.call('HSET', key, 'b', table.concat(keys, '\n'))
    end
    redis.call('PEXPIRE', key, hold + window)
    redis.call('ZADD', holds, now + hold, key)
    count(key)
  else
    redis.call('PEXPIRE', key, window)
    redis.call('ZADD', index, now + window, key)
  end
  return {'1', tostring(evicted)}
elseif op == 'decide' then
  if state() ~= 'p' then
    return {'0'}
  end
  redis.call('HSET', key, 's', 'd', 'f', ARGV[2], 't', now_us)
  return {'1'}
elseif op == 'forget' then
  if redis.call('ZREM', holds, key) == 1 then
    dequeue(key)
    uncount(key)
  end
  redis.call('DEL', key)
  redis.call('ZREM', index, key)
  redis.call('ZREM', holds, key)
  return {'1'}
elseif op == 'claim' then
  local s = state()
  if not s then
    return {'0'}
  elseif s == 'p' then
    return {'3'}
  end
  local r = redis.call('HMGET', key, 'c', 'f', 'o', 't', 'k', 'u')
  if s == 'd' then
    if r[6] and tonumber(r[6]) <= now then
      return {'4'}
    end
    redis.call('HSET', key, 's', 's', 'k', ARGV[2])
    unhold(key)
    return {'1', r[1], r[2], r[3], r[4], now_us}
  end
  if r[5] == '' then
    return {'4'}
  end
  return {'2', r[5], r[1], r[2], r[3], r[4], now_us}
elseif op == 'reopen' then
  if state() == 's' then
    redis.call('HSET', key, 's', 'd', 'f', ARGV[2])
    redis.call('HDEL', key, 'k')
    local due = redis.call('HGET', key, 'u')
    if due and redis.call('ZREM', index, key) == 1 then
      redis.call('ZADD', holds, due, key)
      count(key)
    end
  end
  return {'1'}
elseif op == 'due' then
  local out = {now_us}
  local ready = redis.call('ZRANGEBYSCORE', holds, '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
  for _, k in ipairs(ready) do
    local s = state_of(k)
    if s == 'p' then
      redis.call('ZADD', holds, now + RESOLVE_AGAIN_MS, k)
      local r = redis.call('HMGET', k, 'c', 'o')
      table.insert(out, k)
      table.insert(out, r[1])
      table.insert(out, '')
      table.insert(out, r[2])
      table.insert(out, r[2])
    else
      unhold(k)
      redis.call('ZREM', holds, k)
    end
    if s == 'd' then
      redis.call('HSET', k, 's', 's', 'k', '')
      local r = redis.call('HMGET', k, 'c', 'f', 'o', 't')
      table.insert(out, k)
      table.insert(out, r[1])
      table.insert(out, r[2])
      table.insert(out, r[3])
      table.insert(out, r[4])
    end
  end
  return out
elseif op == 'queue' then
  -- A record whose key expired while it was still counted a live hold (until pushed out)
  -- is gone: queuing it would write a hash that never expires.
  if redis.call('ZSCORE', holds, key) and redis.call('EXISTS', key) == 1
      and not redis.call('HGET', key, 'q') then
    local q = KEYS[5]
    redis.call('HSET', key, 'q', q)
    redis.call('ZADD', q, 'NX', tonumber(now_us), key)
    local left = redis.call('PTTL', key)
    if left > redis.call('PTTL', q) then
      redis.call('PEXPIRE', q, left)
    end
  end
  return {'1'}
elseif op == 'oldest' then
  local q = KEYS[5]
  for _, k in ipairs(redis.call('ZRANGE', q, 0, QUEUE_LOOK - 1)) do
    if not redis.call('ZSCORE', holds, k) then
      redis.call('ZREM', q, k)
    elseif state_of(k) == 'd' then
      local r = redis.call('HMGET', k, 'c', 'f', 'o', 't', 'u')
      if r[5] and tonumber(r[5]) > now then
        redis.call('HSET', k, 's', 's', 'k', ARGV[2])
        unhold(k)
        redis.call('ZREM', q, k)
        return {'1', k, r[1], r[2], r[3], r[4], now_us}
      end
    end
  end
  return {'0'}
end
return redis.error_reply('unknown operation')
