"""What a worker serves, durable timers, run and step timeouts, cancelling a running run."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from pyrula.workflows import (
    ConfigurationError,
    RunCancelled,
    RunFailed,
    RunStatus,
    WorkflowContext,
    WorkflowNotFound,
    WorkflowWorker,
    step,
    workflow,
)
from pyrula.workflows.definition import Registry
from tests.conftest import await_until
from tests.unit.worker.worker_support import Spy, fast_options, of_type, serving, unique


@step(name="wserve_add")
def wserve_add(a: int, b: int) -> int:
    return a + b


@workflow(name="wserve_a")
async def wserve_a(ctx: WorkflowContext, params: Any) -> Any:
    return await wserve_add(params["x"], 1)


@workflow(name="wserve_b")
async def wserve_b(ctx: WorkflowContext, params: Any) -> Any:
    return "b"


@workflow(name="wserve_sleeper")
async def wserve_sleeper(ctx: WorkflowContext, params: Any) -> Any:
    before = await wserve_add(1, 1)
    await ctx.sleep(params.get("seconds", 0.2))
    return before + await wserve_add(1, 2)


@workflow(name="wserve_sleep_until")
async def wserve_sleep_until(ctx: WorkflowContext, params: Any) -> Any:
    await ctx.sleep_until(datetime.fromtimestamp(params["at"], UTC))
    return params["i"]


@step(name="wserve_forever")
async def wserve_forever() -> None:
    await asyncio.Event().wait()


@workflow(name="wserve_slow_run", timeout=0.3)
async def wserve_slow_run(ctx: WorkflowContext, params: Any) -> Any:
    await wserve_forever()


@workflow(name="wserve_long_sleep", timeout=0.3)
async def wserve_long_sleep(ctx: WorkflowContext, params: Any) -> Any:
    await ctx.sleep(3600)


@step(name="wserve_slow_async", timeout=0.1)
async def wserve_slow_async() -> None:
    await asyncio.sleep(30)


@workflow(name="wserve_step_timeout")
async def wserve_step_timeout(ctx: WorkflowContext, params: Any) -> Any:
    await wserve_slow_async()


#: Keys of the runs whose endless step has started (step:started is written only when
#: the step ends, so the journal cannot tell).
ENTERED: set[str] = set()


@step(name="wserve_stuck")
async def wserve_stuck(key: str) -> None:
    ENTERED.add(key)
    await asyncio.Event().wait()


@workflow(name="wserve_cancellable")
async def wserve_cancellable(ctx: WorkflowContext, params: Any) -> Any:
    await wserve_add(1, 1)
    await wserve_stuck(params["key"])


async def test_workflows_restricts_what_is_claimed(store: Any) -> None:
    spy = Spy(store, "claim")
    worker = WorkflowWorker(store=store, workflows=[wserve_a], options=fast_options())
    assert worker.workflow_names == ["wserve_a"]
    async with serving(worker):
        other = await worker.client.submit("wserve_b", {})
        mine = await worker.client.submit(wserve_a, {"x": 1})
        assert await worker.client.result(mine.run_id, timeout=10) == 2
        claims = spy.count("claim")
        await await_until(lambda: spy.count("claim") >= claims + 3, what="more claim ticks")
        assert (await worker.client.get(other.run_id)).status is RunStatus.QUEUED
    assert {tuple(a[1]) for a, _, _ in spy.of("claim")} == {("wserve_a",)}
    assert (await worker.client.get(other.run_id)).status is RunStatus.QUEUED


async def test_by_default_the_worker_serves_every_imported_workflow(store: Any) -> None:
    worker = WorkflowWorker(store=store, options=fast_options())
    assert {"wserve_a", "wserve_b", "wserve_sleeper"} <= set(worker.workflow_names)
    async with serving(worker):
        a = await worker.client.submit("wserve_a", {"x": 41})
        b = await worker.client.submit("wserve_b", {})
        assert await worker.client.result(a.run_id, timeout=10) == 42
        assert await worker.client.result(b.run_id, timeout=10) == "b"


def test_an_unknown_workflow_in_the_list_is_refused(store: Any) -> None:
    with pytest.raises(WorkflowNotFound, match="wserve_nope"):
        WorkflowWorker(store=store, workflows=["wserve_nope"])


async def test_a_worker_with_no_workflow_at_all_refuses_to_start(store: Any) -> None:
    worker = WorkflowWorker(store=store, registry=Registry(), options=fast_options())
    with pytest.raises(ConfigurationError, match="no @workflow"):
        await worker.run()


async def test_a_sleeping_run_is_woken_by_the_timer_loop_and_completes(store: Any) -> None:
    worker = WorkflowWorker(store=store, workflows=[wserve_sleeper], options=fast_options())
    async with serving(worker):
        run = await worker.client.submit(wserve_sleeper, {"seconds": 0.2})
        assert await worker.client.result(run.run_id, timeout=10) == 5
    events = await worker.client.events(run.run_id)
    assert [e["reason"] for e in of_type(events, "run:woken")] == ["timer"]
    assert len(of_type(events, "run:started")) == 2
    assert worker.metrics.get("pyrula.workflows.timers.woken") == 1


async def test_timer_max_batch_bounds_the_wakes_of_one_tick(store: Any) -> None:
    spy = Spy(store, "wake_due")
    options = fast_options(timer_max_batch=2, timer_poll_interval_s=0.05)
    worker = WorkflowWorker(store=store, workflows=[wserve_sleep_until], options=options)
    at = datetime.now(UTC).timestamp() + 1.0
    async with serving(worker):
        runs = [await worker.client.submit(wserve_sleep_until, {"at": at, "i": i})
                for i in range(5)]

        async def all_parked() -> bool:
            infos = [await worker.client.get(r.run_id) for r in runs]
            return all(i.status is RunStatus.SLEEPING for i in infos)

        await await_until(all_parked, what="every run parked until the same moment")
        results = [await worker.client.result(r.run_id, timeout=10) for r in runs]
    assert results == list(range(5))
    woken = [result for _, _, result in spy.of("wake_due")]
    assert {kwargs["limit"] for _, kwargs, _ in spy.of("wake_due")} == {2}
    assert max(woken) == 2 and sum(woken) == 5
    assert woken.count(2) >= 2  # a full batch is followed at once by another tick


async def test_a_run_timeout_fails_a_run_still_running(store: Any) -> None:
    worker = WorkflowWorker(store=store, workflows=[wserve_slow_run], options=fast_options())
    async with serving(worker):
        run = await worker.client.submit(wserve_slow_run, {})
        with pytest.raises(RunFailed) as failed:
            await worker.client.result(run.run_id, timeout=10)
    assert failed.value.error["code"] == "timeout"
    assert failed.value.error["error_type"] == "TimeoutError"


async def test_a_run_timeout_ends_a_sleeping_run_at_its_deadline(store: Any) -> None:
    worker = WorkflowWorker(store=store, workflows=[wserve_long_sleep], options=fast_options())
    async with serving(worker):
        run = await worker.client.submit(wserve_long_sleep, {})
        with pytest.raises(RunFailed) as failed:
            await worker.client.result(run.run_id, timeout=10)
    assert failed.value.error["code"] == "timeout"
    sleeping = of_type(await worker.client.events(run.run_id), "run:sleeping")
    assert sleeping and sleeping[0]["wake_at"] > datetime.now(UTC).timestamp() + 3000


async def test_a_step_timeout_fails_the_step_under_the_worker(store: Any) -> None:
    worker = WorkflowWorker(store=store, workflows=[wserve_step_timeout], options=fast_options())
    async with serving(worker):
        run = await worker.client.submit(wserve_step_timeout, {})
        with pytest.raises(RunFailed) as failed:
            await worker.client.result(run.run_id, timeout=10)
    error = failed.value.error
    assert error["code"] == "step_failed"
    assert error["error_type"] == "StepTimeout"
    assert error["detail"]["step"] == "wserve_slow_async"
    failures = of_type(await worker.client.events(run.run_id), "step:failed")
    assert [f["will_retry"] for f in failures] == [False]


async def test_cancelling_a_running_run_ends_it_cancelled(store: Any) -> None:
    worker = WorkflowWorker(store=store, workflows=[wserve_cancellable], options=fast_options())
    async with serving(worker):
        key = unique("cancel")
        run = await worker.client.submit(wserve_cancellable, {"key": key})
        await await_until(lambda: key in ENTERED, what="the run in its endless step")
        assert (await worker.client.get(run.run_id)).status is RunStatus.RUNNING
        assert await worker.client.cancel(run.run_id) is True
        with pytest.raises(RunCancelled):
            await worker.client.result(run.run_id, timeout=10)
        await await_until(lambda: worker.in_flight == 0, what="the attempt to end")
    events = await worker.client.events(run.run_id)
    assert events[-1]["type"] == "run:cancelled"
    assert (await worker.client.get(run.run_id)).status is RunStatus.CANCELLED


async def test_wait_ready_returns_as_the_worker_starts_serving_and_says_whether(
        store: Any) -> None:
    worker = WorkflowWorker(store=store, workflows=[wserve_a], options=fast_options())
    assert await worker.wait_ready(0.01) is False  # not running yet
    task = asyncio.create_task(worker.run())
    assert await worker.wait_ready(10) is True
    assert worker.state == "ready"
    worker.stop()
    assert await worker.wait_ready(0.01) is False  # draining: no longer serving
    await asyncio.wait_for(task, 30)
