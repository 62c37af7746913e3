-- Events and batch triggers (docs/valkey.md, "Events and batch triggers").
--
-- A topic's events live in its own slot, "<ns>:{tp.<topic hash>}" (the base T):
-- :log (zset seq -> element), :seq (the last seq given), :key:<key> (an emit key -> the
-- event id), :subs (hash: workflow name -> the seq up to which its trigger has copied
-- the log, or the seq it subscribed at).
-- A workflow W triggered by the topic keeps what is pending for it in the shard its
-- batch runs are queued on, "<ns>:{<W hash>.<shard>}" (base B; the shard is the topic
-- hash modulo W's shard count): :tp:<topic hash>:wm (the seq up to which the log is
-- copied here), :tp:<topic hash>:q:<owner> (FIFO of pending elements of one owner),
-- :tp:<topic hash>:owners (zset owner -> emit time of its oldest pending event).
-- So taking a batch and queueing its run is one script on one slot; copying the log into
-- B copies only what is after :wm, so a second copier (or a retry) copies nothing twice.
--
-- An element is a header and the event as a batch run's params list it, on two lines:
-- '[emitted_at, owner, key|null, event id]\n{"id":...,"key":...,"payload":...,
-- "emitted_at":"...Z"}' (orjson writes no raw newline), so scripts never decode a payload
-- (cjson would round its numbers).

local function trig_header(e)
  return cjson.decode(string.sub(e, 1, string.find(e, '\n', 1, true) - 1))
end

local function trig_body(e)
  return string.sub(e, string.find(e, '\n', 1, true) + 1)
end

-- emit (base T): ARGV op, event_id, key|'', element -> {event id, created 1|0}
ops.emit = function(k, a)
  local base, id, key, element = k[1], a[2], a[3], a[4]
  if key ~= '' then
    local existing = redis.call('GET', base .. ':key:' .. key)
    if existing then return {existing, 0} end
    redis.call('SET', base .. ':key:' .. key, id)
  end
  -- The seq by GET and SET (the script is atomic): the store's documented command set.
  local seq = tonumber(redis.call('GET', base .. ':seq') or '0') + 1
  redis.call('SET', base .. ':seq', seq)
  redis.call('ZADD', base .. ':log', seq, element)
  return {id, 1}
end

local function trig_prune(base, ttl)
  -- Drop the log's events every subscription has copied (a batch at a time); their emit
  -- keys are kept for ttl more seconds (0: for ever).
  local low = nil
  local subs = redis.call('HGETALL', base .. ':subs')
  for i = 2, #subs, 2 do
    if low == nil or tonumber(subs[i]) < low then low = tonumber(subs[i]) end
  end
  if low == nil or low <= 0 then return end
  local old = redis.call('ZRANGEBYSCORE', base .. ':log', '-inf', low, 'LIMIT', 0, 1000)
  for _, e in ipairs(old) do
    local key = trig_header(e)[3]
    if type(key) == 'string' and tonumber(ttl) > 0 then
      redis.call('EXPIRE', base .. ':key:' .. key, ttl)
    end
  end
  if #old > 0 then redis.call('ZREM', base .. ':log', unpack(old)) end
end

-- trigger_route (base T): ARGV op, name, confirmed ('' unknown: the :wm W's store last
-- answered), limit, key_ttl -> {from, [element, seq]...}: the log after `from`, at most
-- limit. Subscribes `name` if new: the topic's first subscription from the log's start,
-- a later one from its end. A confirmed copy moves the subscription on (and prunes).
ops.trigger_route = function(k, a)
  local base, name, confirmed, limit = k[1], a[2], a[3], a[4]
  local subs = base .. ':subs'
  local from = tonumber(redis.call('HGET', subs, name) or '-1')
  if from < 0 then
    from = 0
    if #redis.call('HKEYS', subs) > 0 then
      from = tonumber(redis.call('GET', base .. ':seq') or '0')
    end
    redis.call('HSET', subs, name, from)
  end
  if confirmed ~= '' and tonumber(confirmed) > from then
    from = tonumber(confirmed)
    redis.call('HSET', subs, name, from)
    trig_prune(base, a[5])
  end
  local rows = redis.call('ZRANGEBYSCORE', base .. ':log', '(' .. from, '+inf', 'WITHSCORES',
    'LIMIT', 0, limit)
  return {from, rows}
end

local function trig_copy(t, a, from)
  -- Copy the log's events after `from` (ARGV a[13..]: element, seq, element, seq...) that
  -- are after the mark :wm too; none if the mark is before `from` (the read would leave a
  -- gap). Events at or below the mark were copied already: each is copied once.
  local wm = tonumber(redis.call('GET', t .. ':wm') or '')
  if wm ~= nil and wm < from then return end
  local last = wm or from
  for i = 13, #a, 2 do
    local seq = tonumber(a[i + 1])
    if seq > last then
      local h = trig_header(a[i])
      local q = t .. ':q:' .. h[2]
      if redis.call('RPUSH', q, a[i]) == 1 then redis.call('ZADD', t .. ':owners', h[1], h[2]) end
      last = seq
    end
  end
  redis.call('SET', t .. ':wm', last)
end

local function trig_start(base, t, owner, c)
  -- Take the owner's oldest pending events (at most c.max_size) and queue their run.
  -- Returns the run's id and whether the doorbell must ring.
  local q = t .. ':q:' .. owner
  local taken = redis.call('LPOP', q, c.max_size)
  local head = redis.call('LRANGE', q, 0, 0)[1]
  if head then
    redis.call('ZADD', t .. ':owners', trig_header(head)[1], owner)
  else
    redis.call('ZREM', t .. ':owners', owner)
  end
  local bodies = {}
  for i, e in ipairs(taken) do bodies[i] = trig_body(e) end
  local first = trig_header(taken[1])[4]
  -- The run id: the shard's prefix, the first event's time digits, its last 12 digits.
  local id = c.prefix .. string.sub(first, 1, 12) .. string.sub(first, -12)
  local params = c.params .. table.concat(bodies, ',') .. ']}'
  local run_id, created, rings = new_run(base, id, c.name, owner, params, c.now,
    'trigger:' .. c.topic .. ':' .. first, '')
  return run_id, created and rings
end

-- trigger_take (base B [, ready zset, bell list] as submit): ARGV op, name, topic hash,
-- topic, from, to, max_size, max_wait, now, limit, run id prefix (name hash and shard),
-- params prefix ('{"topic":...,"events":['), then element, seq... (the log after `from`
-- up to `to`) -> {wm, ring 1|0, run id...}. Copies what of the log is new here
-- (trig_copy), then starts up to limit runs, one per due batch, oldest owner first.
ops.trigger_take = function(k, a)
  local base, th = k[1], a[3]
  local c = {name = a[2], topic = a[4], max_size = tonumber(a[7]), max_wait = tonumber(a[8]),
    now = a[9], prefix = a[11], params = a[12]}
  local t = base .. ':tp:' .. th
  if #a > 12 then trig_copy(t, a, tonumber(a[5])) end
  local wm = redis.call('GET', t .. ':wm')
  local out = {wm or '', 0}
  local due_by = tonumber(c.now) - c.max_wait
  local owners = redis.call('ZRANGE', t .. ':owners', 0, -1, 'WITHSCORES')
  for i = 1, #owners, 2 do
    local owner, oldest = owners[i], tonumber(owners[i + 1])
    local q = t .. ':q:' .. owner
    while #out - 2 < tonumber(a[10]) and oldest do
      local n = redis.call('LLEN', q)
      if n == 0 or (n < c.max_size and oldest > due_by) then break end
      local id, rings = trig_start(base, t, owner, c)
      out[#out + 1] = id
      if rings and k[2] then ring(k[2], k[3], id, c.now) elseif rings then out[2] = 1 end
      oldest = tonumber(redis.call('ZSCORE', t .. ':owners', owner))
    end
  end
  return out
end
