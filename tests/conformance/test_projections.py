"""Store contract: projections (the Projections capability).

A save is a compare-and-set on the projection's version, atomic with the write of its
states and checkpoint; the version only grows (a rebuild bumps it too). Over that, the
projection loop's pass (``fold_once``) folds every ended run of the projection's workflows
exactly once, however many folders race from however many store objects, and whatever
write is lost on the way.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pyrula.workflows.events import EventType
from pyrula.workflows.projections import WHOLE, ProjectionSpec
from pyrula.workflows.records import RunInfo, RunStatus
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.capabilities import ProjectionHead, Projections, capabilities_of
from pyrula.workflows.worker.projections import FoldPass, fold_once
from tests.conformance.support import T0, WF, complete, ev, running
from tests.generative.harness import other_store

OTHER = "conformance.other"
NAME = "conformance.ids"


def projections(store: Any) -> Projections:
    found = capabilities_of(store).projections
    assert found is not None, f"{store!r} lacks the Projections capability"
    return found


def collect_ids(state: Any, run: RunInfo) -> Any:
    """A fold that lists the ids it was given: duplicates and gaps show."""
    return [*(state or []), run.run_id]


def count_by_status(state: Any, run: RunInfo) -> Any:
    counts = dict(state or {})
    counts[run.status.value] = counts.get(run.status.value, 0) + 1
    return counts


IDS = ProjectionSpec(NAME, (WF,), collect_ids)


async def ended(store: Store, count: int, *, at: float = T0, name: str = WF,
                params: Any = None) -> list[str]:
    """``count`` runs of ``name`` that completed at ``at``, ``at + 1``..."""
    ids = []
    for i in range(count):
        claimed = await running(store, name, params, now=at + i)
        await complete(store, claimed.run_id, claimed.token, {"i": i}, now=at + i)
        ids.append(claimed.run_id)
    return ids


async def fold_all(store: Any, spec: ProjectionSpec = IDS, *, now: float = T0 + 10_000,
                   batch: int = 500) -> list[FoldPass]:
    passes = []
    for _ in range(100):  # a store that listed a folded run again would go on for ever
        done = await fold_once(projections(store), spec, now=now, grace=0.0, batch=batch)
        passes.append(done)
        if done.outcome != "saved" or not done.more:
            return passes
    raise AssertionError(f"still folding after 100 passes: {passes[-3:]}")


async def state(store: Any, name: str = NAME, key: str = WHOLE) -> Any:
    return (await projections(store).projection_states(name, [key])).get(key)


async def test_every_store_keeps_projections(store: Store) -> None:
    assert capabilities_of(store).projections is not None


async def test_a_save_is_a_compare_and_set_on_a_version_that_only_grows(store: Store) -> None:
    p = projections(store)
    head = ProjectionHead(NAME, 0, "fp", False, (T0, "a"), 1, T0)

    assert await p.projection_head(NAME) is None
    assert await p.save_projection(head, {WHOLE: [1]}, expected=0, reset=False)
    assert not await p.save_projection(head, {WHOLE: [2]}, expected=0, reset=False)
    found = await p.projection_head(NAME)
    assert found is not None
    assert (found.version, found.checkpoint, found.fingerprint) == (1, (T0, "a"), "fp")
    assert await state(store) == [1]

    assert await p.reset_projection(NAME, now=T0 + 1)
    reset = await p.projection_head(NAME)
    assert reset is not None and (reset.version, reset.checkpoint, reset.fingerprint) == (
        2, None, "")
    assert await state(store) is None
    assert not await p.save_projection(head, {WHOLE: [3]}, expected=1, reset=False)
    assert [h.name for h in await p.projection_heads()] == [NAME]
    assert not await p.reset_projection("never.written", now=T0)


async def test_a_reset_save_drops_every_other_key(store: Store) -> None:
    p = projections(store)
    head = ProjectionHead(NAME, 0, "fp", True, None, 0, T0)
    assert await p.save_projection(head, {"a": 1, "b": 2}, expected=0, reset=False)
    assert await p.save_projection(head, {"c": 3}, expected=1, reset=False)
    assert await p.projection_states(NAME, None) == {"a": 1, "b": 2, "c": 3}
    assert await p.save_projection(head, {"d": 4}, expected=2, reset=True)
    assert await p.projection_states(NAME, None) == {"d": 4}
    assert await p.projection_states(NAME, ["d", "zz"]) == {"d": 4}


async def test_ended_infos_lists_ended_runs_of_the_names_in_end_order(store: Store) -> None:
    mine = await ended(store, 3, at=T0)
    await ended(store, 2, at=T0, name=OTHER)
    claimed = await running(store, now=T0)  # still running: never listed

    p = projections(store)
    found = await p.ended_infos([WF], after=None, until=T0 + 100, limit=10)
    assert [i.run_id for i in found] == mine
    assert found[0].result == {"i": 0} and found[0].status is RunStatus.COMPLETED
    after = (found[0].finished_at or 0.0, found[0].run_id)
    assert [i.run_id for i in await p.ended_infos([WF], after=after, until=T0 + 1,
                                                  limit=10)] == mine[1:2]
    assert len(await p.ended_infos([WF, OTHER], after=None, until=T0 + 100, limit=10)) == 5
    assert claimed.run_id not in {i.run_id for i in found}


async def test_every_run_is_folded_once_in_end_order(store: Store) -> None:
    ids = await ended(store, 7)

    passes = await fold_all(store, batch=3)

    assert await state(store) == ids
    assert [p.folded for p in passes] == [3, 3, 1]
    head = await projections(store).projection_head(NAME)
    assert head is not None and head.folded == 7 and head.checkpoint is not None
    assert head.checkpoint[1] == ids[-1]
    assert (await fold_once(projections(store), IDS, now=T0 + 10_000, grace=0.0)).outcome \
        == "idle"


async def test_runs_within_the_grace_are_left_for_a_later_pass(store: Store) -> None:
    ids = await ended(store, 4, at=T0)

    await fold_once(projections(store), IDS, now=T0 + 12, grace=10.0)
    assert await state(store) == ids[:3]  # ended at T0..T0+2: at least 10 s ago
    await fold_once(projections(store), IDS, now=T0 + 13, grace=10.0)
    assert await state(store) == ids


async def test_concurrent_folders_on_several_store_objects_fold_each_run_once(
    store: Store,
) -> None:
    ids = await ended(store, 24)
    folders = [store, other_store(store), other_store(store)]
    try:
        for _ in range(40):
            passes = await asyncio.gather(*(
                fold_once(projections(s), IDS, now=T0 + 10_000, grace=0.0, batch=5)
                for s in folders))
            if all(p.outcome == "idle" for p in passes):
                break
        assert await state(store) == ids
        head = await projections(store).projection_head(NAME)
        assert head is not None and head.folded == len(ids)
    finally:
        for s in folders[1:]:
            if s is not store:
                await s.aclose()


class LostWrite(Exception):
    """The store went away between the fold and the write."""


class CrashOnSave:
    """A folder that dies between its fold and its write: nothing reaches the store."""

    def __init__(self, inner: Projections) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def save_projection(self, *args: Any, **kwargs: Any) -> bool:
        raise LostWrite


async def test_a_folder_that_dies_before_its_write_leaves_the_batch_to_the_next(
    store: Store,
) -> None:
    ids = await ended(store, 3)
    await fold_all(store, batch=2)
    more = await ended(store, 3, at=T0 + 100)

    with pytest.raises(LostWrite):
        await fold_once(CrashOnSave(projections(store)), IDS,
                        now=T0 + 10_000, grace=0.0)
    await fold_all(store)

    assert await state(store) == ids + more


async def test_a_keyed_projection_keeps_one_state_per_key(store: Store) -> None:
    spec = ProjectionSpec("conformance.by_customer", (WF,), count_by_status,
                          key=lambda run: run.params["customer"])
    for customer in ("acme", "bolt", "acme"):
        await ended(store, 1, params={"customer": customer})
    failed = await running(store, params={"customer": "bolt"}, now=T0 + 5)
    await store.finish(failed.run_id, failed.token,
                       [ev(EventType.RUN_ERROR, T0 + 6, code="x", error_type="E", message="m")],
                       now=T0 + 6, status=RunStatus.FAILED,
                       error={"code": "x", "error_type": "E", "message": "m"})

    await fold_all(store, spec)

    states = await projections(store).projection_states(spec.name, None)
    assert states == {"acme": {"completed": 2}, "bolt": {"completed": 1, "failed": 1}}
    head = await projections(store).projection_head(spec.name)
    assert head is not None and head.keyed


async def test_a_run_that_continued_as_new_is_not_folded_its_successor_is(
    store: Store,
) -> None:
    first = await running(store, now=T0)
    finished = await store.finish(first.run_id, first.token,
                                  [ev(EventType.RUN_CONTINUED, T0 + 1)], now=T0 + 1,
                                  status=RunStatus.CONTINUED, successor_params={"n": 2})
    assert finished.successor_id is not None
    await fold_all(store)
    assert await state(store) is None or await state(store) == []

    second = await store.claim_run(finished.successor_id, "w", now=T0 + 2, lock_ttl=30.0)
    assert second is not None
    await complete(store, second.run_id, second.token, now=T0 + 3)
    await fold_all(store)
    assert await state(store) == [second.run_id]


async def test_a_rebuild_folds_every_kept_run_again(store: Store) -> None:
    ids = await ended(store, 3)
    await fold_all(store)

    assert await projections(store).reset_projection(NAME, now=T0 + 1)
    assert await state(store) is None
    await fold_all(store)

    assert await state(store) == ids


async def test_new_fold_code_starts_the_projection_over_and_old_code_stands_down(
    store: Store,
) -> None:
    ids = await ended(store, 3)
    await fold_all(store)
    newer = ProjectionSpec(NAME, (WF,), count_by_status)
    assert newer.fingerprint != IDS.fingerprint

    await fold_all(store, newer)
    assert await state(store) == {"completed": 3}

    older = await fold_once(projections(store), IDS, now=T0 + 10_000, grace=0.0)
    assert older.outcome == "stand_down"
    assert await state(store) == {"completed": 3}
    assert ids


async def test_end_times_no_index_keeps_exactly_still_fold_each_run_once(store: Store) -> None:
    """Finish times with many decimals (a Valkey shard's index keeps them to within a
    microsecond): the checkpoint still never lets a folded run be listed again."""
    ids = []
    for i in range(5):
        at = T0 + 0.123456789 + i * 0.1000003
        claimed = await running(store, now=at)
        await complete(store, claimed.run_id, claimed.token, now=at)
        ids.append(claimed.run_id)

    await fold_all(store, batch=1)
    for _ in range(3):
        await fold_once(projections(store), IDS, now=T0 + 10_000, grace=0.0, batch=1)

    assert await state(store) == ids
