-- Shared helpers. Every op takes KEYS[1] = the shard's base key "<ns>:{<tag>}"; every key
-- an op touches is that base plus a suffix, so it shares the hash tag (one slot).
-- Suffixes: :run:<id> (hash), :jnl:<id> (list of event JSON), :q:<owner> (FIFO list of
-- the owner's queued runs of priority 0), :pq:<owner>:<p> (FIFO list of its queued runs of
-- priority p, 1..9; the record's field `prio` holds p, absent for 0), :prio (hash owner ->
-- the digits of its priorities 1..9 with queued runs, highest first: only owners that have
-- such runs; claims take each owner's highest priority first),
-- :active (zset owner -> served, owners with queued runs), :suspects (FIFO list of the
-- queued suspects, put aside from their owners' queues: the record's field `suspect` is
-- '1' from a crash counted until an attempt parks or ends the run),
-- :timers (zset id -> wake_at), :times (zset: a running run -> its lock expiry; an ended
-- run -> its finish time - ENDED, below every lock expiry), :index (zset id ->
-- created_at), :idem:<key>, :done:<id>, :chain:<start>; for per-key limits (zy_limits):
-- :line:<line> (FIFO list of the queued runs waiting for their key, out of every owner's
-- queue; the record's field `held` names the line), :lines (zset of the lines with waiting
-- runs -> when last visited), :slots:<key> (set of the runs that may hold a slot of a
-- concurrency key: counted from their records), :bucket:<key> (a rate key's tokens).
--
-- The journal list holds seq N at index N - 1. Its first entries are not written when the
-- run record holds everything they say: run:submitted (always), and run:started of a
-- run's first attempt when nothing came before it (fields started_at, w1 and b1, the
-- first claimer's build, if it named one). Their places
-- hold empty placeholders that readers replace with the events built from the record. The
-- list is created by the first event written, placeholders included; the record's field
-- `jnl` says it exists.
local ops = {}

-- Ended runs sit in :times at their finish time minus this (keys.py: ENDED_OFFSET): below
-- zero, in finish order. (A double keeps such a score to well under a microsecond.)
local ENDED = 1e10

-- The sorted sets of runs (:index, :times, :timers) are kept in the server's skiplist
-- encoding from their first member. A small sorted set is otherwise a listpack (up to
-- zset-max-listpack-entries, 128 by default), where every insert and every score change
-- walks the whole set, parsing each member's score: with a few dozen runs per shard that
-- made each ZADD ~4x dearer than in a skiplist, the largest part of the server's own work
-- per run. A member longer than zset-max-listpack-value (64 by default) converts a set,
-- and the set keeps its encoding until it is emptied (and so deleted). So a write that may
-- have made a set (its first members) adds and at once removes such a member; it knows by
-- a ZCARD, asked only when a write added members (a claim's locks, a park's timer, a run
-- ended that held no lock; never a lock renewed or a run's end moving its lock's entry),
-- and of the index only for a run submitted while its owner had nothing queued on the
-- shard (every other submit finds the index holding the queued runs). After a restart or
-- a replica's full sync the server loads small sets as listpacks again: slower until each
-- is next made anew, never wrong.
local WIDE = '~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~'
  .. '~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~'

local function skiplist(key, added)
  -- Make `key`, a set of runs that `added` members were just put in, a skiplist if they
  -- are all it holds (they made it).
  if added > 0 and redis.call('ZCARD', key) == added then
    redis.call('ZADD', key, 0, WIDE)
    redis.call('ZREM', key, WIDE)
  end
end

local function zadd_new(key, ...)
  -- ZADD key score id ...: runs put in a set of runs. Returns ZADD's reply.
  local added = redis.call('ZADD', key, ...)
  skiplist(key, added)
  return added
end

local function runk(base, id) return base .. ':run:' .. id end
local function jnlk(base, id) return base .. ':jnl:' .. id end

-- Every field a fenced write reads, in one HMGET.
local RUN_FIELDS = {'status', 'attempt', 'cancel', 'start_id', 'idem', 'waiter',
  'lock_expires', 'owner', 'jnl', 'prio'}

-- What park reads besides: the signal name a nudge marked the running run with (nudge).
-- (Copied by hand: a function library's top level runs at load, where the Lua library
-- functions, `unpack` and `ipairs` included, are not reachable.)
local PARK_FIELDS = {}
for i = 1, #RUN_FIELDS do PARK_FIELDS[i] = RUN_FIELDS[i] end
PARK_FIELDS[#PARK_FIELDS + 1] = 'nudged'

local function stale(run, token, fields)
  -- Fencing: the write is accepted only from the run's current attempt while it runs.
  -- Returns nil and the run's fields (`fields`, RUN_FIELDS unless given, by name), or the
  -- error text.
  fields = fields or RUN_FIELDS
  local st = redis.call('HMGET', run, unpack(fields))
  if not st[1] then return 'NOTFOUND' end
  if st[1] ~= 'running' or st[2] ~= token then return 'STALE ' .. tostring(st[2]) end
  local f = {}
  for i, name in ipairs(fields) do f[name] = st[i] end
  return nil, f
end

local function journal_push(base, id, exists, started, ...)
  -- Append to the journal; one that does not exist yet gets the placeholders of what the
  -- record implies first: run:submitted, and run:started if the run has started.
  -- Returns the new last seq.
  if exists then return redis.call('RPUSH', jnlk(base, id), ...) end
  if started then return redis.call('RPUSH', jnlk(base, id), '', '', ...) end
  return redis.call('RPUSH', jnlk(base, id), '', ...)
end

local function push_events(base, id, a, from, f)
  -- A running attempt's events a[from..] (f: its record's RUN_FIELDS); the new last seq.
  if #a >= from then
    return journal_push(base, id, f.jnl, true, unpack(a, from, #a))
  end
  if not f.jnl then return 2 end  -- nothing written yet: the two implied events
  return redis.call('LLEN', jnlk(base, id))
end

local function level(base, owner)
  -- An owner that (re)appears starts level with the least-served active one: it neither
  -- starves the others nor waits behind the runs it got while alone.
  local low = redis.call('ZRANGE', base .. ':active', 0, 0, 'WITHSCORES')
  local floor = 0
  if #low > 0 then floor = tonumber(low[2]) end
  redis.call('ZADD', base .. ':active', floor, owner)
end

local function pqk(base, owner, p) return base .. ':pq:' .. owner .. ':' .. p end

local function with_digit(digits, p, present)
  -- `digits` (priorities, highest first) with the digit `p` added (present) or taken out.
  local out = {}
  for d in string.gmatch((digits or '') .. (present and p or ''), '%d') do
    if d ~= p or present then out[tonumber(d)] = d end
  end
  local s = ''
  for i = 9, 1, -1 do if out[i] then s = s .. out[i] end end
  return s
end

local function set_digits(base, owner, digits)
  if digits == '' then redis.call('HDEL', base .. ':prio', owner)
  else redis.call('HSET', base .. ':prio', owner, digits) end
end

local function enqueue_ranked(base, id, owner, p)
  -- Queue a run of priority p (1..9) in its owner's list of that priority. Returns true
  -- when the owner had nothing queued here before (as enqueue).
  if redis.call('RPUSH', pqk(base, owner, p), id) > 1 then return false end
  local digits = redis.call('HGET', base .. ':prio', owner)
  set_digits(base, owner, with_digit(digits, p, true))
  if digits or redis.call('EXISTS', base .. ':q:' .. owner) == 1 then return false end
  level(base, owner)
  return true
end

-- Per-key limits: the functions of zy_limits.lua, built by `limits()` the first time a
-- call needs them (once per load of the function library; on the EVALSHA path, where a
-- call defines every function of this file again, only in the calls that need them).
local limits, limits_built

-- Put a run in its owner's FIFO of its priority (`prio`, read from the record unless
-- `fresh`), or, a run with limit keys (`line`, read from the record unless `fresh`), in
-- its key's waiting line. `fresh` (a run just created) skips resetting the fields and
-- indexes a parked or running run would still carry. Returns true when the owner had
-- nothing queued here before: the shard's doorbell must ring, both when the shard had
-- nothing queued (it needs a worker) and when other owners' runs wait (deficit round
-- robin serves the newcomer next here, so claims should visit this shard soon). A run of
-- priority 0 costs what it did before priorities, but for one HGET when its owner's FIFO
-- was empty.
local function enqueue(base, id, owner, now, fresh, prio, line)
  local rang = false
  local suspect = nil
  if not fresh then
    local f = redis.call('HMGET', runk(base, id), 'suspect', 'prio', 'lc', 'lr')
    suspect, prio = f[1], f[2]
    if f[3] or f[4] then line = limits().line_of(f[3], f[4]) end
  end
  if suspect == '1' then
    -- A suspect waits apart, for claim_suspect; the first one rings the shard.
    rang = redis.call('RPUSH', base .. ':suspects', id) == 1
  elseif line then
    rang = limits().hold(base, id, line, now)
  else
    local p = tonumber(prio or '') or 0
    if p > 0 then
      rang = enqueue_ranked(base, id, owner, tostring(p))
    elseif redis.call('RPUSH', base .. ':q:' .. owner, id) == 1
      and not redis.call('HGET', base .. ':prio', owner) then
      level(base, owner)
      rang = true
    end
  end
  if fresh then return rang end
  -- A fresh run has been claimable since its created_at; any other records when it was
  -- queued again (queue_stats: the queue's age).
  redis.call('HSET', runk(base, id), 'status', 'queued', 'lock_owner', '', 'wake_at', '',
    'waiting_for', '', 'interrupt', '', 'updated_at', now, 'queued_at', now)
  redis.call('ZREM', base .. ':timers', id)
  redis.call('ZREM', base .. ':times', id)
  return rang
end

local function new_run(base, id, name, owner, params, now, idem, start_id, prio, lc, lr)
  -- Create a queued run (the idempotency key checked first) of priority `prio` ('' or nil
  -- for 0), with limit keys `lc` and `lr` (nil or '' for none). Returns the run's id,
  -- whether this call created it, and whether the shard's doorbell must ring (see enqueue).
  if idem ~= '' then
    local existing = redis.call('GET', base .. ':idem:' .. idem)
    if existing then return existing, false, false end
    redis.call('SET', base .. ':idem:' .. idem, id)
  end
  if start_id == '' then start_id = id end
  local fields = {'name', name, 'owner', owner, 'params', params, 'status', 'queued',
    'attempt', 0, 'created_at', now, 'updated_at', now, 'idem', idem, 'start_id', start_id}
  if (tonumber(prio or '') or 0) > 0 then
    fields[#fields + 1] = 'prio'; fields[#fields + 1] = prio
  end
  local line = nil
  if (lc and lc ~= '') or (lr and lr ~= '') then
    line = limits().line_of(lc, lr)
    if lc and lc ~= '' then fields[#fields + 1] = 'lc'; fields[#fields + 1] = lc end
    if lr and lr ~= '' then fields[#fields + 1] = 'lr'; fields[#fields + 1] = lr end
  end
  redis.call('HSET', runk(base, id), unpack(fields))
  local added = redis.call('ZADD', base .. ':index', now, id)
  local rang = enqueue(base, id, owner, now, true, prio, line)
  if rang then skiplist(base .. ':index', added) end  -- the shard's first run, maybe
  return id, true, rang
end

local function dequeue(base, id, owner, prio, held)
  -- Take a queued run out of its owner's FIFO of its priority `prio` (the record's field;
  -- nil or '' for 0), or the suspects', or its key's waiting line (`held`: the record's
  -- field). The owner leaves :active with its last run.
  if held and held ~= '' then return limits().unhold(base, id, held) end
  local p = tonumber(prio or '') or 0
  local q = base .. ':q:' .. owner
  if p > 0 then q = pqk(base, owner, tostring(p)) end
  if redis.call('LREM', q, 1, id) == 0 then redis.call('LREM', base .. ':suspects', 1, id) end
  if redis.call('EXISTS', q) == 1 then return end
  local digits = redis.call('HGET', base .. ':prio', owner)
  if p > 0 and digits then
    digits = with_digit(digits, tostring(p), false)
    set_digits(base, owner, digits)
  end
  if (digits or '') ~= '' then return end
  if p > 0 and redis.call('EXISTS', base .. ':q:' .. owner) == 1 then return end
  redis.call('ZREM', base .. ':active', owner)
end

local function shard_of(id)
  -- The run id carries its shard: 12 hex digits of the name's hash, then 4 of the shard.
  return tonumber(string.sub(id, 13, 16), 16)
end

local function ring(ready, bell, id, now)
  -- The doorbell of the run's shard: mark the shard as holding queued runs (the time it
  -- was rung, ms) and wake one idle worker with a token naming it, "<name hash>.<shard>"
  -- (the bell keeps at most 64 tokens).
  local shard = shard_of(id)
  redis.call('ZADD', ready, 'GT', math.floor(tonumber(now) * 1000), shard)
  if redis.call('LPUSH', bell, string.sub(id, 1, 12) .. '.' .. shard) > 64 then
    redis.call('LTRIM', bell, 0, 63)
  end
end

local function earliest_timer(base)
  -- When the shard's next timer falls due ('' if it has none): for the timer summary.
  local first = redis.call('ZRANGE', base .. ':timers', 0, 0, 'WITHSCORES')
  if #first == 0 then return '' end
  return first[2]
end

local function event(kind, now, fields)
  local e = {type = kind, ts = tonumber(now)}
  if fields then for k, v in pairs(fields) do e[k] = v end end
  return cjson.encode(e)
end

local function finish_run(base, id, status, now, result, err, ttl, was_running, idem, waiter)
  -- End a run: record, indexes, the waiters' token, retention. `idem` and `waiter` are
  -- the record's fields of those names (read by the caller's HMGET).
  local run = runk(base, id)
  redis.call('HSET', run, 'status', status, 'result', result, 'error', err, 'lock_owner', '',
    'wake_at', '', 'waiting_for', '', 'finished_at', now, 'updated_at', now, 'jnl', 1,
    'suspect', '')
  -- One write moves the run from the running part of :times (its lock expiry) to the
  -- ended part (its finish time - ENDED).
  zadd_new(base .. ':times', tonumber(now) - ENDED, id)
  if not was_running then redis.call('ZREM', base .. ':timers', id) end
  ttl = tonumber(ttl)
  local done = base .. ':done:' .. id
  -- Only a run somebody waits on gets a token (waiters mark the record first, in the
  -- same slot, so a finish and a new waiter are ordered).
  if waiter == '1' then redis.call('RPUSH', done, status) end
  if ttl and ttl > 0 then
    redis.call('EXPIRE', run, ttl)
    redis.call('EXPIRE', jnlk(base, id), ttl)
    if waiter == '1' then redis.call('EXPIRE', done, math.min(ttl, 600)) end
    if idem and idem ~= '' then redis.call('EXPIRE', base .. ':idem:' .. idem, ttl) end
    -- Forget index entries of runs that have expired, a batch every 16th finish or so
    -- (the run id's last hex digit decides, so no randomness is needed).
    if string.sub(id, -1) == '0' then
      local old = redis.call('ZRANGEBYSCORE', base .. ':times', '-inf',
        tonumber(now) - ttl - ENDED, 'LIMIT', 0, 256)
      if #old > 0 then
        redis.call('ZREM', base .. ':times', unpack(old))
        redis.call('ZREM', base .. ':index', unpack(old))
      end
    end
  end
end

local function requeue_run(base, id, now, reason, crash, max_retries, retry_ttl, detail, ttl)
  -- A running run goes back to its queue (or ends: quarantined, or cancelled). Charged a
  -- crash, or a suspect already, it goes back among the shard's suspects (enqueue).
  local run = runk(base, id)
  local f = redis.call('HMGET', run, 'crashes', 'cancel', 'owner', 'idem', 'waiter', 'jnl')
  if not f[6] then redis.call('HSET', run, 'jnl', 1) end
  local function push(ev) journal_push(base, id, f[6], true, ev); f[6] = '1' end
  local requeued = {reason = reason}
  local evidence = cjson.decode(detail)
  if type(evidence) == 'table' and next(evidence) ~= nil then requeued.detail = evidence end
  if crash == '1' then
    local crashes = cjson.decode(f[1] or '[]')
    local live = {}
    for _, t in ipairs(crashes) do
      if tonumber(now) - t < tonumber(retry_ttl) then live[#live + 1] = t end
    end
    live[#live + 1] = tonumber(now)
    redis.call('HSET', run, 'crashes', cjson.encode(live), 'suspect', '1')
    requeued.crashes = #live
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
      push(event('run:error', now, {code = err.code, error_type = err.error_type,
        message = err.message, detail = d}))
      finish_run(base, id, 'failed', now, 'null', cjson.encode(err), ttl, true, f[4], f[5])
      return 1
    end
  end
  if f[2] == '1' then
    push(event('run:cancelled', now))
    finish_run(base, id, 'cancelled', now, 'null', '', ttl, true, f[4], f[5])
    return 0
  end
  push(event('run:requeued', now, requeued))
  enqueue(base, id, f[3], now)
  return 0
end
