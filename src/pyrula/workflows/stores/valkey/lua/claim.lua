-- Taking queued runs: the lock, the fencing token (attempt), run:started, the journal.

-- Is `s` well-formed UTF-8 (as Python's decode wants it: no overlong forms, surrogates
-- or code points past U+10FFFF)?
local function utf8_ok(s)
  local i, n = 1, #s
  while i <= n do
    local c = s:byte(i)
    local len, lo, hi = 0, 0x80, 0xBF
    if c < 0x80 then len = 1
    elseif c >= 0xC2 and c <= 0xDF then len = 2
    elseif c >= 0xE0 and c <= 0xEF then
      len = 3
      if c == 0xE0 then lo = 0xA0 elseif c == 0xED then hi = 0x9F end
    elseif c >= 0xF0 and c <= 0xF4 then
      len = 4
      if c == 0xF0 then lo = 0x90 elseif c == 0xF4 then hi = 0x8F end
    else return false end
    if i + len - 1 > n then return false end
    for j = i + 1, i + len - 1 do
      local b = s:byte(j)
      if b < lo or b > hi then return false end
      lo, hi = 0x80, 0xBF
    end
    i = i + len
  end
  return true
end

local function fork_origin(key, started)
  -- A fork's first run:started names its origin, from its key
  -- fork:<run>:<call>:<nonce>[.<step, UTF-8 in lower-case hex>] (as forks.fork_origin
  -- does, for the other stores and an implied run:started).
  local origin, call, tail = string.match(key, '^fork:(.+):(%d+):([^:]*)$')
  if not origin then return end
  started.forked_from = origin; started.from_call = tonumber(call)
  local hex = string.match(tail, '^[^.]*%.([0-9a-f]+)$')
  if hex and #hex % 2 == 0 then
    local step = string.gsub(hex, '..', function(h) return string.char(tonumber(h, 16)) end)
    if utf8_ok(step) then started.from_step = step end
  end
end

local function take(base, id, worker, now, expires, build)
  -- Lock one dequeued run for `worker`, which serves `build` ('' for none: run:started
  -- then records no build). Its entry in :times is the caller's to add.
  local run = runk(base, id)
  local f = redis.call('HMGET', run, 'name', 'params', 'owner', 'start_id', 'created_at',
    'parked_seq', 'attempt', 'started_at', 'idem', 'jnl', 'predecessor', 'w1', 'crashes', 'b1',
    'suspect', 'lc', 'lr')
  local attempt = tonumber(f[7] or '0') + 1
  local fields = {'status', 'running', 'attempt', attempt, 'lock_owner', worker,
    'lock_expires', expires, 'updated_at', now}
  local journal
  if not f[10] then
    -- Nothing was written for this run yet: its run:started is implied by the record.
    fields[#fields + 1] = 'started_at'; fields[#fields + 1] = now
    fields[#fields + 1] = 'w1'; fields[#fields + 1] = worker
    if build ~= '' then fields[#fields + 1] = 'b1'; fields[#fields + 1] = build end
    f[8], f[12], f[14] = now, worker, build
    journal = {'', ''}
  end
  redis.call('HSET', run, unpack(fields))
  local from = tonumber(f[6] or '0')
  if not journal then
    local started = {attempt = attempt, worker = worker, build = build ~= '' and build or nil}
    if attempt == 1 and f[9] then fork_origin(f[9], started) end
    redis.call('RPUSH', jnlk(base, id), event('run:started', now, started))
    journal = redis.call('LRANGE', jnlk(base, id), from, -1)
  end
  return {id, f[1], f[2], f[3], attempt, f[4], f[5], from, journal, f[9] or '', f[11] or '',
    f[8] or '', f[12] or '', f[13] or '[]', f[14] or '', f[15] or '', f[16] or '', f[17] or ''}
end

local function unring_if_empty(k, base, limited)
  -- On one server the claim takes a shard it left with nothing queued (suspects, and for
  -- a `limited` name the runs waiting in its keys' lines, included) out of the doorbell
  -- (a later submit or requeue rings it again).
  if k[2] and redis.call('EXISTS', base .. ':suspects') == 0
    and redis.call('ZCARD', base .. ':active') == 0
    and not (limited and redis.call('EXISTS', base .. ':lines') == 1) then
    redis.call('ZREM', k[2], tonumber(string.match(base, '%.(%d+)}$')))
  end
end

local function older(a, b)
  -- Run ids carry their creation time (ms, hex digits 17-28): compare those.
  return string.sub(a, 17, 28) < string.sub(b, 17, 28)
end

local function serve(owners, heads, served, caps, limit)
  -- Deficit round robin over the runs read at the head of each owner's queue (least
  -- served first, the older head breaking ties), within the flow-control caps: the run
  -- ids in the order served, and how many each owner gave.
  local taken, at, gave = {}, {}, {}
  for _, owner in ipairs(owners) do at[owner], gave[owner] = 1, 0 end
  while #taken < limit do
    local best = nil
    for _, owner in ipairs(owners) do
      local head = heads[owner][at[owner]]
      local room = caps[owner] == nil or gave[owner] < caps[owner]
      if head and room then
        if best == nil or served[owner] < served[best]
          or (served[owner] == served[best] and older(head, heads[best][at[best]])) then
          best = owner
        end
      end
    end
    if best == nil then break end
    taken[#taken + 1] = heads[best][at[best]]
    at[best] = at[best] + 1
    gave[best] = gave[best] + 1
    served[best] = served[best] + 1
  end
  return taken, gave
end

local function claim_alone(base, owner, want)
  -- One owner queued here, with runs of priority 0 only (the common case): pop its next
  -- runs in one go. Its served count need not move: an owner that appears later starts
  -- level with it anyway. Returns the ids and how many owners left :active (0 or 1).
  local ids = redis.call('LPOP', base .. ':q:' .. owner, want) or {}
  if #ids < want then
    redis.call('ZREM', base .. ':active', owner)
    return ids, 1
  end
  return ids, 0
end

local function claim_fifos(base, owners, served, caps, limit)
  -- Several owners, runs of priority 0 only: read the head of each FIFO once, serve in
  -- DRR order, then trim each FIFO by what it gave. Returns the ids and how many owners
  -- left :active.
  local active, heads, gone = base .. ':active', {}, 0
  for _, owner in ipairs(owners) do
    heads[owner] = redis.call('LRANGE', base .. ':q:' .. owner, 0, limit - 1)
    if #heads[owner] == 0 then  -- listed with nothing queued: forget it
      redis.call('ZREM', active, owner)
      gone = gone + 1
    end
  end
  local taken, gave = serve(owners, heads, served, caps, limit)
  for _, owner in ipairs(owners) do
    local n, q = gave[owner], base .. ':q:' .. owner
    if n > 0 and n >= #heads[owner] and #heads[owner] < limit then
      redis.call('DEL', q)  -- it gave every run it had
      redis.call('ZREM', active, owner)
      gone = gone + 1
    elseif n > 0 then
      redis.call('LTRIM', q, n, -1)
      redis.call('ZINCRBY', active, n, owner)
    end
  end
  return taken, gone
end

local function read_ranked(base, owner, digits, limit)
  -- Up to `limit` ids from the head of an owner's queues in claim order (its lists of
  -- priorities `digits`, highest first, then its FIFO of priority 0), and what was read
  -- of each: {list key, priority digit, ids read}.
  local heads, read = {}, {}
  local ps = {}
  for d in string.gmatch(digits or '', '%d') do ps[#ps + 1] = d end
  ps[#ps + 1] = '0'
  for _, p in ipairs(ps) do
    local q = base .. ':q:' .. owner
    if p ~= '0' then q = pqk(base, owner, p) end
    local got = 0
    if #heads < limit then
      for _, id in ipairs(redis.call('LRANGE', q, 0, limit - #heads - 1)) do
        heads[#heads + 1] = id
        got = got + 1
      end
    end
    read[#read + 1] = {q, p, got}
  end
  return heads, read
end

local function trim_ranked(base, owner, read, n, digits)
  -- Take an owner's first n ids read (read_ranked) out of its queues and keep its entry
  -- in :prio right. Returns true when the owner still has runs queued here.
  local left, plain = '', false
  for _, r in ipairs(read) do
    local q, p, got = r[1], r[2], r[3]
    local m = math.min(n, got)
    n = n - m
    if m > 0 then redis.call('LTRIM', q, m, -1) end
    if m < got or redis.call('EXISTS', q) == 1 then
      if p == '0' then plain = true else left = left .. p end
    end
  end
  if left ~= (digits or '') then set_digits(base, owner, left) end
  return plain or left ~= ''
end

local function claim_ranked(base, owners, served, caps, limit, prio)
  -- Some owner here has runs of a priority above 0 (`prio`: owner -> its digits): as
  -- claim_fifos, each owner's runs read highest priority first. Returns the ids and how
  -- many owners left :active.
  local active, heads, reads, gone = base .. ':active', {}, {}, 0
  for _, owner in ipairs(owners) do
    heads[owner], reads[owner] = read_ranked(base, owner, prio[owner], limit)
    if #heads[owner] == 0 then  -- listed with nothing queued: forget it
      redis.call('ZREM', active, owner)
      if prio[owner] then redis.call('HDEL', base .. ':prio', owner) end
      gone = gone + 1
    end
  end
  local taken, gave = serve(owners, heads, served, caps, limit)
  for _, owner in ipairs(owners) do
    local n = gave[owner]
    if n > 0 and trim_ranked(base, owner, reads[owner], n, prio[owner]) then
      redis.call('ZINCRBY', active, n, owner)
    elseif n > 0 then
      redis.call('ZREM', active, owner)
      gone = gone + 1
    end
  end
  return taken, gone
end

local function listed_owners(base, caps)
  -- The first 64 owners queued here (least served first) that flow control lets start
  -- one, their served counts, and how many were listed.
  local listed = redis.call('ZRANGE', base .. ':active', 0, 63, 'WITHSCORES')
  local owners, served = {}, {}
  for i = 1, #listed, 2 do
    local owner = listed[i]
    if caps[owner] == nil or caps[owner] > 0 then
      owners[#owners + 1] = owner
      served[owner] = tonumber(listed[i + 1])
    end
  end
  return owners, served, #listed / 2
end


-- claim: up to `limit` queued runs of this shard for `worker`, by deficit round robin
-- over owners (least served first, oldest head breaking ties), within an owner its
-- highest priority first, FIFO within a priority. The suspects put aside here are never
-- taken (claim_suspect takes them one at a time). Atomic (one script).
-- KEYS: base [, the name's doorbell (one server only): a claim that empties the shard
--       takes it out there (a later submit rings it again)]
-- ARGV: op, worker, now, lock_expires, limit, build ('' for none), [owner, cap]...
-- (flow-controlled owners may take at most cap runs; cap 0 blocks the owner)
-- returns {{{run_id, name, params, owner, attempt, start_id, created_at, base_seq,
--           {journal after base_seq}, idempotency_key, predecessor, started_at,
--           first worker, crashes (JSON list of times), first build, suspect ('1'),
--           concurrency key, rate key}...},
--          owners still queued (at least 1 while runs wait in a limited name's lines),
--          suspects waiting here}
-- (a shard that holds suspects only stays in the doorbell, so claims keep visiting it and
-- tell their workers that suspects wait; ARGV's field `limited`, set by claim_limited and
-- claim_away (zy_limits.lua), keeps a shard whose lines hold runs there too)
ops.claim = function(k, a)
  local base, worker, now, expires, limit = k[1], a[2], a[3], a[4], tonumber(a[5])
  local build = a[6] or ''
  local caps = {}
  for i = 7, #a, 2 do caps[a[i]] = tonumber(a[i + 1]) end
  local owners, served, listed = listed_owners(base, caps)
  local ranked = redis.call('HGETALL', base .. ':prio')
  local taken, gone = {}, 0
  if #ranked > 0 then
    local prio = {}
    for i = 1, #ranked, 2 do prio[ranked[i]] = ranked[i + 1] end
    taken, gone = claim_ranked(base, owners, served, caps, limit, prio)
  elseif #owners == 1 and listed == 1 then
    taken, gone = claim_alone(base, owners[1], math.min(limit, caps[owners[1]] or limit))
  elseif #owners > 0 then
    taken, gone = claim_fifos(base, owners, served, caps, limit)
  end
  local left = listed - gone
  if listed >= 64 then left = redis.call('ZCARD', base .. ':active') end
  local out, locks = {}, {}
  for i, id in ipairs(taken) do
    out[i] = take(base, id, worker, now, expires, build)
    locks[#locks + 1] = expires
    locks[#locks + 1] = id
  end
  if #locks > 0 then zadd_new(base .. ':times', unpack(locks)) end
  local suspects = redis.call('LLEN', base .. ':suspects')
  if not a.limited then
    if left == 0 then unring_if_empty(k, base, false) end
    return {out, left, suspects}
  end
  local lines = redis.call('ZCARD', base .. ':lines')
  if left == 0 and lines > 0 then left = 1 end
  if left == 0 then unring_if_empty(k, base, true) end
  return {out, left, suspects, lines}
end


-- claim_suspect: of the first 64 suspects put aside on this shard whose owners flow
-- control lets start, the one with the most crashes (a poison run is found sooner), then
-- the longest-waiting, for `worker`, which runs it alone.
-- KEYS: base [, the name's doorbell (one server only), as claim]
-- ARGV: op, worker, now, lock_expires, build ('' for none), [owner, cap]... (as claim)
-- returns the run as claim returns each, or nil
ops.claim_suspect = function(k, a)
  local base, worker, now, expires = k[1], a[2], a[3], a[4]
  local caps = {}
  for i = 6, #a, 2 do caps[a[i]] = tonumber(a[i + 1]) end
  local list = base .. ':suspects'
  local chosen, most, keys = nil, -1, nil
  for _, id in ipairs(redis.call('LRANGE', list, 0, 63)) do
    local f = redis.call('HMGET', runk(base, id), 'owner', 'crashes', 'lc', 'lr')
    if caps[f[1]] == nil or caps[f[1]] > 0 then
      local crashes = #cjson.decode(f[2] or '[]')
      if crashes > most then chosen, most, keys = id, crashes, f end
    end
  end
  if not chosen then return nil end
  local limited = a.max or a.rate
  if limited then
    local lim = limits()
    if not lim.room(base, keys[3], keys[4], a.max, a.rate, now, nil) then
      return nil
    end
    lim.took_slot(base, chosen, keys[3])
  end
  redis.call('LREM', list, 1, chosen)
  zadd_new(base .. ':times', expires, chosen)
  local row = take(base, chosen, worker, now, expires, a[5] or '')
  unring_if_empty(k, base, limited)
  return row
end

-- claim_run: claim this one run if it is queued (one waiting in its key's line, or a
-- suspect with keys, only if its limits let it start).
-- ARGV: op, run_id, worker, now, expires, build ('' for none) [, max|'', rate|'']
ops.claim_run = function(k, a)
  local base, id, expires = k[1], a[2], a[5]
  local f = redis.call('HMGET', runk(base, id), 'status', 'owner', 'prio', 'held', 'suspect',
    'lc', 'lr')
  if f[1] ~= 'queued' then return nil end
  if f[4] or (f[5] == '1' and (f[6] or f[7])) then
    local lim = limits()
    local max, rate = lim.limits_at(a, 7)
    if not lim.room(base, f[6], f[7], max, rate, a[4], nil) then return nil end
    lim.took_slot(base, id, f[6])
  end
  dequeue(base, id, f[2], f[3], f[4])
  zadd_new(base .. ':times', expires, id)
  return take(base, id, a[3], a[4], expires, a[6] or '')
end

-- queue_stats: how many runs this shard's queues hold (every priority's, its put-aside
-- suspects and the runs waiting in its keys' lines too), and
-- since when the longest-waiting of their heads has been claimable (read only). Each
-- FIFO is in the order its runs became claimable, so its head is its oldest; only the
-- heads are read.
-- KEYS: base
-- ARGV: op
-- returns {depth, oldest: the time as the record holds it ('' when nothing is queued)}
-- A run never claimed became claimable when it was created; one queued again records
-- queued_at (a record queued again by an older build, without it: its updated_at).
ops.queue_stats = function(k, a)
  local base = k[1]
  local depth, oldest, shown = 0, nil, ''
  local queues = {base .. ':suspects'}
  for _, line in ipairs(redis.call('ZRANGE', base .. ':lines', 0, -1)) do
    queues[#queues + 1] = base .. ':line:' .. line
  end
  for _, owner in ipairs(redis.call('ZRANGE', base .. ':active', 0, -1)) do
    queues[#queues + 1] = base .. ':q:' .. owner
  end
  local ranked = redis.call('HGETALL', base .. ':prio')
  for i = 1, #ranked, 2 do
    for d in string.gmatch(ranked[i + 1], '%d') do
      queues[#queues + 1] = pqk(base, ranked[i], d)
    end
  end
  for _, q in ipairs(queues) do
    local head = redis.call('LRANGE', q, 0, 0)[1]
    if head then
      depth = depth + redis.call('LLEN', q)
      local f = redis.call('HMGET', runk(base, head), 'queued_at', 'attempt', 'created_at',
        'updated_at')
      local at = f[1]
      if not at then
        if f[2] == '0' then at = f[3] else at = f[4] end
      end
      if at and (oldest == nil or tonumber(at) < oldest) then
        oldest, shown = tonumber(at), at
      end
    end
  end
  return {depth, shown}
end
