-- The namespace's meta hash. KEYS[1] = "<ns>:meta".

-- register: record a workflow name with the store's shard count, and the namespace's data
-- format if none is recorded yet, in one step: two stores registering their first names
-- at once must not each take the other's name for a sign of an older layout.
-- A namespace holding names but no format was written by a build older than the format's
-- record (format 1); its format is not written, nor is the name.
-- ARGV: op, name, shard_count, format [, limited (1: a worker serving the name has
--       per-key limits; its runs are all queued on shard 0)]
-- returns {format found, the name's recorded shard count (false when the format
--          differs), 1 when the name is recorded as limited (else false)}
ops.register = function(k, a)
  local meta, name, count, format = k[1], a[2], a[3], a[4]
  local found = redis.call('HGET', meta, 'format')
  if not found then
    for _, field in ipairs(redis.call('HKEYS', meta)) do
      if string.sub(field, 1, 7) == 'shards:' then return {'1', false} end
    end
    redis.call('HSET', meta, 'format', format)
    found = format
  end
  if found ~= format then return {found, false} end
  redis.call('HSETNX', meta, 'shards:' .. name, count)
  if a[5] == '1' then redis.call('HSET', meta, 'limited:' .. name, 1) end
  return {found, redis.call('HGET', meta, 'shards:' .. name),
    redis.call('HEXISTS', meta, 'limited:' .. name) == 1 and 1 or false}
end
