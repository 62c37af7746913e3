-- Per-key concurrency limits and start rates (pyrula.workflows.limits), with the memory
-- store's semantics. A limited workflow's runs live on the name's shard 0, its home (the
-- caller picks it), so its key's line, the runs holding its slots and its bucket share
-- this shard's slot: each decision is one script. The limits themselves come from the
-- caller (ARGV `max`, `rate`: '' for none), as flow control's do.
--
-- A run holds its key's slot while it runs, or while it is admitted (queued in its
-- owner's queue, not a suspect). :slots:<key> lists the home's runs that may: each count
-- reads their records and forgets those that no longer do, so every way a run stops
-- (ends, parks, is requeued, its record expires) frees its slot without a write of its
-- own.
--
-- A run submitted without keys before its name was known to be limited may live on
-- another shard. It waits in that shard's own lines, and holds its slot in the home's
-- :away:<key> (zset run -> its lock's expiry: renewed with the lock, removed when its
-- attempt stops, and expiring when its worker dies), taken before the run is claimed
-- there (away_enter, away_reserve; a claim that did not take the run gives it back,
-- away_release). A crash between the two scripts holds a slot one lock TTL at most.

local function slots_used(base, key, except, now)
  -- How many runs hold a slot of concurrency key `key` (`except` not counted): the
  -- home's, by their records, and the other shards', by their entries in :away:<key>.
  local slots, away = base .. ':slots:' .. key, base .. ':away:' .. key
  redis.call('ZREMRANGEBYSCORE', away, '-inf', now)
  local used = redis.call('ZCARD', away)
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
  -- and `rate`: numbers or nil; `max` 0: a shard other than the home, where a run with
  -- keys never starts by itself). `except`: the run itself, when it already runs.
  if max == 0 and ((lc and lc ~= '') or (lr and lr ~= '')) then return false end
  if lc and lc ~= '' and max then
    if slots_used(base, lc, except, now) >= max then return false end
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
  -- The limits a caller passed at ARGV i, i + 1: max and rate (nil for none). 'away' for
  -- max: the shard is not the name's home (see room).
  if a[i] == 'away' then return 0, nil end
  return tonumber(a[i] or ''), tonumber(a[i + 1] or '')
end

-- assign_limit_keys: record the keys a worker computed for the run it claimed without
-- them; the run goes on if its limits let it (its line empty, a slot and a token free),
-- else back to its key's line (run:requeued, reason limit). Fenced.
-- KEYS: base
-- ARGV: op, run_id, token, now, concurrency key|'', rate key|'', max|'', rate|'',
--       completed_ttl (a run whose cancel was asked for ends here, cancelled)
-- (max 'granted': a run of a shard other than the home, granted its slot there,
-- away_enter: it runs; 'away': it was not, it waits in this shard's line)
-- returns 1 (it runs) | 0 (it waits)
ops.assign_limit_keys = function(k, a)
  local base, id, token, now, lc, lr = k[1], a[2], a[3], a[4], a[5], a[6]
  local run = runk(base, id)
  local err = stale(run, token)
  if err then return redis.error_reply(err) end
  if lc ~= '' then redis.call('HSET', run, 'lc', lc) end
  if lr ~= '' then redis.call('HSET', run, 'lr', lr) end
  local line = line_of(lc, lr)
  if not line or a[7] == 'granted' then return 1 end
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

-- away_enter: a run of another shard, claimed without keys, takes a slot of its keys here
-- (the name's home) until `lock_expires` (renewed with its lock), if no run waits in the
-- home's line of its key and its limits let it start.
-- KEYS: base (the home)
-- ARGV: op, run_id, lock_expires, now, concurrency key|'', rate key|'', max|'', rate|''
-- returns 1 (granted) | 0
ops.away_enter = function(k, a)
  local base, id, expires, now, lc, lr = k[1], a[2], a[3], a[4], a[5], a[6]
  local line = line_of(lc, lr)
  if not line then return 1 end
  if redis.call('EXISTS', base .. ':line:' .. line) == 1 then return 0 end
  local max, rate = limits_at(a, 7)
  if not room(base, lc, lr, max, rate, now, nil) then return 0 end
  if lc ~= '' then redis.call('ZADD', base .. ':away:' .. lc, expires, id) end
  return 1
end

-- away_reserve: slots (and tokens) here for the heads of another shard's lines, which
-- its claim then takes (claim_heads); each line's heads in order, until one must wait.
-- KEYS: base (the home)
-- ARGV: op, now, lock_expires, max|'', rate|'', then per line: concurrency key|'',
--       rate key|'', n, run_id x n
-- returns {run ids granted}
ops.away_reserve = function(k, a)
  local base, now, expires = k[1], a[2], a[3]
  local max, rate = limits_at(a, 4)
  local granted = {}
  local i = 6
  while i <= #a do
    local lc, lr, n = a[i], a[i + 1], tonumber(a[i + 2])
    for j = 1, n do
      if not room(base, lc, lr, max, rate, now, nil) then break end
      local id = a[i + 2 + j]
      if lc ~= '' then redis.call('ZADD', base .. ':away:' .. lc, expires, id) end
      granted[#granted + 1] = id
    end
    i = i + 3 + n
  end
  return granted
end

-- away_release: give back what away_reserve or away_enter granted runs that did not run
-- (their slots, and their rate tokens if `refund`), or the slots of runs of another shard
-- whose attempts stopped.
-- KEYS: base (the home)
-- ARGV: op, rate|'', refund (1|0), then per run: run_id, concurrency key|'', rate key|''
ops.away_release = function(k, a)
  local base, rate = k[1], tonumber(a[2] or '')
  for i = 4, #a, 3 do
    local id, lc, lr = a[i], a[i + 1], a[i + 2]
    if lc ~= '' then redis.call('ZREM', base .. ':away:' .. lc, id) end
    if a[3] == '1' and lr ~= '' and rate then
      local bucket = base .. ':bucket:' .. lr
      local tokens = tonumber(redis.call('HGET', bucket, 'tokens') or '0')
      redis.call('HSET', bucket, 'tokens', math.min(math.max(1, rate), tokens + 1))
    end
  end
  return 1
end

-- away_renew: extend the slots runs of other shards hold here with their locks.
-- KEYS: base (the home)
-- ARGV: op, lock_expires, then per run: run_id, concurrency key
ops.away_renew = function(k, a)
  for i = 3, #a, 2 do
    redis.call('ZADD', k[1] .. ':away:' .. a[i + 1], 'XX', a[2], a[i])
  end
  return 1
end

-- line_heads: the first runs waiting in this shard's lines (a shard other than its name's
-- home: their slots are taken there first, away_reserve).
-- KEYS: base
-- ARGV: op, now, lines (at most), runs per line (at most)
-- returns {{concurrency key, rate key, run_id...}...}
ops.line_heads = function(k, a)
  local base, now = k[1], a[2]
  local out = {}
  for _, line in ipairs(redis.call('ZRANGE', base .. ':lines', 0, tonumber(a[3]) - 1)) do
    local ids = redis.call('LRANGE', base .. ':line:' .. line, 0, tonumber(a[4]) - 1)
    if #ids == 0 then
      redis.call('ZREM', base .. ':lines', line)
    else
      redis.call('ZADD', base .. ':lines', 'XX', now, line)  -- visited: to the back
      local f = redis.call('HMGET', runk(base, ids[1]), 'lc', 'lr')
      out[#out + 1] = {f[1] or '', f[2] or '', unpack(ids)}
    end
  end
  return out
end
