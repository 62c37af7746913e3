"""A dead worker's runs are requeued at once by its id, found by the store itself."""

from __future__ import annotations

from pyrula.workflows.records import PoisonPolicy, RunStatus
from pyrula.workflows.stores.base import Store
from tests.conformance.support import T0, info, journal, submit, take


async def test_reclaim_worker_requeues_exactly_the_dead_workers_runs(store: Store) -> None:
    dead = [await take(store, await submit(store, now=T0), worker="dead") for _ in range(3)]
    alive = await take(store, await submit(store, now=T0), worker="alive")

    outcomes = await store.reclaim_worker(
        "dead", now=T0 + 1, poison=PoisonPolicy(),
        crash_detail={"exit_signal": "SIGKILL", "rss_bytes": 123},
    )

    assert sorted(o.run_id for o in outcomes) == sorted(c.run_id for c in dead)
    assert not any(o.quarantined for o in outcomes)
    for claimed in dead:
        assert (await info(store, claimed.run_id)).status == RunStatus.QUEUED
        last = (await journal(store, claimed.run_id))[-1]
        assert last["type"] == "run:requeued" and last["reason"] == "orphaned"
        # The requeue keeps the evidence of the crash, not only a quarantine's error.
        assert last["detail"] == {"cause": "worker_crash", "worker": "dead", "attempt": 1,
                                  "exit_signal": "SIGKILL", "rss_bytes": 123}
    assert (await info(store, alive.run_id)).status == RunStatus.RUNNING
    assert await store.reclaim_worker("dead", now=T0 + 2, poison=PoisonPolicy()) == []


async def test_reclaim_worker_counts_a_crash_and_quarantines_with_the_evidence(
    store: Store,
) -> None:
    run_id = await submit(store, now=T0)
    for crash in range(2):
        await take(store, run_id, now=T0 + crash, worker=f"w{crash}")
        [outcome] = await store.reclaim_worker(
            f"w{crash}", now=T0 + crash + 0.5, poison=PoisonPolicy(max_retries=1),
            crash_detail={"exit_signal": "SIGKILL", "rss_bytes": 4096},
        )
    assert outcome.quarantined
    ended = await info(store, run_id)
    assert ended.status == RunStatus.FAILED
    assert ended.error is not None and ended.error["code"] == "max_retries"
    detail = ended.error["detail"]
    assert detail["exit_signal"] == "SIGKILL" and detail["rss_bytes"] == 4096
    assert detail["worker"] == "w1" and detail["cause"] == "worker_crash"


async def test_reclaim_worker_charges_only_the_runs_it_is_told_to(store: Store) -> None:
    policy = PoisonPolicy(max_retries=1)
    culprit, suspect, fresh, spared = [await submit(store, now=T0) for _ in range(4)]
    for run_id in (culprit, suspect):  # each has one crash counted already
        await take(store, run_id, now=T0, worker="before")
    await store.reclaim_worker("before", now=T0 + 1, poison=policy, charge=[culprit, suspect])
    for run_id in (culprit, suspect, fresh, spared):
        await take(store, run_id, now=T0 + 2, worker="dead")
    alive = await take(store, await submit(store, now=T0), now=T0 + 2, worker="alive")

    outcomes = await store.reclaim_worker(
        "dead", now=T0 + 3, poison=policy, crash_detail={"exit_signal": "SIGKILL"},
        charge=[culprit, fresh, alive.run_id],
    )

    # All four are requeued at once; a crash is counted against the two named only (the
    # culprit's second quarantines it). A named run the worker does not hold is left alone.
    assert {o.run_id: o.quarantined for o in outcomes} == {
        culprit: True, suspect: False, fresh: False, spared: False}
    ended = await info(store, culprit)
    assert ended.status == RunStatus.FAILED
    assert ended.error is not None and ended.error["code"] == "max_retries"
    assert ended.error["detail"]["crashes"] == 2
    assert ended.error["detail"]["exit_signal"] == "SIGKILL"
    for run_id, crashes in ((suspect, None), (fresh, 1), (spared, None)):
        assert (await info(store, run_id)).status == RunStatus.QUEUED
        last = (await journal(store, run_id))[-1]
        assert last["type"] == "run:requeued" and last["reason"] == "orphaned"
        assert last.get("crashes") == crashes, run_id
    assert (await info(store, alive.run_id)).status == RunStatus.RUNNING

    # Claimed again, each run comes with the crashes counted against it.
    again = {run_id: await take(store, run_id, now=T0 + 4, worker="next")
             for run_id in (suspect, fresh, spared)}
    assert again[suspect].crashes == (T0 + 1,)
    assert again[fresh].crashes == (T0 + 3,)
    assert again[spared].crashes == ()


async def test_requeue_unheld_puts_back_only_the_runs_the_worker_does_not_know(
    store: Store,
) -> None:
    # A live worker whose claim reply was lost holds two runs it knows and two it does not.
    known = [await take(store, await submit(store, now=T0), worker="w") for _ in range(2)]
    lost = [await take(store, await submit(store, now=T0), worker="w") for _ in range(2)]
    other = await take(store, await submit(store, now=T0), worker="other")

    outcomes = await store.requeue_unheld("w", {c.run_id for c in known}, now=T0 + 1)

    assert sorted(o.run_id for o in outcomes) == sorted(c.run_id for c in lost)
    assert not any(o.quarantined for o in outcomes)
    for claimed in lost:
        ran = await info(store, claimed.run_id)
        assert ran.status == RunStatus.QUEUED
        last = (await journal(store, claimed.run_id))[-1]
        assert last["type"] == "run:requeued" and last["reason"] == "store_unavailable"
        assert "detail" not in last, "no crash, no evidence"
    for claimed in [*known, other]:
        assert (await info(store, claimed.run_id)).status == RunStatus.RUNNING
    assert await store.requeue_unheld("w", {c.run_id for c in known}, now=T0 + 2) == []


async def test_requeue_unheld_counts_no_crash(store: Store) -> None:
    run_id = await submit(store, now=T0)
    for round_ in range(3):  # past max_retries=1, had they counted
        await take(store, run_id, now=T0 + round_, worker="w")
        [outcome] = await store.requeue_unheld("w", set(), now=T0 + round_ + 0.5)
        assert not outcome.quarantined
    assert (await info(store, run_id)).status == RunStatus.QUEUED
    # A real crash now is its first: under max_retries=1 it is requeued, not quarantined.
    await take(store, run_id, now=T0 + 4, worker="w")
    [outcome] = await store.reclaim_worker("w", now=T0 + 5, poison=PoisonPolicy(max_retries=1))
    assert not outcome.quarantined
    assert (await info(store, run_id)).status == RunStatus.QUEUED
