-- Per-key concurrency limits and start rates (pyrula.workflows.limits), with the memory
-- store's semantics: a table of functions built by `limits()` (00_lib) the first time a
-- call needs it: once per load of the function library, and, on the EVALSHA path (where
-- every call defines the script's functions anew), only in the calls that need it. Its
-- ops are dispatched from its table when the main table lacks them (zz_dispatch).
--
-- A limited workflow's runs live on the name's shard 0, its home (the caller picks it),
-- so its key's line, the runs holding its slots and its bucket share this shard's slot:
-- each decision is one script. The limits come from the caller (ARGV `max`, `rate`: ''
-- for none), as flow control's do.
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

limits = function()
  -- The limits' functions, built at the first call that asks for them: their parts are
  -- defined in here, so that a call of any other op defines none of them.
  if limits_built then return limits_built end

  local function limits_core(L)
    -- Lines, slots and buckets.
    function L.line_of(lc, lr)
      -- The waiting line of a run with concurrency key `lc` and rate key `lr` (either
      -- may be nil or ''): its concurrency key's (its rate checked as it leaves), else
      -- its rate key's; nil for a run without keys.
      if lc and lc ~= '' then return 'c:' .. lc end
      if lr and lr ~= '' then return 'r:' .. lr end
      return nil
    end

    function L.hold(base, id, line, now)
      -- Queue a run in its key's waiting line (a claim admits it to its owner's queue).
      -- Returns true when the line is new here: the shard's doorbell must ring.
      redis.call('RPUSH', base .. ':line:' .. line, id)
      redis.call('HSET', runk(base, id), 'held', line)
      return redis.call('ZADD', base .. ':lines', 'NX', now, line) == 1
    end

    function L.unhold(base, id, line)
      -- Take a queued run out of its key's waiting line `line`.
      local q = base .. ':line:' .. line
      redis.call('LREM', q, 1, id)
      redis.call('HDEL', runk(base, id), 'held')
      if redis.call('EXISTS', q) == 0 then redis.call('ZREM', base .. ':lines', line) end
    end

    function L.slots_used(base, key, except, now)
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

    function L.take_token(base, key, rate, now)
      -- A start from rate key `key`'s bucket (one second of starts at most, as
      -- stores.common.TokenBucket): true if there was one.
      local bucket = base .. ':bucket:' .. key
      local b = redis.call('HMGET', bucket, 'tokens', 'stamp')
      local tokens, stamp = tonumber(b[1] or '1'), tonumber(b[2] or now)
      tokens = math.min(math.max(1, rate), tokens + math.max(0, now - stamp) * rate)
      local took = tokens >= 1
      if took then tokens = tokens - 1 end
      redis.call('HSET', bucket, 'tokens', tokens, 'stamp', now)
      return took
    end
  end

  local function limits_rules(L)
    -- Whether a run may start, and admitting the runs that may.
    function L.room(base, lc, lr, max, rate, now, except)
      -- Whether a run with keys `lc`, `lr` may start now, taking a rate token if so (`max`
      -- and `rate`: numbers or nil; `max` 0: a shard other than the home, where a run with
      -- keys never starts by itself). `except`: the run itself, when it already runs.
      if max == 0 and ((lc and lc ~= '') or (lr and lr ~= '')) then return false end
      if lc and lc ~= '' and max then
        if L.slots_used(base, lc, except, now) >= max then return false end
      end
      if lr and lr ~= '' and rate then return L.take_token(base, lr, rate, tonumber(now)) end
      return true
    end

    function L.took_slot(base, id, lc)
      -- The run `id` (concurrency key `lc`) holds a slot from now on.
      if lc and lc ~= '' then redis.call('SADD', base .. ':slots:' .. lc, id) end
    end

    function L.limits_at(a, i)
      -- The limits a caller passed at ARGV i, i + 1: max and rate (nil for none). 'away'
      -- for max: the shard is not the name's home (see room).
      if a[i] == 'away' then return 0, nil end
      return tonumber(a[i] or ''), tonumber(a[i + 1] or '')
    end

    function L.admit(base, max, rate, now)
      -- Move the waiting runs that their limits let start now out of their lines into
      -- their owners' queues, each line in FIFO order until its head must wait; the first
      -- 64 lines least recently visited.
      for _, line in ipairs(redis.call('ZRANGE', base .. ':lines', 0, 63)) do
        local q = base .. ':line:' .. line
        while true do
          local id = redis.call('LINDEX', q, 0)
          if not id then
            redis.call('ZREM', base .. ':lines', line)
            break
          end
          local f = redis.call('HMGET', runk(base, id), 'lc', 'lr', 'owner', 'prio')
          if not L.room(base, f[1], f[2], max, rate, now, nil) then
            redis.call('ZADD', base .. ':lines', 'XX', now, line)  -- visited: to the back
            break
          end
          redis.call('LPOP', q)
          redis.call('HDEL', runk(base, id), 'held')
          L.took_slot(base, id, f[1])
          enqueue(base, id, f[3], now, true, f[4], nil)
        end
      end
    end
  end

  local function limits_claims(L, o)
    -- claim_limited: claim for a workflow with per-key limits: first admit the runs
    -- waiting in its keys' lines that their limits let start, then claim.
    -- KEYS: as claim
    -- ARGV: op, worker, now, lock_expires, limit, build, max|'', rate|'', [owner, cap]...
    -- returns as claim, and how many lines hold waiting runs here
    o.claim_limited = function(k, a)
      local max, rate = L.limits_at(a, 7)
      L.admit(k[1], max, rate, a[3])
      table.remove(a, 7)
      table.remove(a, 7)
      a.limited = true  -- ops.claim reads the rest as the plain claim's ARGV
      return ops.claim(k, a)
    end

    -- claim_away: claim on a shard of a limited workflow other than its home: the runs of
    -- its owners' queues, none of its lines' (their slots are taken at the home first:
    -- line_heads, away_reserve, claim_heads).
    -- KEYS, ARGV: as claim; returns as claim_limited
    o.claim_away = function(k, a)
      a.limited = true
      return ops.claim(k, a)
    end

    -- claim_suspect_limited: claim_suspect for a workflow with per-key limits; a suspect
    -- with keys is taken only if its limits let it start.
    -- ARGV: op, worker, now, lock_expires, build, max|'', rate|'', [owner, cap]...
    o.claim_suspect_limited = function(k, a)
      a.max, a.rate = L.limits_at(a, 6)
      table.remove(a, 6)
      table.remove(a, 6)
      return ops.claim_suspect(k, a)
    end

    -- claim_heads: claim these runs waiting in this shard's lines, those still there
    -- (their slots were taken at the name's home first: away_reserve).
    -- KEYS: base
    -- ARGV: op, worker, now, lock_expires, build ('' for none), run_id...
    -- returns {rows as claim returns each}
    o.claim_heads = function(k, a)
      local base, worker, now, expires = k[1], a[2], a[3], a[4]
      local out = {}
      for i = 6, #a do
        local id = a[i]
        local f = redis.call('HMGET', runk(base, id), 'status', 'held')
        if f[1] == 'queued' and f[2] then
          L.unhold(base, id, f[2])
          zadd_new(base .. ':times', expires, id)
          out[#out + 1] = take(base, id, worker, now, expires, a[5] or '')
        end
      end
      return out
    end
  end

  local function limits_hand_back(L, o)
    -- The keys a worker computed for a run claimed without them.
    -- assign_limit_keys: record the keys a worker computed for the run it claimed without
    -- them; the run goes on if its limits let it (its line empty, a slot and a token free),
    -- else back to its key's line (run:requeued, reason limit). Fenced.
    -- KEYS: base
    -- ARGV: op, run_id, token, now, concurrency key|'', rate key|'', max|'', rate|'',
    --       completed_ttl (a run whose cancel was asked for ends here, cancelled)
    -- (max 'granted': a run of a shard other than the home, granted its slot there,
    -- away_enter: it runs; 'away': it was not, it waits in this shard's line)
    -- returns 1 (it runs) | 0 (it waits)
    o.assign_limit_keys = function(k, a)
      local base, id, token, now, lc, lr = k[1], a[2], a[3], a[4], a[5], a[6]
      local run = runk(base, id)
      local err = stale(run, token)
      if err then return redis.error_reply(err) end
      if lc ~= '' then redis.call('HSET', run, 'lc', lc) end
      if lr ~= '' then redis.call('HSET', run, 'lr', lr) end
      local line = L.line_of(lc, lr)
      if not line or a[7] == 'granted' then return 1 end
      local max, rate = L.limits_at(a, 7)
      -- FIFO: runs already waiting in its key's line go first.
      if redis.call('EXISTS', base .. ':line:' .. line) == 0
        and L.room(base, lc, lr, max, rate, now, id) then
        L.took_slot(base, id, lc)
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
    o.away_enter = function(k, a)
      local base, id, expires, now, lc, lr = k[1], a[2], a[3], a[4], a[5], a[6]
      local line = L.line_of(lc, lr)
      if not line then return 1 end
      if redis.call('EXISTS', base .. ':line:' .. line) == 1 then return 0 end
      local max, rate = L.limits_at(a, 7)
      if not L.room(base, lc, lr, max, rate, now, nil) then return 0 end
      if lc ~= '' then redis.call('ZADD', base .. ':away:' .. lc, expires, id) end
      return 1
    end
  end

  local function limits_away(L, o)
    -- The ops that take and give back slots at the home for runs of other shards.
    -- away_reserve: slots (and tokens) here for the heads of another shard's lines, which
    -- its claim then takes (claim_heads); each line's heads in order, until one must wait.
    -- KEYS: base (the home)
    -- ARGV: op, now, lock_expires, max|'', rate|'', then per line: concurrency key|'',
    --       rate key|'', n, run_id x n
    -- returns {run ids granted}
    o.away_reserve = function(k, a)
      local base, now, expires = k[1], a[2], a[3]
      local max, rate = L.limits_at(a, 4)
      local granted = {}
      local i = 6
      while i <= #a do
        local lc, lr, n = a[i], a[i + 1], tonumber(a[i + 2])
        for j = 1, n do
          if not L.room(base, lc, lr, max, rate, now, nil) then break end
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
    o.away_release = function(k, a)
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
    o.away_renew = function(k, a)
      for i = 3, #a, 2 do
        redis.call('ZADD', k[1] .. ':away:' .. a[i + 1], 'XX', a[2], a[i])
      end
      return 1
    end
  end

  local function limits_lines(L, o)
    -- What waits in a shard's lines.
    -- line_heads: the first runs waiting in this shard's lines (a shard other than its name's
    -- home: their slots are taken there first, away_reserve).
    -- KEYS: base
    -- ARGV: op, now, lines (at most), runs per line (at most)
    -- returns {{concurrency key, rate key, run_id...}...}
    o.line_heads = function(k, a)
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
  end

  local L = {ops = {}}
  limits_core(L)
  limits_rules(L)
  limits_claims(L, L.ops)
  limits_hand_back(L, L.ops)
  limits_away(L, L.ops)
  limits_lines(L, L.ops)
  limits_built = L
  return L
end
