-- The fenced writes of one attempt. Each returns an error reply "STALE <attempt>" or
-- "NOTFOUND" when the token is not the run's current attempt.

-- append: ARGV op, run_id, token, now, lock_expires, event... -> {last_seq, cancel}
-- The lock is renewed only once a third of its time has passed (the renewal thread renews
-- it anyway): a quick step's boundary costs the journal write alone.
ops.append = function(k, a)
  local base, id, token, now, expires = k[1], a[2], a[3], a[4], a[5]
  local run = runk(base, id)
  local err, f = stale(run, token)
  if err then return redis.error_reply(err) end
  local len = push_events(base, id, a, 6, f)
  local held = tonumber(f.lock_expires or '0') or 0
  if held < tonumber(now) + (tonumber(expires) - tonumber(now)) * 2 / 3 then
    redis.call('HSET', run, 'lock_expires', expires, 'jnl', 1)
    zadd_new(base .. ':times', expires, id)
  elseif not f.jnl then
    redis.call('HSET', run, 'jnl', 1)
  end
  return {len, f.cancel == '1' and 1 or 0}
end

-- park: KEYS base [, the name's timer summary (one server only: on a cluster the caller
--       records the timer there after this call)]
-- ARGV op, run_id, token, now, wake_at|'', known_seq, interrupt_json|'', n_signals,
--       signal..., event...
-- returns {parked (1|0), last_seq, cancel, {tail after known_seq when not parked}}
-- Not parked either when the run was nudged for one of the signals while it ran (the
-- `nudged` field, set by nudge); parked or not, the mark is cleared.
ops.park = function(k, a)
  local base, id, token, now, wake_at, known = k[1], a[2], a[3], a[4], a[5], tonumber(a[6])
  local interrupt, n = a[7], tonumber(a[8])
  local run = runk(base, id)
  local err, f = stale(run, token, PARK_FIELDS)
  if err then return redis.error_reply(err) end
  local cancel = f.cancel == '1'
  local len = push_events(base, id, a, 9 + n, f)
  local arrived = false
  local waiting = {}
  if n > 0 then
    local marks = {}
    for i = 9, 8 + n do
      waiting[#waiting + 1] = a[i]
      marks[#marks + 1] = 'sig:' .. a[i]
      if a[i] == f.nudged then arrived = true end
    end
    for _, seen in ipairs(redis.call('HMGET', run, unpack(marks))) do
      if tonumber(seen or '0') > known then arrived = true end
    end
  end
  if f.nudged then redis.call('HDEL', run, 'nudged') end
  if arrived or cancel then
    if not f.jnl then redis.call('HSET', run, 'jnl', 1) end
    return {0, len, cancel and 1 or 0, redis.call('LRANGE', jnlk(base, id), known, -1)}
  end
  local status = 'sleeping'
  if n > 0 then status = 'waiting' end
  -- An attempt that parks has completed: the run is no suspect any more.
  redis.call('HSET', run, 'status', status, 'lock_owner', '', 'parked_seq', len, 'jnl', 1,
    'waiting_for', n > 0 and cjson.encode(waiting) or '', 'interrupt', interrupt,
    'wake_at', wake_at, 'updated_at', now, 'suspect', '')
  redis.call('ZREM', base .. ':times', id)
  if wake_at ~= '' then
    zadd_new(base .. ':timers', wake_at, id)
    if k[2] then redis.call('ZADD', k[2], 'LT', wake_at, shard_of(id)) end
  end
  return {1, len, 0, {}}
end

-- finish: ARGV op, run_id, token, now, status, result_json, error_json|'', completed_ttl,
--         successor_id|'', successor_params|'', event...
-- (the last event is the terminal one; with a successor its JSON already names it)
-- Also keeps the chain's tail record (:chain:<start id>).
-- returns {last_seq, ring (1 when the successor's queueing must ring the doorbell)}
ops.finish = function(k, a)
  local base, id, token, now, status = k[1], a[2], a[3], a[4], a[5]
  local result, errj, ttl, succ, succ_params = a[6], a[7], a[8], a[9], a[10]
  local run = runk(base, id)
  local err, f = stale(run, token)
  if err then return redis.error_reply(err) end
  local start_id = f.start_id
  -- An open continue_as_new chain keeps one tail record: start id -> its latest run, kept
  -- while the chain runs and expiring completed_ttl after its last run ends.
  local chain = base .. ':chain:' .. tostring(start_id)
  local rang = false
  if succ ~= '' then
    redis.call('SET', chain, succ)
    local name = redis.call('HGET', run, 'name')
    local fields = {'name', name, 'owner', f.owner, 'params', succ_params,
      'status', 'queued', 'attempt', 0, 'created_at', now, 'updated_at', now, 'idem', '',
      'start_id', start_id, 'predecessor', id}
    if f.prio and f.prio ~= '' then  -- the successor keeps the run's priority
      fields[#fields + 1] = 'prio'; fields[#fields + 1] = f.prio
    end
    redis.call('HSET', runk(base, succ), unpack(fields))
    zadd_new(base .. ':index', now, succ)
    rang = enqueue(base, succ, f.owner, now, true, f.prio)
    redis.call('HSET', run, 'successor_id', succ)
  elseif start_id and start_id ~= id and tonumber(ttl) > 0 then
    redis.call('EXPIRE', chain, ttl)
  end
  local len = push_events(base, id, a, 11, f)
  finish_run(base, id, status, now, result, errj, ttl, true, f.idem, f.waiter)
  return {len, rang and 1 or 0}
end

-- requeue: ARGV op, run_id, token, now, reason, crash (1|0), max_retries, retry_ttl,
--          detail_json, completed_ttl, event...   -> quarantined (1|0)
ops.requeue = function(k, a)
  local base, id, token, now = k[1], a[2], a[3], a[4]
  local run = runk(base, id)
  local err, f = stale(run, token)
  if err then return redis.error_reply(err) end
  if #a >= 11 then
    push_events(base, id, a, 11, f)
    if not f.jnl then redis.call('HSET', run, 'jnl', 1) end
  end
  return requeue_run(base, id, now, a[5], a[6], a[7], a[8], a[9], a[10])
end

-- await: a client is about to wait for this run's end. ARGV op, run_id, field...
-- returns 'NOTFOUND'; or, when the run has ended, the record as it stands (the fields named,
-- in order, or the whole record without names) so that the wait needs no read of its
-- own; or 'WAIT' (marked: its finish leaves a token in :done:<id>)
ops.await = function(k, a)
  local run = runk(k[1], a[2])
  local status = redis.call('HGET', run, 'status')
  if not status then return 'NOTFOUND' end
  if status == 'completed' or status == 'failed' or status == 'cancelled'
    or status == 'continued' then
    if #a > 2 then return redis.call('HMGET', run, unpack(a, 3)) end
    return redis.call('HGETALL', run)
  end
  redis.call('HSET', run, 'waiter', 1)
  return 'WAIT'
end
