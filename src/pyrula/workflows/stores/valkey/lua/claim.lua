-- claim: up to `limit` queued runs of this shard for `worker`, by deficit round robin
-- over owners (least served first, oldest head breaking ties), FIFO within an owner.
-- ARGV: op, worker, now, lock_expires, limit, [owner, cap]... (flow-controlled owners may
-- take at most cap runs; cap 0 blocks the owner)
-- returns {{{run_id, name, params, owner, attempt, start_id, created_at, base_seq,
--           {journal after base_seq}}...}, owners still queued}
ops.claim = function(k, a)
  local base, worker, now, expires, limit = k[1], a[2], a[3], a[4], tonumber(a[5])
  local caps = {}
  for i = 6, #a, 2 do caps[a[i]] = tonumber(a[i + 1]) end
  local out = {}
  local active = base .. ':active'
  while #out < limit do
    local cands = redis.call('ZRANGE', active, 0, 63, 'WITHSCORES')
    local best, best_served, best_created = nil, nil, nil
    for i = 1, #cands, 2 do
      local owner, served = cands[i], tonumber(cands[i + 1])
      if best_served ~= nil and served > best_served then break end
      if caps[owner] == nil or caps[owner] > 0 then
        local head = redis.call('LINDEX', base .. ':q:' .. owner, 0)
        if head then
          local created = tonumber(redis.call('HGET', runk(base, head), 'created_at') or '0')
          if best == nil or created < best_created then
            best, best_served, best_created = owner, served, created
          end
        else
          redis.call('ZREM', active, owner)
        end
      end
    end
    if best == nil then break end
    if caps[best] ~= nil then caps[best] = caps[best] - 1 end
    local q = base .. ':q:' .. best
    local id = redis.call('LPOP', q)
    if redis.call('LLEN', q) == 0 then
      redis.call('ZREM', active, best)
    else
      redis.call('ZINCRBY', active, 1, best)
    end
    out[#out + 1] = take(base, id, worker, now, expires)
  end
  return {out, redis.call('ZCARD', active)}
end

-- claim_run: claim this one run if it is queued. ARGV: op, run_id, worker, now, expires
ops.claim_run = function(k, a)
  local base, id = k[1], a[2]
  local run = runk(base, id)
  local f = redis.call('HMGET', run, 'status', 'owner')
  if f[1] ~= 'queued' then return nil end
  dequeue(base, id, f[2])
  return take(base, id, a[3], a[4], a[5])
end
