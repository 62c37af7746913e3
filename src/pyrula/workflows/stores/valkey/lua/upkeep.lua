-- Batched upkeep of one shard.

-- renew: ARGV op, now, lock_expires, run_id, token, run_id, token...
-- returns {{lost...}, {cancel requested...}}
ops.renew = function(k, a)
  local base, now, expires = k[1], a[2], a[3]
  local lost, cancel = {}, {}
  for i = 4, #a, 2 do
    local id, token = a[i], a[i + 1]
    local run = runk(base, id)
    local err, f = stale(run, token)
    if err then
      lost[#lost + 1] = id
    else
      redis.call('HSET', run, 'lock_expires', expires)
      zadd_new(base .. ':times', expires, id)
      if f.cancel == '1' then cancel[#cancel + 1] = id end
    end
  end
  return {lost, cancel}
end

-- wake_due: ARGV op, now, limit -> {number woken, the earliest timer left ('' if none)}
ops.wake_due = function(k, a)
  local base, now, limit = k[1], a[2], tonumber(a[3])
  local due = redis.call('ZRANGEBYSCORE', base .. ':timers', '-inf', now, 'LIMIT', 0, limit)
  local woken = 0
  for _, id in ipairs(due) do
    local run = runk(base, id)
    local f = redis.call('HMGET', run, 'status', 'owner')
    redis.call('ZREM', base .. ':timers', id)
    if f[1] == 'sleeping' or f[1] == 'waiting' then
      redis.call('RPUSH', jnlk(base, id), event('run:woken', now, {reason = 'timer'}))
      enqueue(base, id, f[2], now)
      woken = woken + 1
    end
  end
  return {woken, earliest_timer(base)}
end

-- reclaim: ARGV op, now, limit, max_retries, retry_ttl, completed_ttl
-- returns {{run_id, quarantined}...}
ops.reclaim = function(k, a)
  local base, now, limit = k[1], a[2], tonumber(a[3])
  local expired = redis.call('ZRANGEBYSCORE', base .. ':times', 0, now, 'LIMIT', 0, limit)
  local out = {}
  for _, id in ipairs(expired) do
    local run = runk(base, id)
    local f = redis.call('HMGET', run, 'status', 'lock_owner', 'attempt')
    if f[1] == 'running' then
      local detail = cjson.encode({cause = 'worker_crash', worker = f[2],
        attempt = tonumber(f[3])})
      out[#out + 1] = {id, requeue_run(base, id, now, 'orphaned', '1', a[4], a[5], detail, a[6])}
    else
      redis.call('ZREM', base .. ':times', id)
    end
  end
  return out
end

-- timer_settle: KEYS[1] = a name's timer summary. After a timer scan leased these shards'
-- entries (score = lease) and woke them: each entry becomes the shard's earliest timer
-- left, or goes if it has none; an entry a parker lowered meanwhile keeps the lower time.
-- ARGV op, lease, shard, earliest|'', shard, earliest|''... -> settled
ops.timer_settle = function(k, a)
  local summary, lease = k[1], tonumber(a[2])
  for i = 3, #a, 2 do
    local shard, earliest = a[i], a[i + 1]
    local now_at = tonumber(redis.call('ZSCORE', summary, shard) or '-1')
    if now_at == lease then
      if earliest == '' then redis.call('ZREM', summary, shard)
      else redis.call('ZADD', summary, earliest, shard) end
    elseif earliest ~= '' then
      redis.call('ZADD', summary, 'LT', earliest, shard)
    end
  end
  return (#a - 2) / 2
end

-- fail_stranded: end queued runs queued since before older_than (no live worker serves
-- their name). ARGV: op, older_than, now, limit, error_json, completed_ttl -> {run ids}
ops.fail_stranded = function(k, a)
  local base, older, now, limit, errj = k[1], tonumber(a[2]), a[3], tonumber(a[4]), a[5]
  local err = cjson.decode(errj)
  local failed = {}
  local queues = {}
  for _, owner in ipairs(redis.call('ZRANGE', base .. ':active', 0, -1)) do
    queues[#queues + 1] = {owner, base .. ':q:' .. owner}
  end
  local ranked = redis.call('HGETALL', base .. ':prio')
  for i = 1, #ranked, 2 do
    for d in string.gmatch(ranked[i + 1], '%d') do
      queues[#queues + 1] = {ranked[i], pqk(base, ranked[i], d), d}
    end
  end
  queues[#queues + 1] = {'', base .. ':suspects'}  -- dequeue finds a suspect by its id
  for _, line in ipairs(redis.call('ZRANGE', base .. ':lines', 0, -1)) do
    queues[#queues + 1] = {'', base .. ':line:' .. line, nil, line}
  end
  for _, queue in ipairs(queues) do
    local owner = queue[1]
    for _, id in ipairs(redis.call('LRANGE', queue[2], 0, -1)) do
      if #failed >= limit then return failed end
      local run = runk(base, id)
      local f = redis.call('HMGET', run, 'updated_at', 'jnl', 'idem', 'waiter', 'started_at')
      if tonumber(f[1] or '0') <= older then
        dequeue(base, id, owner, queue[3], queue[4])
        journal_push(base, id, f[2], f[5], event('run:error', now, {code = err.code,
          error_type = err.error_type, message = err.message, detail = err.detail}))
        finish_run(base, id, 'failed', now, 'null', errj, a[6], false, f[3], f[4])
        failed[#failed + 1] = id
      end
    end
  end
  return failed
end

-- requeue_unheld: requeue, counting no crash, this shard's runs whose lock a live worker
-- holds but that are not among those it knows it holds (a claim whose reply it lost).
-- ARGV: op, worker, now, completed_ttl, held_run_id...
-- returns {run_id...}
ops.requeue_unheld = function(k, a)
  local base, worker, now = k[1], a[2], a[3]
  local held = {}
  for i = 5, #a do held[a[i]] = true end
  local out = {}
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', base .. ':times', 0, '+inf')) do
    local f = redis.call('HMGET', runk(base, id), 'status', 'lock_owner')
    if f[1] == 'running' and f[2] == worker and not held[id] then
      requeue_run(base, id, now, 'store_unavailable', '0', 0, 0, '{}', a[4])
      out[#out + 1] = id
    end
  end
  return out
end

-- reclaim_worker: requeue every run of this shard whose lock a dead worker holds,
-- counting a crash against those it is told to charge (all of them, or the ids listed).
-- ARGV: op, worker, now, max_retries, retry_ttl, detail_json, completed_ttl,
--       charge ('all' | 'listed'), run_id... (with 'listed': the runs to charge)
-- returns {{run_id, quarantined}...}
ops.reclaim_worker = function(k, a)
  local base, worker, now = k[1], a[2], a[3]
  local listed = a[8] == 'listed'
  local charged = {}
  for i = 9, #a do charged[a[i]] = true end
  local out = {}
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', base .. ':times', 0, '+inf')) do
    local f = redis.call('HMGET', runk(base, id), 'status', 'lock_owner', 'attempt')
    if f[1] == 'running' and f[2] == worker then
      local d = cjson.decode(a[6])
      if type(d) ~= 'table' then d = {} end
      d.cause = d.cause or 'worker_crash'
      d.worker = worker
      d.attempt = tonumber(f[3])
      local crash = '1'
      if listed and not charged[id] then crash = '0' end
      out[#out + 1] = {id, requeue_run(base, id, now, 'orphaned', crash, a[4], a[5],
        cjson.encode(d), a[7])}
    end
  end
  return out
end
