"""``step_info()``: a step knows which run, call and attempt it executes in — the stable
key a downstream service can drop a duplicate execution by."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from pyrula.workflows import (
    InlineWorkflowRunner,
    MemoryStore,
    StepInfo,
    WorkflowContext,
    step,
    step_info,
    workflow,
)

SEEN: list[tuple[StepInfo | None, str]] = []


@step(name="si.async_step")
async def async_step(x: int) -> int:
    SEEN.append((step_info(), "async"))
    return x + 1


@step(name="si.sync_step")
def sync_step(x: int) -> int:
    SEEN.append((step_info(), threading.current_thread().name))
    return x + 1


_failures = {"left": 1}


@step(name="si.flaky", retries=2, retry_backoff=0)
async def flaky(x: int) -> int:
    SEEN.append((step_info(), "flaky"))
    if _failures["left"]:
        _failures["left"] -= 1
        raise RuntimeError("first try fails")
    return x


@workflow(name="si.flow")
async def flow(ctx: WorkflowContext, params: dict[str, Any]) -> int:
    x = await async_step(0)
    ctx.now()
    x = await sync_step(x)
    return int(await flaky(x))


def test_each_step_sees_its_run_call_and_attempt() -> None:
    SEEN.clear()
    _failures["left"] = 1
    runner = InlineWorkflowRunner(MemoryStore())
    run_id = asyncio.run(_run(runner))
    infos = [info for info, _ in SEEN]
    assert all(info is not None for info in infos)
    assert [(i.step, i.call, i.step_attempt) for i in infos if i] == [
        ("si.async_step", 1, 1), ("si.sync_step", 3, 1), ("si.flaky", 4, 1), ("si.flaky", 4, 2)]
    for info in infos:
        assert info is not None
        assert info.run_id == run_id and info.workflow == "si.flow" and info.attempt == 1
    assert infos[2] and infos[2].idempotency_key == f"{run_id}:4"
    # The sync step ran on a worker thread and still saw its own step.
    assert SEEN[1][1] != threading.main_thread().name


async def _run(runner: InlineWorkflowRunner) -> str:
    handle = await runner.client.submit("si.flow", {})
    await runner.run("si.flow", handle.run_id)
    assert await runner.client.result(handle.run_id, timeout=5) == 2
    return handle.run_id


def test_outside_a_workflow_a_step_is_a_plain_function_without_info() -> None:
    SEEN.clear()
    assert asyncio.run(async_step(1)) == 2
    assert sync_step(1) == 2
    assert [info for info, _ in SEEN] == [None, None]
