"""Store contract: every run:started records the build the claimer passed.

A run's journal says which code each of its attempts started on: ``claim`` and
``claim_run`` take the worker's ``build`` and write it into the ``run:started`` they
append, on the first attempt (which some stores hold in the run record rather than the
journal) as on later ones, in what the claim returns as in what a read returns later.
"""

from __future__ import annotations

from pyrula.workflows.events import EventType
from pyrula.workflows.records import RunStatus
from pyrula.workflows.stores.base import Store
from tests.conformance.support import T0, TTL, WF, WORKER, complete, journal, sleep, submit


def _started(events: list[dict[str, object]]) -> list[dict[str, object]]:
    return [e for e in events if e["type"] == EventType.RUN_STARTED]


async def test_claim_records_the_claimers_build_in_run_started(store: Store) -> None:
    run_id = await submit(store)

    [claimed] = await store.claim(WORKER, [WF], limit=1, now=T0 + 1, lock_ttl=TTL,
                                  build="b-one")

    assert claimed.run_id == run_id
    [started] = _started(claimed.journal)
    assert (started["build"], started["worker"], started["attempt"]) == ("b-one", WORKER, 1)
    assert _started(await journal(store, run_id)) == [started]


async def test_each_attempt_records_the_build_that_claimed_it(store: Store) -> None:
    run_id = await submit(store)
    first = await store.claim_run(run_id, "w-old", now=T0 + 1, lock_ttl=TTL, build="b-old")
    assert first is not None
    await sleep(store, run_id, first.token, T0 + 5, now=T0 + 2)
    assert await store.wake_due(now=T0 + 6, limit=10) == 1

    second = await store.claim_run(run_id, "w-new", now=T0 + 7, lock_ttl=TTL, build="b-new")
    assert second is not None
    assert [e["build"] for e in _started(second.journal)] == ["b-new"]
    await complete(store, run_id, second.token, now=T0 + 8)

    # Read back once the run ended: the first attempt's build as much as the second's.
    events = await journal(store, run_id)
    assert [(e["worker"], e["build"]) for e in _started(events)] == [
        ("w-old", "b-old"), ("w-new", "b-new")]
    run = await store.get_run(run_id)
    assert run is not None and run.status is RunStatus.COMPLETED


async def test_a_claim_without_a_build_records_none(store: Store) -> None:
    run_id = await submit(store)

    claimed = await store.claim_run(run_id, WORKER, now=T0 + 1, lock_ttl=TTL)

    assert claimed is not None
    [started] = _started(claimed.journal)
    assert "build" not in started
    assert "build" not in _started(await journal(store, run_id))[0]
