-- Per-key concurrency limits and start rates (pyrula.workflows.limits), with the memory
-- store's semantics. Every run of a limited workflow lives on the name's shard 0 (the
-- caller picks it), so its key's line, the runs holding its slots and its bucket share
-- this shard's slot: each decision is one script. The limits themselves come from the
-- caller (ARGV `max`, `rate`: '' for none), as flow control's do.
--
-- A run holds its key's slot while it runs, or while it is admitted (queued in its
-- owner's queue, not a suspect). :slots:<key> lists the runs that may: each count reads
-- their records and forgets those that no longer do, so every way a run stops (ends,
-- parks, is requeued, its record expires) frees its slot without a write of its own.

local function slots_used(base, key, except)
  -- How many runs hold a slot of concurrency key `key` (`except` not counted).
  local slots = base .. ':slots:' .. key
  local used = 0
  for _, id in ipairs(redis.call('SMEMBERS', slots)) do
    local f = redis.call('HMGET', runk(base, id), 'status', 'held', 'suspect', 'lc')
    local holds = f[4] == key and (f[1] == 'running'
      or (f[1] == 'queued' and not f[2] and f[3] ~= '1'))
    if not holds then
      redis.call('SREM', slots, id)
    elseif id ~= except then
      used = used + 1
    end
  end
  return used
end

local function take_token(base, key, rate, now)
  -- A start from rate key `key`'s bucket (one second of starts at most, as
  -- stores.common.TokenBucket): true if there was one.
  local bucket = base .. ':bucket:' .. key
  local cap = math.max(1, rate)
  local b = redis.call('HMGET', bucket, 'tokens', 'stamp')
  local tokens, stamp = tonumber(b[1] or '1'), tonumber(b[2] or now)
  tokens = math.min(cap, tokens + math.max(0, now - stamp) * rate)
  local took = tokens >= 1
  if took then tokens = tokens - 1 end
  redis.call('HSET', bucket, 'tokens', tokens, 'stamp', now)
  return took
end

local function room(base, lc, lr, max, rate, now, except)
  -- Whether a run with keys `lc`, `lr` may start now, taking a rate token if so (`max`
  -- and `rate`: numbers or nil). `except`: the run itself, when it already runs.
  if lc and lc ~= '' and max then
    if slots_used(base, lc, except) >= max then return false end
  end
  if lr and lr ~= '' and rate then return take_token(base, lr, rate, tonumber(now)) end
  return true
end

local function took_slot(base, id, lc)
  -- The run `id` (concurrency key `lc`) holds a slot from now on.
  if lc and lc ~= '' then redis.call('SADD', base .. ':slots:' .. lc, id) end
end

local function admit(base, max, rate, now)
  -- Move the waiting runs that their limits let start now out of their lines into their
  -- owners' queues, each line in FIFO order until its head must wait; the first 64 lines
  -- least recently visited. Returns true when an owner's queue appeared here.
  local rang = false
  for _, line in ipairs(redis.call('ZRANGE', base .. ':lines', 0, 63)) do
    local q = base .. ':line:' .. line
    while true do
      local id = redis.call('LINDEX', q, 0)
      if not id then
        redis.call('ZREM', base .. ':lines', line)
        break
      end
      local f = redis.call('HMGET', runk(base, id), 'lc', 'lr', 'owner', 'prio')
      if not room(base, f[1], f[2], max, rate, now, nil) then
        redis.call('ZADD', base .. ':lines', 'XX', now, line)  -- visited: to the back
        break
      end
      redis.call('LPOP', q)
      redis.call('HDEL', runk(base, id), 'held')
      took_slot(base, id, f[1])
      if place(base, id, f[3], tonumber(f[4] or '') or 0) then rang = true end
    end
  end
  return rang
end

local function limits_at(a, i)
  -- The limits a caller passed at ARGV i, i + 1: max and rate (nil for none).
  return tonumber(a[i] or ''), tonumber(a[i + 1] or '')
end

-- assign_limit_keys: record the keys a worker computed for the run it claimed without
-- them; the run goes on if its limits let it (its line empty, a slot and a token free),
-- else back to its key's line (run:requeued, reason limit). Fenced.
-- KEYS: base
-- ARGV: op, run_id, token, now, concurrency key|'', rate key|'', max|'', rate|'',
--       completed_ttl (a run whose cancel was asked for ends here, cancelled)
-- returns 1 (it runs) | 0 (it waits)
ops.assign_limit_keys = function(k, a)
  local base, id, token, now, lc, lr = k[1], a[2], a[3], a[4], a[5], a[6]
  local run = runk(base, id)
  local err = stale(run, token)
  if err then return redis.error_reply(err) end
  if lc ~= '' then redis.call('HSET', run, 'lc', lc) end
  if lr ~= '' then redis.call('HSET', run, 'lr', lr) end
  local line = line_of(lc, lr)
  if not line then return 1 end
  local max, rate = limits_at(a, 7)
  -- FIFO: runs already waiting in its key's line go first.
  if redis.call('EXISTS', base .. ':line:' .. line) == 0
    and room(base, lc, lr, max, rate, now, id) then
    took_slot(base, id, lc)
    return 1
  end
  requeue_run(base, id, now, 'limit', '0', 0, 0, '{}', a[9])
  return 0
end
