-- Run control from clients.

-- The live run of id's continue_as_new chain, which takes over the chain's inbox: id
-- itself unless it continued. The chain's tail record (:chain:<start id>) names it in one
-- step while the chain runs; once that has expired, successor_id leads there run by run.
-- A start id whose own record expired is found by its tail record too.
local function chain_live(base, id)
  local f = redis.call('HMGET', runk(base, id), 'status', 'successor_id', 'start_id')
  if not f[1] then return redis.call('GET', base .. ':chain:' .. id) or id end
  if f[1] ~= 'continued' then return id end
  local tail = redis.call('GET', base .. ':chain:' .. tostring(f[3]))
  if tail then return tail end
  while f[1] == 'continued' and f[2] and f[2] ~= '' do
    id = f[2]
    f = redis.call('HMGET', runk(base, id), 'status', 'successor_id')
  end
  return id
end

local function wake_waiting(base, id, status, waiting_for, owner, name, now)
  -- Queue a run that waits for `name` (`waiting_for`: its record's JSON list): 'QUEUED';
  -- 'OK' for any other.
  if status == 'waiting' and waiting_for and waiting_for ~= '' then
    for _, w in ipairs(cjson.decode(waiting_for)) do
      if w == name then
        enqueue(base, id, owner, now)
        return 'QUEUED'
      end
    end
  end
  return 'OK'
end

-- signal: ARGV op, run_id, now, name, event -> 'NOTFOUND' | 'ENDED <status>' | 'OK' | 'QUEUED'
-- (delivered to the live run of run_id's chain: chain_live)
ops.signal = function(k, a)
  local base, now, name, ev = k[1], a[3], a[4], a[5]
  local id = chain_live(base, a[2])
  local run = runk(base, id)
  local f = redis.call('HMGET', run, 'status', 'waiting_for', 'owner', 'jnl', 'started_at')
  if not f[1] then return 'NOTFOUND' end
  local status = f[1]
  if status == 'completed' or status == 'failed' or status == 'cancelled'
    or status == 'continued' then
    return 'ENDED ' .. status
  end
  local len = journal_push(base, id, f[4], f[5], ev)
  redis.call('HSET', run, 'sig:' .. name, len, 'updated_at', now, 'jnl', 1)
  return wake_waiting(base, id, status, f[2], f[3], name, now)
end

-- nudge: ARGV op, run_id, now, name -> 'NOTFOUND' | 'MARKED' | 'QUEUED' | 'OK'
-- A child of run_id has ended; nothing is written in run_id's journal. A running run is
-- marked (its next park waiting for `name` does not park, see park); one waiting for
-- `name` is queued; any other is left as it is (its next attempt looks anyway).
ops.nudge = function(k, a)
  local base, id, now, name = k[1], a[2], a[3], a[4]
  local run = runk(base, id)
  local f = redis.call('HMGET', run, 'status', 'waiting_for', 'owner')
  if not f[1] then return 'NOTFOUND' end
  if f[1] == 'running' then
    redis.call('HSET', run, 'nudged', name)
    return 'MARKED'
  end
  return wake_waiting(base, id, f[1], f[2], f[3], name, now)
end

-- cancel: ARGV op, run_id, now, completed_ttl -> 'NOTFOUND' | 'ENDED' | 'CANCELLED' | 'REQUESTED'
ops.cancel = function(k, a)
  local base, id, now = k[1], a[2], a[3]
  local run = runk(base, id)
  local f = redis.call('HMGET', run, 'status', 'owner', 'jnl', 'idem', 'waiter', 'started_at',
    'prio', 'held')
  if not f[1] then return 'NOTFOUND' end
  local status = f[1]
  if status == 'completed' or status == 'failed' or status == 'cancelled'
    or status == 'continued' then
    return 'ENDED'
  end
  if status == 'running' then
    redis.call('HSET', run, 'cancel', 1, 'updated_at', now)
    return 'REQUESTED'
  end
  if status == 'queued' then dequeue(base, id, f[2], f[7], f[8]) end
  journal_push(base, id, f[3], f[6], event('run:cancelled', now))
  finish_run(base, id, 'cancelled', now, 'null', '', a[4], false, f[4], f[5])
  return 'CANCELLED'
end

-- wake_run: ARGV op, run_id, now -> 'NOTFOUND' | 'NO' | 'WOKEN'
ops.wake_run = function(k, a)
  local base, id, now = k[1], a[2], a[3]
  local run = runk(base, id)
  local f = redis.call('HMGET', run, 'status', 'owner')
  if not f[1] then return 'NOTFOUND' end
  if f[1] ~= 'sleeping' then return 'NO' end
  redis.call('RPUSH', jnlk(base, id), event('run:woken', now, {reason = 'manual'}))
  enqueue(base, id, f[2], now)
  return 'WOKEN'
end
