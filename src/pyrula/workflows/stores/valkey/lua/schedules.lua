-- Schedules. KEYS[1] = "<ns>:{schedules}": every schedule shares that one slot.
-- :s:<id> (hash def, name, paused, next, last_run, last_run_at), :ids (zset id -> 0),
-- :due:<name> (zset id -> next run time, unpaused schedules of one workflow name).
-- Definitions are JSON written by the client; scripts never decode them (cjson would
-- round the params' numbers), they only move the state fields beside them.

local function sched_row(base, id)
  local f = redis.call('HMGET', base .. ':s:' .. id, 'def', 'paused', 'next', 'last_run',
    'last_run_at')
  if not f[1] then return nil end
  return {id, f[1], f[2] or '0', f[3] or '0', f[4] or '', f[5] or ''}
end

-- schedule_put: ARGV op, id, name, def, next -> the row as stored
-- (replaces the definition, unpauses, sets next; keeps the last run)
ops.schedule_put = function(k, a)
  local base, id, name, nxt = k[1], a[2], a[3], a[5]
  local s = base .. ':s:' .. id
  local old = redis.call('HGET', s, 'name')
  if old then redis.call('ZREM', base .. ':due:' .. old, id) end
  redis.call('HSET', s, 'def', a[4], 'name', name, 'paused', '0', 'next', nxt)
  redis.call('ZADD', base .. ':ids', 0, id)
  redis.call('ZADD', base .. ':due:' .. name, nxt, id)
  return sched_row(base, id)
end

-- schedule_delete: ARGV op, id -> 1 if it existed, else 0
ops.schedule_delete = function(k, a)
  local base, id = k[1], a[2]
  local s = base .. ':s:' .. id
  local name = redis.call('HGET', s, 'name')
  if not name then return 0 end
  redis.call('ZREM', base .. ':due:' .. name, id)
  redis.call('ZREM', base .. ':ids', id)
  redis.call('DEL', s)
  return 1
end

-- schedule_get: ARGV op, id... -> rows {id, def, paused, next, last_run, last_run_at}
-- of those that exist; no id means every schedule, by id
ops.schedule_get = function(k, a)
  local base = k[1]
  local ids = {}
  if #a > 1 then
    for i = 2, #a do ids[#ids + 1] = a[i] end
  else
    ids = redis.call('ZRANGE', base .. ':ids', 0, -1)
  end
  local rows = {}
  for _, id in ipairs(ids) do
    local row = sched_row(base, id)
    if row then rows[#rows + 1] = row end
  end
  return rows
end

-- schedule_due: ARGV op, now, limit, name... -> rows of unpaused schedules of the names
-- due at now (up to limit per name; the client orders and cuts them)
ops.schedule_due = function(k, a)
  local base, now, limit = k[1], a[2], tonumber(a[3])
  local rows = {}
  for i = 4, #a do
    local ids = redis.call('ZRANGEBYSCORE', base .. ':due:' .. a[i], '-inf', now,
      'LIMIT', 0, limit)
    for _, id in ipairs(ids) do
      local row = sched_row(base, id)
      if row then rows[#rows + 1] = row end
    end
  end
  return rows
end

-- schedule_advance: ARGV op, id, expected next|'', new next|'', run id|'', run at|''
-- -> 1 if next moved from expected to new, else 0. The run becomes the last run unless
-- one submitted later is recorded, whatever the compare found.
ops.schedule_advance = function(k, a)
  local base, id = k[1], a[2]
  local s = base .. ':s:' .. id
  local f = redis.call('HMGET', s, 'name', 'next', 'paused', 'last_run_at')
  if not f[1] then return 0 end
  if a[5] ~= '' then
    if not f[4] or f[4] == '' or a[6] == '' or tonumber(a[6]) >= tonumber(f[4]) then
      redis.call('HSET', s, 'last_run', a[5], 'last_run_at', a[6])
    end
  end
  if a[3] == '' or a[4] == '' or tonumber(f[2]) ~= tonumber(a[3]) then return 0 end
  redis.call('HSET', s, 'next', a[4])
  if f[3] ~= '1' then redis.call('ZADD', base .. ':due:' .. f[1], a[4], id) end
  return 1
end

-- schedule_pause: ARGV op, id, paused '1'|'0', next|'' -> 1, or 0 if unknown
ops.schedule_pause = function(k, a)
  local base, id = k[1], a[2]
  local s = base .. ':s:' .. id
  local name = redis.call('HGET', s, 'name')
  if not name then return 0 end
  redis.call('HSET', s, 'paused', a[3])
  if a[4] ~= '' then redis.call('HSET', s, 'next', a[4]) end
  if a[3] == '1' then
    redis.call('ZREM', base .. ':due:' .. name, id)
  else
    redis.call('ZADD', base .. ':due:' .. name, redis.call('HGET', s, 'next'), id)
  end
  return 1
end
