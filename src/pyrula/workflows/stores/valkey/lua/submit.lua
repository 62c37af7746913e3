-- submit: create a queued run (idempotency key checked in the same step). Atomic.
-- KEYS: base [, ready zset, bell list] (the doorbell, on one server only: on a cluster it
--       lives in another slot and the caller rings it when told to)
-- ARGV: op, run_id, name, owner, params_json, now, idempotency_key|'', start_id|''
--       [, priority 1..9 (absent, or '' when keys follow, for 0)
--        [, concurrency key|'', rate key|'' (a run of a workflow with per-key limits:
--           it waits in its key's line, zy_limits)]]
-- returns {run_id, created (1|0), ring (1 when the doorbell must ring and was not rung
--          here: see enqueue)}
-- The run:submitted event is not written: the record holds what it says (see 00_lib).
ops.submit = function(k, a)
  local base, id, name, owner, params, now, idem, start_id =
    k[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8]
  local run_id, created, rings = new_run(base, id, name, owner, params, now, idem, start_id,
    a[9], a[10], a[11])
  if not created then return {run_id, 0, 0} end
  if not rings then return {id, 1, 0} end
  if k[2] == nil then return {id, 1, 1} end
  ring(k[2], k[3], id, now)
  return {id, 1, 0}
end
