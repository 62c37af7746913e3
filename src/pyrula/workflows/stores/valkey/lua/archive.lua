-- Archiving support (ArchivingStore over a ValkeyStore).

-- expire_finished: let archived runs' live copies lapse sooner. Never lengthens a TTL and
-- never touches a run that has not ended, nor one that continued as new (a chain's earlier
-- runs keep completed_ttl). ARGV op, ttl, run_id... -> number shortened
ops.expire_finished = function(k, a)
  local base, ttl = k[1], tonumber(a[2])
  local n = 0
  for i = 3, #a do
    local id = a[i]
    local run = runk(base, id)
    local st = redis.call('HGET', run, 'status')
    if st == 'completed' or st == 'failed' or st == 'cancelled' then
      for _, key in ipairs({run, jnlk(base, id), base .. ':done:' .. id}) do
        local left = redis.call('TTL', key)
        if left == -1 or left > ttl then redis.call('EXPIRE', key, ttl) end
      end
      n = n + 1
    end
  end
  return n
end
