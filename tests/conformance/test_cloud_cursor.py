"""Store contract, as the Cloud connector uses it: the reconcile cursor.

The connectors of an environment keep a cursor per workflow among the store's projection
heads and send the critical events of every run that ended after it, so what a killed
process never sent reaches the collector. Every ended run's critical events are handed to
``deliver`` at least once, however passes race from several store objects, fail to
deliver or die before moving the cursor; the collector applies each event id once.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from pyrula.cloud.reconcile import GRACE_S, Reconciler, cursor_name
from pyrula.workflows.client import WorkflowClient
from pyrula.workflows.events import EventType
from pyrula.workflows.records import RunStatus
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.capabilities import capabilities_of
from tests.conformance.support import T0, TTL, WF, complete, ev, running
from tests.generative.harness import other_store

ENV = "prod"
EVERY_S = 10.0


def reconciler(store: Any) -> Reconciler:
    projections = capabilities_of(store).projections
    assert projections is not None, f"{store!r} lacks the Projections capability"
    return Reconciler(store, projections, ENV, EVERY_S)


class Collector:
    """What a collector keeps: each event id once."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.sends = 0
        self.refuse = False

    async def deliver(self, reports: list[dict[str, Any]]) -> bool:
        if self.refuse:
            return False
        self.sends += 1
        self.ids.update(r["id"] for r in reports)
        return True


async def ended(store: Store, count: int, *, at: float) -> list[str]:
    """``count`` runs that ended at ``at``, ``at + 1``...: completed, but every third
    failed after a step failed (two critical events)."""
    ids = []
    for i in range(count):
        claimed = await running(store, now=at + i)
        if i % 3 == 2:
            await store.append(claimed.run_id, claimed.token,
                               [ev(EventType.STEP_FAILED, at + i, name="s", attempt=1,
                                   error={"message": "boom"})], now=at + i,
                               lock_ttl=TTL)
            error = {"code": "step_failed", "error_type": "ValueError", "message": "boom"}
            await store.finish(claimed.run_id, claimed.token,
                               [ev(EventType.RUN_ERROR, at + i, error=error)], now=at + i,
                               status=RunStatus.FAILED, error=error)
        else:
            await complete(store, claimed.run_id, claimed.token, {"i": i}, now=at + i)
        ids.append(claimed.run_id)
    return ids


async def critical_ids(store: Store, run_ids: list[str]) -> set[str]:
    """The ids the collector must hold: ``<run_id>:<seq>`` of each critical event."""
    wanted = {str(EventType.STEP_FAILED), str(EventType.RUN_COMPLETED), str(EventType.RUN_ERROR)}
    return {f"{run_id}:{e['seq']}" for run_id in run_ids
            for e in await store.read_events(run_id) if str(e["type"]) in wanted}


async def test_runs_ended_before_the_first_connector_are_not_sent_those_after_are(
    store: Store,
) -> None:
    before = await ended(store, 2, at=T0 - 100)
    collector = Collector()
    assert (await reconciler(store).reconcile(WF, collector.deliver, now=T0)).outcome \
        == "started"
    after = await ended(store, 4, at=T0 + 1)

    done = await reconciler(store).reconcile(WF, collector.deliver, now=T0 + 100)

    assert (done.outcome, done.runs) == ("sent", 4)
    assert collector.ids == await critical_ids(store, after)
    assert not collector.ids & await critical_ids(store, before)
    again = await reconciler(store).reconcile(WF, collector.deliver, now=T0 + 200)
    assert (again.outcome, collector.sends) == ("idle", 1)


async def test_a_pass_waits_for_the_interval_and_the_grace(store: Store) -> None:
    collector = Collector()
    await reconciler(store).reconcile(WF, collector.deliver, now=T0)
    ids = await ended(store, 3, at=T0 + 10)  # end at T0+10, T0+11, T0+12

    assert (await reconciler(store).reconcile(WF, collector.deliver, now=T0 + 9)).outcome \
        == "fresh"  # another pass ran less than EVERY_S ago
    done = await reconciler(store).reconcile(WF, collector.deliver, now=T0 + 11 + GRACE_S)
    assert done.runs == 2  # the run that ended at T0+12 is within the grace
    done = await reconciler(store).reconcile(WF, collector.deliver,
                                             now=T0 + 11 + GRACE_S + EVERY_S)
    assert done.runs == 1
    assert collector.ids == await critical_ids(store, ids)


async def test_an_undelivered_batch_leaves_the_cursor_for_the_next_pass(store: Store) -> None:
    collector = Collector()
    await reconciler(store).reconcile(WF, collector.deliver, now=T0)
    ids = await ended(store, 3, at=T0 + 1)
    collector.refuse = True

    assert (await reconciler(store).reconcile(WF, collector.deliver, now=T0 + 100)).outcome \
        == "undelivered"
    collector.refuse = False
    done = await reconciler(store).reconcile(WF, collector.deliver, now=T0 + 101)

    assert done.runs == 3
    assert collector.ids == await critical_ids(store, ids)


async def test_the_cursor_is_hidden_from_the_projections_users_list(store: Store) -> None:
    await reconciler(store).reconcile(WF, Collector().deliver, now=T0)

    assert await WorkflowClient(store).projections() == []
    head = await capabilities_of(store).projections.projection_head(  # type: ignore[union-attr]
        cursor_name(ENV, WF))
    assert head is not None and head.checkpoint == (T0 - GRACE_S, "")


class Died(Exception):
    """The connector's process was killed after sending and before moving the cursor."""


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_every_critical_event_reaches_the_collector_whatever_the_faults(
    store: Store, seed: int
) -> None:
    """Rounds of ended runs; each round, a pass by one of three store objects, drawn from
    ``seed``, that delivers, is refused, or dies between delivering and moving the
    cursor. Then clean passes: the collector holds every critical event, and only those."""
    rng = random.Random(seed)
    objects = [store, other_store(store), other_store(store)]
    collector = Collector()
    now = T0
    await reconciler(store).reconcile(WF, collector.deliver, now=now)
    ids: list[str] = []
    try:
        for _ in range(12):
            ids += await ended(store, rng.randrange(0, 5), at=now + 1)
            now += EVERY_S + 10
            fault = rng.choice(["none", "none", "refused", "died"])
            collector.refuse = fault == "refused"

            async def deliver(reports: list[dict[str, Any]], fault: str = fault) -> bool:
                taken = await collector.deliver(reports)
                if fault == "died":
                    raise Died
                return taken

            try:
                await reconciler(rng.choice(objects)).reconcile(WF, deliver, now=now)
            except Died:
                pass
        collector.refuse = False
        for _ in range(20):
            now += EVERY_S + 10
            if (await reconciler(store).reconcile(WF, collector.deliver, now=now)
                    ).outcome == "idle":
                break
        assert collector.ids == await critical_ids(store, ids)
    finally:
        for other in objects[1:]:
            if other is not store:
                await other.aclose()
