"""The worker's trigger loop: batches of emitted events start runs (by size, by wait),
two workers start each batch once, a paused worker starts none, a store without events is
said once. Time is a ManualClock; tests wait on conditions."""

from __future__ import annotations

from typing import Any

import pytest

from pyrula.workflows import (
    BatchTrigger,
    MemoryStore,
    RunStatus,
    WorkflowClient,
    WorkflowContext,
    WorkflowWorker,
    workflow,
)
from pyrula.workflows.clock import ManualClock
from pyrula.workflows.stores.capabilities import Capabilities
from pyrula.workflows.worker.triggers import TriggerLoop
from tests.conftest import await_until
from tests.unit.worker.worker_support import capture, fast_options, logged, serving

T = 1_800_000_000.0


@workflow(name="trig.collect", trigger=BatchTrigger("trig.orders", max_size=3, max_wait=10.0))
async def collect(ctx: WorkflowContext, params: Any) -> Any:
    return [event["payload"] for event in params["events"]]


def _worker(store: Any, clock: ManualClock) -> WorkflowWorker:
    return WorkflowWorker(store=store, workflows=[collect], clock=clock,
                          options=fast_options(trigger_interval=0.01, lock_ttl=60.0))


async def _results(client: WorkflowClient) -> list[Any]:
    runs = [r async for r in client.list_runs(name="trig.collect")]
    done = [r for r in runs if r.status is RunStatus.COMPLETED]
    return sorted((r.result for r in done), key=str) if len(done) == len(runs) else []


async def _two(client: WorkflowClient) -> bool:
    return len(await _results(client)) == 2


async def test_a_full_batch_and_a_waited_one_each_start_a_run() -> None:
    store, clock = MemoryStore(), ManualClock(T)
    client = WorkflowClient(store, clock=clock)
    async with serving(_worker(store, clock)):
        for i in range(4):
            await client.emit("trig.orders", i)
        await await_until(lambda: _results(client), what="the full batch's run")
        assert await _results(client) == [[0, 1, 2]]
        clock.advance(10.0)  # the fourth event has waited max_wait
        await await_until(lambda: _two(client), what="the waited batch's run")
    assert await _results(client) == [[0, 1, 2], [3]]


async def test_two_workers_start_each_batch_once() -> None:
    store, clock = MemoryStore(), ManualClock(T)
    client = WorkflowClient(store, clock=clock)
    async with serving(_worker(store, clock)), serving(_worker(store, clock)):
        for i in range(30):
            await client.emit("trig.orders", i)

        async def ten() -> bool:
            return len(await _results(client)) == 10

        await await_until(ten, what="ten runs")
    payloads = sorted(p for batch in await _results(client) for p in batch)
    assert payloads == list(range(30))


async def test_a_paused_loop_starts_nothing() -> None:
    store = MemoryStore()
    client = WorkflowClient(store)
    await client.emit("trig.orders", 1)

    class Paused:
        paused = True

    loop = TriggerLoop(store, {"trig.collect": BatchTrigger("trig.orders", max_size=1)},
                       _Metrics(), {}, interval=1.0, runtime=Paused())  # type: ignore[arg-type]
    assert await loop.tick(T) is None
    assert [r async for r in client.list_runs()] == []


class _Metrics:
    def inc(self, *args: Any, **kwargs: Any) -> None:
        return None


async def test_a_store_without_events_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    capture(caplog)

    class NoEvents(MemoryStore):
        def capabilities(self) -> Capabilities:
            return Capabilities()

    async with serving(_worker(NoEvents(), ManualClock(T))):
        pass
    [record] = logged(caplog, "trigger_loop_unsupported")
    assert "trig.collect" in record.getMessage()
