-- Shard leases of one workflow name. KEYS[1] = "<ns>:{<h>.leases}".
-- :leases (hash shard -> "worker|expiry"), :workers (zset worker -> heartbeat expiry).

-- lease: heartbeat, renew this worker's shards and move toward its share of shard_count
-- over the live workers (sorted by id: the first shard_count % N get one more).
-- ARGV: op, worker, now, ttl, shard_count -> {shards held}
ops.lease = function(k, a)
  local base, worker, now, ttl, n = k[1], a[2], tonumber(a[3]), tonumber(a[4]), tonumber(a[5])
  local leases, workers = base .. ':leases', base .. ':workers'
  redis.call('ZADD', workers, now + ttl, worker)
  redis.call('ZREMRANGEBYSCORE', workers, '-inf', now)
  local live = redis.call('ZRANGE', workers, 0, -1)
  table.sort(live)
  local rank = 0
  for i, w in ipairs(live) do
    if w == worker then rank = i - 1 end
  end
  local target = math.floor(n / #live)
  if rank < n % #live then target = target + 1 end
  local owner_of = {}
  local all = redis.call('HGETALL', leases)
  for i = 1, #all, 2 do owner_of[tonumber(all[i])] = all[i + 1] end
  local mine, free = {}, {}
  for s = 0, n - 1 do
    local v = owner_of[s]
    if v then
      local sep = string.find(v, '|', 1, true)
      local w, expires = string.sub(v, 1, sep - 1), tonumber(string.sub(v, sep + 1))
      if expires <= now then
        free[#free + 1] = s
      elseif w == worker then
        mine[#mine + 1] = s
      end
    else
      free[#free + 1] = s
    end
  end
  while #mine > target do
    redis.call('HDEL', leases, table.remove(mine))
  end
  local i = 1
  while #mine < target and i <= #free do
    mine[#mine + 1] = free[i]
    i = i + 1
  end
  if #mine > 0 then
    local value = worker .. '|' .. string.format('%.3f', now + ttl)
    local args = {}
    for _, s in ipairs(mine) do
      args[#args + 1] = s
      args[#args + 1] = value
    end
    redis.call('HSET', leases, unpack(args))
  end
  return mine
end

-- release: give back every shard of this worker at once. ARGV: op, worker -> count
ops.release = function(k, a)
  local base, worker = k[1], a[2]
  local leases = base .. ':leases'
  local all = redis.call('HGETALL', leases)
  local released = 0
  for i = 1, #all, 2 do
    if string.sub(all[i + 1], 1, #worker + 1) == worker .. '|' then
      redis.call('HDEL', leases, all[i])
      released = released + 1
    end
  end
  redis.call('ZREM', base .. ':workers', worker)
  return released
end
