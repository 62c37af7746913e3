"""The worker's projection loop: runs that end are folded by the workers, each once, two
workers racing; a keyed projection; a fold that raises is said once and leaves the
projection where it was; a store without projections is said once. Time is a
ManualClock; tests wait on conditions."""

from __future__ import annotations

from typing import Any

import pytest

from pyrula.workflows import (
    MemoryStore,
    RunInfo,
    WorkflowClient,
    WorkflowContext,
    WorkflowWorker,
    projection,
    workflow,
)
from pyrula.workflows.clock import ManualClock
from pyrula.workflows.stores.capabilities import Capabilities
from tests.conftest import await_until
from tests.unit.worker.worker_support import capture, fast_options, logged, serving

T = 1_800_000_000.0


@workflow(name="proj.order")
async def order(ctx: WorkflowContext, params: Any) -> Any:
    if params.get("fail"):
        raise RuntimeError("declined")
    return params["amount"]


@projection("proj.order_ids", on=["proj.order"])
def order_ids(state: Any, run: RunInfo) -> Any:
    return [*(state or []), run.run_id]


@projection("proj.revenue", on=[order], key=lambda run: run.params["customer"])
def revenue(state: Any, run: RunInfo) -> Any:
    total = dict(state or {"paid": 0, "failed": 0})
    if run.status.value == "completed":
        total["paid"] += run.result
    else:
        total["failed"] += 1
    return total


@projection("proj.broken", on=["proj.order"])
def broken(state: Any, run: RunInfo) -> Any:
    raise KeyError("no such field")


def _worker(store: Any, clock: ManualClock, projections: list[Any]) -> WorkflowWorker:
    return WorkflowWorker(store=store, workflows=[order], clock=clock, projections=projections,
                          options=fast_options(projection_interval=0.01, projection_grace=0.0,
                                               lock_ttl=60.0))


async def _orders(client: WorkflowClient, rows: list[dict[str, Any]]) -> list[str]:
    ids = [(await client.submit("proj.order", row)).run_id for row in rows]
    for run_id in ids:
        await client.store.wait_result(run_id, 10.0)
    return ids


async def test_two_workers_fold_every_ended_run_once() -> None:
    store, clock = MemoryStore(), ManualClock(T)
    client = WorkflowClient(store, clock=clock)
    async with serving(_worker(store, clock, [order_ids])), \
            serving(_worker(store, clock, [order_ids])):
        ids = await _orders(client, [{"amount": i} for i in range(20)])

        async def all_folded() -> bool:
            return len(await client.projection("proj.order_ids") or []) >= len(ids)

        await await_until(all_folded, what="every run folded")
    folded = await client.projection("proj.order_ids")
    assert sorted(folded) == sorted(ids) and len(set(folded)) == len(folded)
    info = await client.projection_info("proj.order_ids")
    assert info is not None and info.folded == len(ids)


async def test_a_keyed_projection_is_read_per_key_or_whole() -> None:
    store, clock = MemoryStore(), ManualClock(T)
    client = WorkflowClient(store, clock=clock)
    assert await client.projection("proj.revenue") is None
    async with serving(_worker(store, clock, [revenue])):
        await _orders(client, [{"customer": "acme", "amount": 5},
                               {"customer": "acme", "amount": 7},
                               {"customer": "bolt", "amount": 1, "fail": True}])

        async def folded() -> bool:
            info = await client.projection_info("proj.revenue")
            return info is not None and info.folded == 3

        await await_until(folded, what="three runs folded")
    assert await client.projection("proj.revenue", key="acme") == {"paid": 12, "failed": 0}
    assert await client.projection("proj.revenue", "nobody") is None
    assert await client.projection("proj.revenue") == {
        "acme": {"paid": 12, "failed": 0}, "bolt": {"paid": 0, "failed": 1}}


async def test_a_key_for_a_projection_that_is_not_keyed_is_refused() -> None:
    store, clock = MemoryStore(), ManualClock(T)
    client = WorkflowClient(store, clock=clock)
    async with serving(_worker(store, clock, [order_ids])):
        await _orders(client, [{"amount": 1}])
        await await_until(lambda: client.projection("proj.order_ids"), what="a fold")
    with pytest.raises(ValueError, match="'proj.order_ids' is not keyed"):
        await client.projection("proj.order_ids", key="a")


async def test_a_fold_that_raises_is_said_once_and_folds_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    capture(caplog)
    store, clock = MemoryStore(), ManualClock(T)
    client = WorkflowClient(store, clock=clock)
    async with serving(_worker(store, clock, [broken])):
        await _orders(client, [{"amount": 1}])
        await await_until(lambda: bool(logged(caplog, "projection_fold_failed")),
                          what="the failure logged")
        clock.advance(1.0)
    assert len(logged(caplog, "projection_fold_failed")) == 1
    assert await client.projection("proj.broken") is None


async def test_a_store_without_projections_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    capture(caplog)

    class NoProjections(MemoryStore):
        def capabilities(self) -> Capabilities:
            return Capabilities()

    async with serving(_worker(NoProjections(), ManualClock(T), [order_ids])):
        pass
    [record] = logged(caplog, "projection_loop_unsupported")
    assert "proj.order_ids" in record.getMessage()


def test_projections_must_be_projection_folds() -> None:
    with pytest.raises(TypeError, match="is not a @projection"):
        WorkflowWorker(store=MemoryStore(), workflows=[order], projections=[order])
    with pytest.raises(TypeError, match="must be a list of @projection folds"):
        WorkflowWorker(store=MemoryStore(), workflows=[order],
                       projections="proj.order_ids")
