"""Store contract: suspects, the runs requeued with a crash counted that have not completed
an attempt since. They stay ``queued`` but wait apart: an ordinary claim never returns one
(it says where they wait), ``claim_suspect`` takes one at a time, and whatever removes a
queued run from its queue (cancel, claim_run, fail_stranded) finds them."""

from __future__ import annotations

from pyrula.workflows.events import EventType
from pyrula.workflows.records import ClaimedRun, PoisonPolicy, RunStatus, SuspectsAt
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.capabilities import QueueStat, capabilities_of
from tests.conformance.support import (
    T0,
    TTL,
    WF,
    WORKER,
    complete,
    info,
    journal,
    orphan,
    require_global_order,
    sleep,
    submit,
    take,
    types,
)

OTHER = "conformance.other"


async def _suspect(store: Store, run_id: str, *, now: float) -> None:
    """Claim the queued run, then let the orphan scan requeue it with a crash counted."""
    await take(store, run_id, now=now)
    await orphan(store, run_id, now=now + TTL + 1)


async def _claim(store: Store, *, now: float, names: tuple[str, ...] = (WF,),
                 limit: int = 10) -> tuple[set[str], tuple[SuspectsAt, ...]]:
    claimed = await store.claim(WORKER, list(names), limit=limit, now=now, lock_ttl=TTL)
    assert not any(run.suspect for run in claimed)
    return {run.run_id for run in claimed}, claimed.suspects


async def _claim_suspect(store: Store, at: tuple[SuspectsAt, ...], *,
                         now: float) -> ClaimedRun | None:
    return await store.claim_suspect(WORKER, at, now=now, lock_ttl=TTL)


async def test_an_ordinary_claim_passes_a_suspect_over_and_says_where_it_waits(
    store: Store,
) -> None:
    suspect, a, b = [await submit(store, now=T0 + i) for i in range(3)]
    other = await submit(store, OTHER, now=T0 + 3)
    await _suspect(store, suspect, now=T0 + 10)
    assert (await info(store, suspect)).status == RunStatus.QUEUED

    taken, where = await _claim(store, now=T0 + 50, names=(WF, OTHER))

    assert taken == {a, b, other}
    assert where and {p.name for p in where} == {WF}
    assert (await info(store, suspect)).status == RunStatus.QUEUED
    # A shard that holds only suspects is still found by the next claim.
    taken, again = await _claim(store, now=T0 + 51)
    assert taken == set() and again == where


async def test_the_suspect_claim_takes_exactly_one_suspect(store: Store) -> None:
    first, second = [await submit(store, now=T0 + i) for i in range(2)]
    ordinary = await submit(store, now=T0 + 2)
    await _suspect(store, first, now=T0 + 10)
    await _suspect(store, second, now=T0 + 50)
    taken, where = await _claim(store, now=T0 + 100)
    assert taken == {ordinary}

    one = await _claim_suspect(store, where, now=T0 + 101)
    assert one is not None and one.suspect
    assert one.token == 2 and len(one.crashes) == 1
    assert types(one.journal)[-2:] == [EventType.RUN_REQUEUED, EventType.RUN_STARTED]
    assert (await info(store, one.run_id)).status == RunStatus.RUNNING
    two = await _claim_suspect(store, where, now=T0 + 102)
    assert two is not None and two.suspect
    assert {one.run_id, two.run_id} == {first, second}
    if getattr(store, "shard_count", 1) == 1:
        assert (one.run_id, two.run_id) == (first, second)  # the longest-waiting first
    assert await _claim_suspect(store, where, now=T0 + 103) is None
    assert await _claim(store, now=T0 + 104) == (set(), ())


async def test_the_suspect_with_the_most_crashes_is_claimed_first(store: Store) -> None:
    require_global_order(store)
    once, twice = [await submit(store, now=T0 + i) for i in range(2)]
    await _suspect(store, once, now=T0 + 10)
    await _suspect(store, twice, now=T0 + 50)
    await _suspect(store, twice, now=T0 + 90)  # by id: a suspect's second crash
    _, where = await _claim(store, now=T0 + 130)

    first = await _claim_suspect(store, where, now=T0 + 131)
    second = await _claim_suspect(store, where, now=T0 + 132)

    assert first is not None and (first.run_id, len(first.crashes)) == (twice, 2)
    assert second is not None and (second.run_id, len(second.crashes)) == (once, 1)


async def test_a_suspect_claim_with_no_suspects_claims_nothing(store: Store) -> None:
    ordinary = await submit(store)
    assert await _claim_suspect(store, (SuspectsAt(WF),), now=T0 + 1) is None
    assert await _claim_suspect(store, (), now=T0 + 1) is None
    assert (await info(store, ordinary)).status == RunStatus.QUEUED


async def test_a_suspect_requeued_without_a_crash_is_still_a_suspect(store: Store) -> None:
    run_id = await submit(store)
    await _suspect(store, run_id, now=T0 + 1)
    _, where = await _claim(store, now=T0 + 40)
    claimed = await _claim_suspect(store, where, now=T0 + 41)
    assert claimed is not None
    await store.requeue(run_id, claimed.token, now=T0 + 42, reason="shutdown")

    taken, where = await _claim(store, now=T0 + 43)
    assert taken == set() and where
    again = await _claim_suspect(store, where, now=T0 + 44)
    assert again is not None and again.run_id == run_id and again.suspect


async def test_a_suspect_whose_attempt_parks_or_ends_is_no_longer_one(store: Store) -> None:
    parks, ends = await submit(store, now=T0), await submit(store, now=T0 + 1)
    stays = await submit(store, now=T0 + 2)
    for run_id in (parks, ends, stays):
        await _suspect(store, run_id, now=T0 + 3)
    _, where = await _claim(store, now=T0 + 40)
    held = {}
    for i in range(3):
        claimed = await _claim_suspect(store, where, now=T0 + 41 + i)
        assert claimed is not None
        held[claimed.run_id] = claimed.token
    await sleep(store, parks, held[parks], T0 + 60, now=T0 + 50)
    await complete(store, ends, held[ends], "done", now=T0 + 50)
    # The third one's attempt ends in a crash charged to another run: still a suspect.
    await store.reclaim_worker(WORKER, now=T0 + 51, poison=PoisonPolicy(), charge=[])
    assert await store.wake_due(now=T0 + 60, limit=10) == 1

    taken, where = await _claim(store, now=T0 + 61)
    assert taken == {parks} and where
    assert (await info(store, ends)).status == RunStatus.COMPLETED
    claimed = await _claim_suspect(store, where, now=T0 + 62)
    assert claimed is not None and claimed.run_id == stays


async def test_claim_run_takes_a_suspect_by_id(store: Store) -> None:
    run_id = await submit(store)
    await _suspect(store, run_id, now=T0 + 1)

    claimed = await take(store, run_id, now=T0 + 40)

    assert claimed.suspect and claimed.token == 2
    assert await _claim(store, now=T0 + 41) == (set(), ())
    assert await _claim_suspect(store, (SuspectsAt(WF),), now=T0 + 41) is None


async def test_a_put_aside_suspect_is_cancelled_at_once(store: Store) -> None:
    cancelled, kept = await submit(store, now=T0), await submit(store, now=T0 + 1)
    await _suspect(store, cancelled, now=T0 + 2)
    await _suspect(store, kept, now=T0 + 3)

    assert await store.cancel(cancelled, now=T0 + 40)

    assert (await info(store, cancelled)).status == RunStatus.CANCELLED
    assert types(await journal(store, cancelled))[-1] == EventType.RUN_CANCELLED
    _, where = await _claim(store, now=T0 + 41)
    claimed = await _claim_suspect(store, where, now=T0 + 42)
    assert claimed is not None and claimed.run_id == kept
    assert await _claim_suspect(store, where, now=T0 + 43) is None


async def test_a_suspect_is_counted_and_listed_as_queued(store: Store) -> None:
    suspect = await submit(store, now=T0)
    ordinary = await submit(store, now=T0 + 1)
    await _suspect(store, suspect, now=T0 + 2)

    listed = await store.list_runs(name=WF, status=RunStatus.QUEUED)
    assert {r.run_id for r in listed} == {suspect, ordinary}
    stats = capabilities_of(store).queue_stats
    if stats is not None:
        assert await stats.queue_stats([WF]) == {WF: QueueStat(2, T0 + 1)}
        await _claim(store, now=T0 + 40)
        assert await stats.queue_stats([WF]) == {WF: QueueStat(1, T0 + 2 + TTL + 1)}


async def test_a_stranded_suspect_is_failed_like_any_queued_run(store: Store) -> None:
    run_id = await submit(store, now=T0)
    await _suspect(store, run_id, now=T0 + 1)
    assert WF in await store.stranded(now=T0 + 40)
    error = {"code": "stranded", "error_type": "Stranded", "message": "nobody serves it"}

    failed = await store.fail_stranded(WF, older_than=T0 + 40, now=T0 + 41, limit=10,
                                       error=error)

    assert failed == [run_id]
    assert (await info(store, run_id)).status == RunStatus.FAILED
    assert await _claim_suspect(store, (SuspectsAt(WF),), now=T0 + 42) is None


async def test_a_suspect_charged_again_is_quarantined_past_the_poison_limit(
    store: Store,
) -> None:
    require_global_order(store)
    run_id = await submit(store)
    poison = PoisonPolicy(max_retries=1)
    await take(store, run_id, now=T0 + 1)
    [first] = await store.reclaim_worker(WORKER, now=T0 + 2, poison=poison)
    assert not first.quarantined
    claimed = await _claim_suspect(store, (SuspectsAt(WF),), now=T0 + 3)
    assert claimed is not None and claimed.run_id == run_id
    # Uncharged (another run was the culprit): back among the suspects, not quarantined.
    await store.reclaim_worker(WORKER, now=T0 + 4, poison=poison, charge=[])
    claimed = await _claim_suspect(store, (SuspectsAt(WF),), now=T0 + 5)
    assert claimed is not None

    [second] = await store.reclaim_worker(WORKER, now=T0 + 6, poison=poison)

    assert second.quarantined
    assert (await info(store, run_id)).status == RunStatus.FAILED
