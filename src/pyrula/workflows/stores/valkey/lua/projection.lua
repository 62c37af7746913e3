-- Projections (docs/valkey.md, "Projections").
--
-- A projection keeps its keys in its own slot, "<ns>:{pj.<name hash>}" (the base P):
-- :head (hash: name, version, fp, keyed, cp_at, cp_id, folded, updated_at) and :states
-- (hash: key -> the state as JSON, stored as given: scripts never decode a state).
-- `version` only grows (each save and each reset adds one), so a save's compare-and-set on
-- it cannot succeed on a version a reset went through.

-- projection_save (base P): ARGV op, expected version, reset 1|0, name, fingerprint,
-- keyed 1|0, cp_at|'', cp_id|'', folded, updated_at, [key, state]... -> the new version,
-- or 0 (nothing written) if the stored version is not `expected`. With reset 1 every
-- other state is dropped first.
ops.projection_save = function(k, a)
  local base = k[1]
  local head = base .. ':head'
  local version = tonumber(redis.call('HGET', head, 'version') or '0')
  if version ~= tonumber(a[2]) then return 0 end
  if a[3] == '1' then redis.call('DEL', base .. ':states') end
  if #a > 10 then redis.call('HSET', base .. ':states', unpack(a, 11, #a)) end
  version = version + 1
  redis.call('HSET', head, 'version', version, 'name', a[4], 'fp', a[5], 'keyed', a[6],
    'cp_at', a[7], 'cp_id', a[8], 'folded', a[9], 'updated_at', a[10])
  return version
end

-- projection_reset (base P): ARGV op, updated_at -> 1, or 0 if it was never written.
-- Drops the states, the checkpoint and the fingerprint; the version goes on.
ops.projection_reset = function(k, a)
  local base = k[1]
  local head = base .. ':head'
  local version = redis.call('HGET', head, 'version')
  if not version then return 0 end
  redis.call('DEL', base .. ':states')
  redis.call('HSET', head, 'version', tonumber(version) + 1, 'fp', '', 'cp_at', '',
    'cp_id', '', 'folded', 0, 'updated_at', a[2])
  return 1
end
