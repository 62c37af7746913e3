-- Shared helpers. Every op takes KEYS[1] = the shard's base key "<ns>:{<tag>}"; every key
-- an op touches is that base plus a suffix, so it shares the hash tag (one slot).
-- Suffixes: :run:<id> (hash), :jnl:<id> (list of event JSON), :q:<owner> (FIFO list),
-- :active (zset owner -> served, owners with queued runs),
-- :timers (zset id -> wake_at), :locks (zset id -> lock expiry), :index (zset id ->
-- created_at), :expiry (zset id -> finished_at), :idem:<key>, :done:<id>, :gen.
local ops = {}

local function runk(base, id) return base .. ':run:' .. id end
local function jnlk(base, id) return base .. ':jnl:' .. id end

local function stale(run, token)
  -- Fencing: the write is accepted only from the run's current attempt while it runs.
  -- Returns nil, cancel requested, the run's start id (its continue_as_new chain).
  local st = redis.call('HMGET', run, 'status', 'attempt', 'cancel', 'start_id')
  if not st[1] then return 'NOTFOUND' end
  if st[1] ~= 'running' or st[2] ~= token then return 'STALE ' .. tostring(st[2]) end
  return nil, st[3] == '1', st[4]
end

local function push_events(base, id, a, from)
  local jnl = jnlk(base, id)
  if #a >= from then
    return redis.call('RPUSH', jnl, unpack(a, from, #a))  -- the new length
  end
  return redis.call('LLEN', jnl)
end

-- Put a run in its owner's FIFO. `fresh` (a run just created) skips resetting the fields
-- and indexes a parked or running run would still carry.
local function enqueue(base, id, owner, now, fresh)
  local q = base .. ':q:' .. owner
  if redis.call('LLEN', q) == 0 then
    -- An owner that (re)appears starts level with the least-served active one: it
    -- neither starves the others nor waits behind the runs it got while alone.
    local low = redis.call('ZRANGE', base .. ':active', 0, 0, 'WITHSCORES')
    local floor = 0
    if #low > 0 then floor = tonumber(low[2]) end
    redis.call('ZADD', base .. ':active', floor, owner)
  end
  redis.call('RPUSH', q, id)
  if fresh then return end
  redis.call('HSET', runk(base, id), 'status', 'queued', 'lock_owner', '', 'wake_at', '',
    'waiting_for', '', 'interrupt', '')
  redis.call('ZREM', base .. ':timers', id)
  redis.call('ZREM', base .. ':locks', id)
end

local function dequeue(base, id, owner)
  local q = base .. ':q:' .. owner
  redis.call('LREM', q, 1, id)
  if redis.call('LLEN', q) == 0 then redis.call('ZREM', base .. ':active', owner) end
end

local function event(kind, now, fields)
  local e = {type = kind, ts = tonumber(now)}
  if fields then for k, v in pairs(fields) do e[k] = v end end
  return cjson.encode(e)
end

local function finish_run(base, id, status, now, result, err, ttl, was_running)
  local run = runk(base, id)
  redis.call('HSET', run, 'status', status, 'result', result, 'error', err, 'lock_owner', '',
    'wake_at', '', 'waiting_for', '', 'finished_at', now, 'updated_at', now)
  redis.call('ZREM', base .. ':locks', id)
  if not was_running then redis.call('ZREM', base .. ':timers', id) end
  redis.call('ZADD', base .. ':expiry', now, id)
  local done = base .. ':done:' .. id
  redis.call('RPUSH', done, status)
  ttl = tonumber(ttl)
  if ttl and ttl > 0 then
    redis.call('EXPIRE', run, ttl)
    redis.call('EXPIRE', jnlk(base, id), ttl)
    redis.call('EXPIRE', done, math.min(ttl, 600))
    local idem = redis.call('HGET', run, 'idem')
    if idem and idem ~= '' then redis.call('EXPIRE', base .. ':idem:' .. idem, ttl) end
    -- Forget index entries of runs that have expired (a few per call).
    local old = redis.call('ZRANGEBYSCORE', base .. ':expiry', '-inf', tonumber(now) - ttl,
      'LIMIT', 0, 16)
    for _, gone in ipairs(old) do
      redis.call('ZREM', base .. ':expiry', gone)
      redis.call('ZREM', base .. ':index', gone)
    end
  end
end

local function requeue_run(base, id, now, reason, crash, max_retries, retry_ttl, detail, ttl)
  local run = runk(base, id)
  if crash == '1' then
    local crashes = cjson.decode(redis.call('HGET', run, 'crashes') or '[]')
    local live = {}
    for _, t in ipairs(crashes) do
      if tonumber(now) - t < tonumber(retry_ttl) then live[#live + 1] = t end
    end
    live[#live + 1] = tonumber(now)
    redis.call('HSET', run, 'crashes', cjson.encode(live))
    if #live > tonumber(max_retries) then
      local d = cjson.decode(detail)
      if d == cjson.null or type(d) ~= 'table' then d = {} end
      if d.crashes == nil then d.crashes = #live end
      local cause = d.cause or 'worker_crash'
      local etype = 'WorkerCrashed'
      if cause == 'loop_blocked' then etype = 'EventLoopBlocked' end
      local err = {code = 'max_retries', error_type = etype, detail = d,
        message = 'run quarantined after ' .. #live ..
          ' crashes (poison_max_retries exceeded); last cause: ' .. cause}
      redis.call('RPUSH', jnlk(base, id), event('run:error', now, {code = err.code,
        error_type = err.error_type, message = err.message, detail = d}))
      finish_run(base, id, 'failed', now, 'null', cjson.encode(err), ttl, true)
      return 1
    end
  end
  if redis.call('HGET', run, 'cancel') == '1' then
    redis.call('RPUSH', jnlk(base, id), event('run:cancelled', now))
    finish_run(base, id, 'cancelled', now, 'null', '', ttl, true)
    return 0
  end
  redis.call('RPUSH', jnlk(base, id), event('run:requeued', now, {reason = reason}))
  enqueue(base, id, redis.call('HGET', run, 'owner'), now)
  return 0
end

local function take(base, id, worker, now, expires)
  local run = runk(base, id)
  local f = redis.call('HMGET', run, 'name', 'params', 'owner', 'start_id', 'created_at',
    'parked_seq', 'attempt', 'started_at')
  local attempt = tonumber(f[7] or '0') + 1
  if f[8] then
    redis.call('HSET', run, 'status', 'running', 'attempt', attempt, 'lock_owner', worker,
      'lock_expires', expires, 'updated_at', now)
  else
    redis.call('HSET', run, 'status', 'running', 'attempt', attempt, 'lock_owner', worker,
      'lock_expires', expires, 'updated_at', now, 'started_at', now)
  end
  redis.call('ZADD', base .. ':locks', expires, id)
  redis.call('RPUSH', jnlk(base, id), event('run:started', now, {attempt = attempt,
    worker = worker}))
  local from = tonumber(f[6] or '0')
  local journal = redis.call('LRANGE', jnlk(base, id), from, -1)
  return {id, f[1], f[2], f[3], attempt, f[4], f[5], from, journal}
end
