-- submit: create a queued run (idempotency key checked in the same step).
-- ARGV: op, run_id, name, owner, params_json, now, idempotency_key|'', submitted_event,
--       start_id|''
-- returns {run_id, created (1|0)}
ops.submit = function(k, a)
  local base, id, name, owner, params, now, idem, ev, start_id =
    k[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9]
  if idem ~= '' then
    local existing = redis.call('GET', base .. ':idem:' .. idem)
    if existing then return {existing, 0} end
    redis.call('SET', base .. ':idem:' .. idem, id)
  end
  if start_id == '' then start_id = id end
  redis.call('HSET', runk(base, id), 'name', name, 'owner', owner, 'params', params,
    'status', 'queued', 'attempt', 0, 'created_at', now, 'updated_at', now, 'idem', idem,
    'start_id', start_id, 'parked_seq', 0, 'cancel', 0, 'crashes', '[]')
  redis.call('RPUSH', jnlk(base, id), ev)
  redis.call('ZADD', base .. ':index', now, id)
  enqueue(base, id, owner, now, true)
  return {id, 1}
end
