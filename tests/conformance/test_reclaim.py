"""Store contract: requeue, the orphan scan (reclaim), poison quarantine, recover_pending_runs."""

from __future__ import annotations

import time

from pyrula.workflows.events import EventType
from pyrula.workflows.records import PoisonPolicy, RequeueOutcome, RunStatus
from pyrula.workflows.stores.base import Store
from tests.conformance.support import (
    T0,
    TTL,
    WF,
    WORKER,
    complete,
    ev,
    info,
    journal,
    running,
    sleep,
    submit,
    take,
    types,
)

LENIENT = PoisonPolicy(max_retries=100, retry_ttl_s=3600.0)


async def test_requeue_appends_its_events_and_queues_the_run(store: Store) -> None:
    claimed = await running(store, now=T0)

    outcome = await store.requeue(
        claimed.run_id, claimed.token, now=T0 + 1, reason="shutdown",
        events=[ev(EventType.STEP_STARTED, T0 + 1, step="s", call=1)],
    )

    assert outcome == RequeueOutcome(claimed.run_id, False)
    assert (await info(store, claimed.run_id)).status == RunStatus.QUEUED
    events = await journal(store, claimed.run_id)
    assert types(events)[2:] == [EventType.STEP_STARTED, EventType.RUN_REQUEUED]
    assert (events[-1]["reason"], events[-1]["ts"]) == ("shutdown", T0 + 1)
    [again] = await store.claim(WORKER, [WF], limit=1, now=T0 + 2, lock_ttl=TTL)
    assert (again.run_id, again.token) == (claimed.run_id, 2)


async def test_requeue_without_crash_never_quarantines(store: Store) -> None:
    claimed = await running(store, now=T0)
    strict = PoisonPolicy(max_retries=0, retry_ttl_s=3600.0)

    for i in range(5):
        outcome = await store.requeue(
            claimed.run_id, claimed.token, now=T0 + i, reason="store_unavailable", poison=strict
        )
        assert outcome.quarantined is False
        claimed = await take(store, claimed.run_id, now=T0 + i)

    assert (await info(store, claimed.run_id)).status == RunStatus.RUNNING


async def test_reclaim_requeues_runs_whose_lock_expired(store: Store) -> None:
    claimed = await running(store, now=T0, ttl=10.0)

    assert await store.reclaim(None, now=T0 + 9, limit=10, poison=LENIENT) == []
    assert (await info(store, claimed.run_id)).status == RunStatus.RUNNING

    outcomes = await store.reclaim(None, now=T0 + 11, limit=10, poison=LENIENT)

    assert outcomes == [RequeueOutcome(claimed.run_id, False)]
    assert (await info(store, claimed.run_id)).status == RunStatus.QUEUED
    requeued = (await journal(store, claimed.run_id))[-1]
    assert (requeued["type"], requeued["reason"]) == (EventType.RUN_REQUEUED, "orphaned")
    assert await store.reclaim(None, now=T0 + 12, limit=10, poison=LENIENT) == []
    # Charged a crash, it is a suspect: only the suspect claim takes it.
    passed = await store.claim(WORKER, [WF], limit=1, now=T0 + 12, lock_ttl=TTL)
    assert list(passed) == [] and passed.suspects
    again = await store.claim_suspect(WORKER, passed.suspects, now=T0 + 12, lock_ttl=TTL)
    assert again is not None and (again.run_id, again.token) == (claimed.run_id, 2)


async def test_reclaim_takes_only_the_given_names(store: Store) -> None:
    a = await running(store, "wf.a", now=T0, ttl=10.0)
    b = await running(store, "wf.b", now=T0, ttl=10.0)

    only_a = await store.reclaim(["wf.a", "wf.none"], now=T0 + 11, limit=10, poison=LENIENT)

    assert [o.run_id for o in only_a] == [a.run_id]
    assert (await info(store, b.run_id)).status == RunStatus.RUNNING
    rest = await store.reclaim(None, now=T0 + 11, limit=10, poison=LENIENT)
    assert [o.run_id for o in rest] == [b.run_id]


async def test_reclaim_honours_limit(store: Store) -> None:
    ids = {(await running(store, now=T0, ttl=10.0)).run_id for _ in range(5)}

    first = await store.reclaim(None, now=T0 + 11, limit=2, poison=LENIENT)
    rest = await store.reclaim(None, now=T0 + 11, limit=10, poison=LENIENT)

    assert len(first) == 2 and len(rest) == 3
    assert {o.run_id for o in first + rest} == ids


async def test_reclaim_leaves_runs_that_hold_no_lock(store: Store) -> None:
    queued = await submit(store, now=T0)
    parked = await running(store, now=T0, ttl=10.0)
    await sleep(store, parked.run_id, parked.token, T0 + 10**6, now=T0 + 1)
    done = await running(store, now=T0, ttl=10.0)
    await complete(store, done.run_id, done.token, now=T0 + 1)

    assert await store.reclaim(None, now=T0 + 10_000, limit=10, poison=LENIENT) == []

    assert (await info(store, queued)).status == RunStatus.QUEUED
    assert (await info(store, parked.run_id)).status == RunStatus.SLEEPING
    assert (await info(store, done.run_id)).status == RunStatus.COMPLETED


async def _crash_by_reclaim(store: Store, run_id: str, now: float, policy: PoisonPolicy) -> bool:
    """Claim the run at ``now``, let its lock lapse, scan; True if it was quarantined."""
    await take(store, run_id, now=now, ttl=10.0)
    [outcome] = await store.reclaim(None, now=now + 11, limit=10, poison=policy)
    assert outcome.run_id == run_id
    return outcome.quarantined


async def test_the_crash_after_max_retries_quarantines_the_run(store: Store) -> None:
    policy = PoisonPolicy(max_retries=2, retry_ttl_s=3600.0)
    run_id = await submit(store, now=T0)

    assert await _crash_by_reclaim(store, run_id, T0, policy) is False
    assert await _crash_by_reclaim(store, run_id, T0 + 100, policy) is False
    assert (await info(store, run_id)).status == RunStatus.QUEUED
    assert await _crash_by_reclaim(store, run_id, T0 + 200, policy) is True

    run = await info(store, run_id)
    assert run.status == RunStatus.FAILED
    assert run.error is not None
    assert run.error["code"] == "max_retries"
    assert run.error["error_type"] and run.error["message"]
    last = (await journal(store, run_id))[-1]
    assert (last["type"], last["code"]) == (EventType.RUN_ERROR, "max_retries")
    assert await store.claim(WORKER, [WF], limit=10, now=T0 + 300, lock_ttl=TTL) == []
    assert (await store.wait_result(run_id, timeout=5.0)).status == RunStatus.FAILED


async def test_crashes_older_than_retry_ttl_do_not_count(store: Store) -> None:
    policy = PoisonPolicy(max_retries=1, retry_ttl_s=100.0)
    run_id = await submit(store, now=T0)

    assert await _crash_by_reclaim(store, run_id, T0, policy) is False  # crash at T0 + 11
    # The next crash comes 200 s later: the first has aged out.
    assert await _crash_by_reclaim(store, run_id, T0 + 200, policy) is False  # at T0 + 211
    assert (await info(store, run_id)).status == RunStatus.QUEUED
    # Two crashes within 100 s: the second is number max_retries + 1.
    assert await _crash_by_reclaim(store, run_id, T0 + 250, policy) is True  # at T0 + 261
    assert (await info(store, run_id)).status == RunStatus.FAILED


async def test_requeue_with_crash_counts_toward_quarantine(store: Store) -> None:
    policy = PoisonPolicy(max_retries=1, retry_ttl_s=3600.0)
    claimed = await running(store, now=T0)
    detail = {"cause": "loop_blocked", "blocked_for_s": 45.0, "liveness_bound_s": 45.0}

    first = await store.requeue(
        claimed.run_id, claimed.token, now=T0 + 1, reason="loop_blocked",
        crash=True, poison=policy, crash_detail=detail,
    )
    assert first.quarantined is False
    assert (await info(store, claimed.run_id)).status == RunStatus.QUEUED
    assert (await journal(store, claimed.run_id))[-1]["reason"] == "loop_blocked"

    again = await take(store, claimed.run_id, now=T0 + 2)
    second = await store.requeue(
        claimed.run_id, again.token, now=T0 + 3, reason="loop_blocked",
        crash=True, poison=policy, crash_detail=detail,
    )

    assert second == RequeueOutcome(claimed.run_id, True)
    run = await info(store, claimed.run_id)
    assert run.status == RunStatus.FAILED
    assert run.error is not None and run.error["code"] == "max_retries"
    last = (await journal(store, claimed.run_id))[-1]
    assert (last["type"], last["code"]) == (EventType.RUN_ERROR, "max_retries")
    for key in ("cause", "blocked_for_s", "liveness_bound_s"):
        assert last["detail"][key] == detail[key]
        assert run.error["detail"][key] == detail[key]


async def test_reclaim_and_requeue_share_one_crash_counter(store: Store) -> None:
    policy = PoisonPolicy(max_retries=1, retry_ttl_s=3600.0)
    run_id = await submit(store, now=T0)
    assert await _crash_by_reclaim(store, run_id, T0, policy) is False

    claimed = await take(store, run_id, now=T0 + 20)
    outcome = await store.requeue(
        run_id, claimed.token, now=T0 + 21, reason="loop_blocked", crash=True, poison=policy
    )

    assert outcome.quarantined is True
    assert (await info(store, run_id)).status == RunStatus.FAILED


async def test_recover_pending_runs_requeues_orphans_of_that_name(store: Store) -> None:
    # recover_pending_runs reads the wall clock: these locks lapsed long ago, that one not.
    past = time.time() - 3600.0
    orphaned = await running(store, "wf.recover", now=past, ttl=1.0)
    alive = await running(store, "wf.recover", now=time.time(), ttl=3600.0)
    other = await running(store, "wf.other", now=past, ttl=1.0)

    assert store.recover_pending_runs("wf.recover") == 1

    assert (await info(store, orphaned.run_id)).status == RunStatus.QUEUED
    requeued = (await journal(store, orphaned.run_id))[-1]
    assert (requeued["type"], requeued["reason"]) == (EventType.RUN_REQUEUED, "orphaned")
    assert (await info(store, alive.run_id)).status == RunStatus.RUNNING
    assert (await info(store, other.run_id)).status == RunStatus.RUNNING
    assert store.recover_pending_runs("wf.recover") == 0
