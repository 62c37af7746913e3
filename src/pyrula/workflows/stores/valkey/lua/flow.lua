-- Flow control of one owner. KEYS[1] = "<ns>:{flow.<owner hash>}".
-- :running (zset run id or reservation -> expiry), :bucket (hash tokens, stamp).
-- The limits come from the caller (kept in <ns>:meta, another slot), so a claim first
-- reserves starts here, then claims at most that many runs of the owner on a shard, then
-- settles: reservations become the run ids claimed, the rest are returned.

local function refill(bucket, now, rate)
  local cap = math.max(1, rate)
  local b = redis.call('HMGET', bucket, 'tokens', 'stamp')
  local tokens, stamp = tonumber(b[1] or cap), tonumber(b[2] or now)
  tokens = math.min(cap, tokens + math.max(0, now - stamp) * rate)
  return tokens
end

-- flow_acquire: ARGV op, now, want, max_concurrent|'', rate|'', reservation_prefix,
--               reservation_expiry -> reserved
ops.flow_acquire = function(k, a)
  local base, now, want = k[1], tonumber(a[2]), tonumber(a[3])
  local running, bucket = base .. ':running', base .. ':bucket'
  redis.call('ZREMRANGEBYSCORE', running, '-inf', now)
  local allowed = want
  if a[4] ~= '' then
    allowed = math.min(allowed, math.max(0, tonumber(a[4]) - redis.call('ZCARD', running)))
  end
  if a[5] ~= '' then
    local tokens = refill(bucket, now, tonumber(a[5]))
    allowed = math.min(allowed, math.floor(tokens))
    redis.call('HSET', bucket, 'tokens', tokens - allowed, 'stamp', now)
  end
  for i = 1, allowed do redis.call('ZADD', running, a[7], a[6] .. ':' .. i) end
  return allowed
end

-- flow_settle: ARGV op, reservation_prefix, reserved, rate|'', lock_expiry, run id...
-- (the runs claimed take the place of reservations; unused starts are given back)
ops.flow_settle = function(k, a)
  local base, prefix, reserved = k[1], a[2], tonumber(a[3])
  local running, bucket = base .. ':running', base .. ':bucket'
  for i = 1, reserved do redis.call('ZREM', running, prefix .. ':' .. i) end
  local used = #a - 5
  for i = 6, #a do redis.call('ZADD', running, a[5], a[i]) end
  if a[4] ~= '' and reserved > used then
    local cap = math.max(1, tonumber(a[4]))
    local tokens = tonumber(redis.call('HGET', bucket, 'tokens') or cap)
    redis.call('HSET', bucket, 'tokens', math.min(cap, tokens + reserved - used))
  end
  return used
end

-- flow_done: ARGV op, run id... -> removed
ops.flow_done = function(k, a)
  local n = 0
  for i = 2, #a do n = n + redis.call('ZREM', k[1] .. ':running', a[i]) end
  return n
end

-- flow_renew: ARGV op, expiry, run id...
ops.flow_renew = function(k, a)
  for i = 3, #a do redis.call('ZADD', k[1] .. ':running', 'XX', a[2], a[i]) end
  return 1
end
