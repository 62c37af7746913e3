"""A workflow that blocks the event loop: stand-down, crash charging and quarantine.

lock_ttl is 0.15 s here, so the liveness bound max(3 x lock_ttl, timeout) is 0.45 s and a
body that calls time.sleep(0.9) is found blocking while it still blocks.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from typing import Any

import pytest

from pyrula.workflows import (
    RunFailed,
    RunStatus,
    WorkflowContext,
    WorkflowWorker,
    step,
    workflow,
)
from pyrula.workflows.worker.held import Held, HeldRuns
from tests.conftest import await_until
from tests.unit.worker.worker_support import capture, fast_options, logged, of_type, serving, unique

LOCK_TTL = 0.15
BOUND = 3 * LOCK_TTL
BLOCK_S = 0.9

#: Executions of wblock_after per run key: a step must not start on a stood-down attempt.
EXECUTED: Counter[str] = Counter()
ENTERED: set[str] = set()


@step(name="wblock_after")
def wblock_after(key: str) -> str:
    EXECUTED[key] += 1
    return key


@workflow(name="wblock_blocker")
async def wblock_blocker(ctx: WorkflowContext, params: Any) -> Any:
    """Blocks the loop on its first ``params["blocks"]`` attempts (every one if absent)."""
    if ctx.attempt <= params.get("blocks", 1 << 30):
        time.sleep(BLOCK_S)  # noqa: ASYNC251 - the blocking body under test
    return await wblock_after(params["key"])


@step(name="wblock_wait")
async def wblock_wait(key: str, attempt: int) -> str:
    ENTERED.add(key)
    if attempt == 1:
        await asyncio.sleep(BLOCK_S + 0.5)  # outlives the block, on the loop's own timer
    return key


@workflow(name="wblock_bystander")
async def wblock_bystander(ctx: WorkflowContext, params: Any) -> Any:
    return await wblock_wait(params["key"], ctx.attempt)


@workflow(name="wblock_gather_leg")
async def wblock_gather_leg(ctx: WorkflowContext, params: Any) -> Any:
    """Its body starts a ``gather`` leg that blocks the loop on the first attempts."""

    async def leg() -> None:
        if ctx.attempt <= params.get("blocks", 1 << 30):
            time.sleep(BLOCK_S)  # noqa: ASYNC251 - the blocking leg under test

    await asyncio.gather(leg())
    return await wblock_after(params["key"])


@step(name="wblock_with_tool")
async def wblock_with_tool(key: str, attempt: int, blocks: int) -> str:
    """Runs a "tool call" in a task of its own, which blocks the loop on the first attempts."""

    async def tool() -> None:
        if attempt <= blocks:
            time.sleep(BLOCK_S)  # noqa: ASYNC251 - the blocking tool call under test

    await asyncio.create_task(tool())
    return key


@workflow(name="wblock_tool_call")
async def wblock_tool_call(ctx: WorkflowContext, params: Any) -> Any:
    return await wblock_with_tool(params["key"], ctx.attempt, params.get("blocks", 1 << 30))


def make_worker(store: Any, **options: Any) -> WorkflowWorker:
    return WorkflowWorker(
        store=store,
        workflows=[wblock_blocker, wblock_bystander, wblock_gather_leg, wblock_tool_call],
        options=fast_options(lock_ttl=LOCK_TTL, **options),
    )


async def test_a_blocking_run_is_stood_down_charged_and_then_quarantined(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    capture(caplog)
    key = unique("quarantine")
    worker = make_worker(store, poison_max_retries=1)
    async with serving(worker):
        run = await worker.client.submit(wblock_blocker, {"key": key})
        with pytest.raises(RunFailed) as failed:
            await worker.client.result(run.run_id, timeout=20)
        await await_until(lambda: worker.in_flight == 0, what="the last attempt to end")
    error = failed.value.error
    assert error["code"] == "max_retries"
    assert error["error_type"] == "EventLoopBlocked"
    detail = error["detail"]
    assert detail["cause"] == "loop_blocked"
    assert detail["blocked_for_s"] > BOUND
    assert detail["liveness_bound_s"] == pytest.approx(BOUND)
    events = await worker.client.events(run.run_id)
    # poison_max_retries=1: one stand-down is retried, the next quarantines.
    assert [e["reason"] for e in of_type(events, "run:requeued")] == ["loop_blocked"]
    assert [e["code"] for e in of_type(events, "run:error")] == ["max_retries"]
    assert len(of_type(events, "run:started")) == 2
    records = logged(caplog, "run_attempt_loop_blocked")
    assert len(records) == 2
    assert {r.run_id for r in records} == {run.run_id}  # type: ignore[attr-defined]
    assert EXECUTED[key] == 0  # no step ran on a stood-down attempt


async def test_a_run_merely_waiting_on_the_blocked_loop_is_requeued_but_not_charged(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    capture(caplog)
    # poison_max_retries=0: any charged stand-down quarantines at once.
    worker = make_worker(store, poison_max_retries=0)
    async with serving(worker):
        bystander_key = unique("by")
        bystander = await worker.client.submit(wblock_bystander, {"key": bystander_key})
        await await_until(lambda: bystander_key in ENTERED, what="the bystander in its step")
        blocker = await worker.client.submit(wblock_blocker, {"key": unique("bl")})
        with pytest.raises(RunFailed) as failed:
            await worker.client.result(blocker.run_id, timeout=20)
        assert await worker.client.result(bystander.run_id, timeout=20) == bystander_key
        await await_until(lambda: worker.in_flight == 0, what="every attempt to end")
    assert failed.value.error["error_type"] == "EventLoopBlocked"
    events = await worker.client.events(bystander.run_id)
    assert [e["reason"] for e in of_type(events, "run:requeued")] == ["loop_blocked"]
    assert of_type(events, "run:error") == []
    charged = logged(caplog, "run_attempt_loop_blocked")
    assert {r.run_id for r in charged} == {blocker.run_id}  # type: ignore[attr-defined]
    assert {r.run_id for r in logged(caplog, "run_stood_down")} == {  # type: ignore[attr-defined]
        bystander.run_id
    }


async def test_with_poison_counts_loop_blocked_false_no_crash_is_counted(store: Any) -> None:
    key = unique("dev")
    # poison_max_retries=0: a counted stand-down would quarantine the run at once.
    worker = make_worker(store, poison_max_retries=0, poison_counts_loop_blocked=False)
    async with serving(worker):
        run = await worker.client.submit(wblock_blocker, {"key": key, "blocks": 1})
        assert await worker.client.result(run.run_id, timeout=20) == key
        await await_until(lambda: worker.in_flight == 0, what="every attempt to end")
    events = await worker.client.events(run.run_id)
    assert [e["reason"] for e in of_type(events, "run:requeued")] == ["loop_blocked"]
    assert (await worker.client.get(run.run_id)).status is RunStatus.COMPLETED
    # Attempt 1 lost its lock while blocked: the step after the block ran on attempt 2 only.
    assert EXECUTED[key] == 1


@pytest.mark.skipif(sys.version_info < (3, 12), reason="Python 3.11 has no "
                    "Task.get_context(): a block in a task the run started charges no run "
                    "there (test_on_3_11_a_block_in_a_task_the_run_started_is_not_charged)")
@pytest.mark.parametrize("name", ["wblock_gather_leg", "wblock_tool_call"])
async def test_a_block_in_a_task_the_run_started_is_charged_to_the_run(
    store: Any, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    capture(caplog)
    key = unique(name)
    worker = make_worker(store, poison_max_retries=1)
    async with serving(worker):
        run = await worker.client.submit(name, {"key": key})
        with pytest.raises(RunFailed) as failed:
            await worker.client.result(run.run_id, timeout=20)
        await await_until(lambda: worker.in_flight == 0, what="the last attempt to end")
    # Exactly as when the run's own code blocks: charged twice, quarantined the second time.
    error = failed.value.error
    assert error["code"] == "max_retries"
    assert error["error_type"] == "EventLoopBlocked"
    assert error["detail"]["cause"] == "loop_blocked"
    events = await worker.client.events(run.run_id)
    assert [e["reason"] for e in of_type(events, "run:requeued")] == ["loop_blocked"]
    records = logged(caplog, "run_attempt_loop_blocked")
    assert [r.run_id for r in records] == [run.run_id] * 2  # type: ignore[attr-defined]
    assert logged(caplog, "run_stood_down") == []
    assert EXECUTED[key] == 0


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="on Python 3.12 and later the run "
                    "is charged (test_a_block_in_a_task_the_run_started_is_charged_to_the_run)")
@pytest.mark.parametrize("name", ["wblock_gather_leg", "wblock_tool_call"])
async def test_on_3_11_a_block_in_a_task_the_run_started_is_not_charged(
    store: Any, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    # The documented 3.11 behaviour: the task is not the run's own (its name says nothing),
    # so the run is stood down like a bystander and no crash is counted.
    capture(caplog)
    key = unique(name)
    worker = make_worker(store, poison_max_retries=0)
    async with serving(worker):
        run = await worker.client.submit(name, {"key": key, "blocks": 1})
        assert await worker.client.result(run.run_id, timeout=20) == key
        await await_until(lambda: worker.in_flight == 0, what="every attempt to end")
    events = await worker.client.events(run.run_id)
    assert [e["reason"] for e in of_type(events, "run:requeued")] == ["loop_blocked"]
    assert logged(caplog, "run_attempt_loop_blocked") == []
    assert [r.run_id for r in logged(caplog, "run_stood_down")] == [  # type: ignore[attr-defined]
        run.run_id
    ]


def test_releasing_a_stood_down_attempt_keeps_the_next_attempt_held() -> None:
    """The same worker may claim a run's next attempt while the stood-down one still ends."""
    runs = HeldRuns()
    runs.claimed("r", 1)
    runs.renew("r", 1, 3.0)
    runs.stand_down("r", 1)
    runs.claimed("r", 2)
    runs.renew("r", 2, 3.0)
    assert runs.release("r", 1) is True
    assert runs.renewing() == {"r": Held(2, 3.0)}
    assert runs.held() == {"r": 2}
    assert runs.release("r", 2) is False
    assert runs.renewing() == {}
    assert runs.held() == {}
