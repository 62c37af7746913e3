"""An ended attempt's objects are freed as it ends, without the cyclic collector.

An attempt is a small graph of objects (the attempt, its replay, writes, operations, the
body's task and its context). Were any of them to refer back to another, every attempt
would be a reference cycle, left in memory until the cyclic collector found it; on a busy
worker those passes took ~15 % of the process's time. Here the collector is off while a
worker runs runs of drawn shapes (sync and async steps, a step retried, a durable sleep, a
workflow that fails, one that is cancelled, a child, a continue-as-new), and once they
have all ended no attempt's object is left alive, on every store.
"""

from __future__ import annotations

import asyncio
import functools
import gc
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyrula.workflows import (
    RunCancelled,
    RunFailed,
    RunStatus,
    WorkflowContext,
    WorkflowWorker,
    step,
    workflow,
)
from pyrula.workflows.engine import Attempt
from pyrula.workflows.operations import Body, Operations
from pyrula.workflows.replay import Replay
from pyrula.workflows.writes import Writes
from tests.conftest import await_until
from tests.unit.worker.worker_support import fast_options, serving

#: The classes of an attempt's graph.
ATTEMPT_PARTS = (Attempt, Body, Operations, Replay, Writes)

_tries: dict[str, int] = {}


@step(name="wfree_sync")
def wfree_sync(x: int) -> int:
    return x + 1


@step(name="wfree_async")
async def wfree_async(x: int) -> int:
    return x + 1


@step(name="wfree_flaky", retries=2, retry_backoff=0.0)
def wfree_flaky(key: str) -> int:
    _tries[key] = _tries.get(key, 0) + 1
    if _tries[key] == 1:
        raise ValueError(f"{key}: the first try fails")
    return 1


@workflow(name="wfree_kid")
async def wfree_kid(ctx: WorkflowContext, params: int) -> int:
    value: int = await wfree_sync(params)
    return value


@workflow(name="wfree_shaped")
async def wfree_shaped(ctx: WorkflowContext, params: dict[str, Any]) -> int:
    x = 0
    for kind in params["steps"]:
        x = await (wfree_sync(x) if kind == "sync" else wfree_async(x))
    end = params["end"]
    if end == "retried":
        x += await wfree_flaky(params["key"])
    elif end == "sleep":
        await ctx.sleep(0.01)
    elif end == "wait":
        await ctx.wait_for_signal("never")  # cancelled by the test
    elif end == "raise":
        raise RuntimeError("the workflow fails")
    elif end == "child":
        x += await ctx.child(wfree_kid, x)
    elif end == "continue" and not params.get("continued"):
        ctx.continue_as_new({**params, "continued": True})
    return x


shapes = st.fixed_dictionaries({
    "steps": st.lists(st.sampled_from(["sync", "async"]), max_size=3),
    "end": st.sampled_from(["return", "retried", "sleep", "wait", "raise", "child",
                            "continue"]),
})


def alive() -> list[str]:
    return [type(o).__qualname__ for o in gc.get_objects() if isinstance(o, ATTEMPT_PARTS)]


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(shapes, min_size=1, max_size=8))
def test_no_attempt_outlives_its_end_without_the_cyclic_collector(
        store: Any, collector_off: None, runs: list[dict[str, Any]]) -> None:
    asyncio.run(_run_all(store, runs))


async def _run_all(store: Any, runs: list[dict[str, Any]]) -> None:
    worker = WorkflowWorker(store=store, workflows=[wfree_shaped, wfree_kid],
                            options=fast_options())
    async with serving(worker):
        assert alive() == []
        handles = []
        for i, shape in enumerate(runs):
            params = {**shape, "key": f"{id(runs)}-{i}"}
            handles.append((shape, (await worker.client.submit(wfree_shaped, params)).run_id))
        for shape, run_id in handles:
            if shape["end"] == "wait":
                await await_until(functools.partial(_waiting, worker, run_id),
                                  what="run parked")
                await worker.client.cancel(run_id)
        for shape, run_id in handles:
            expected: type[BaseException] | None = {
                "raise": RunFailed, "wait": RunCancelled}.get(shape["end"])
            if expected is None:
                await worker.client.result(run_id, timeout=20)
            else:
                with pytest.raises(expected):
                    await worker.client.result(run_id, timeout=20)
        # Each attempt ends a moment after its run's end is written.
        await await_until(lambda: worker.in_flight == 0, what="attempts ended")
        await await_until(lambda: alive() == [], what="no attempt left alive", timeout=5)


async def _waiting(worker: WorkflowWorker, run_id: str) -> bool:
    info = await worker.client.get(run_id)
    return info.status is RunStatus.WAITING
