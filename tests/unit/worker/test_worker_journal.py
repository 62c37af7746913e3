"""Journal durability (one append per step, or write-behind) and the journal cache."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pyrula.workflows import RunStatus, WorkflowContext, WorkflowWorker, step, workflow
from pyrula.workflows.worker.worker import JournalCacheMismatch
from tests.conftest import await_until
from tests.unit.worker.worker_support import (
    Spy,
    capture,
    fast_options,
    logged,
    serving,
    shape,
    start,
)

STEPS = 6
RESULT = ((2 * 1 + 1) * 2 + 1) * 2  # wjournal_waits with both signals carrying 1


@step(name="wjournal_double")
def wjournal_double(x: int) -> int:
    return 2 * x


@workflow(name="wjournal_chain")
async def wjournal_chain(ctx: WorkflowContext, params: Any) -> Any:
    x = 1
    for _ in range(STEPS):
        x = await wjournal_double(x)
    return x


@workflow(name="wjournal_waits")
async def wjournal_waits(ctx: WorkflowContext, params: Any) -> Any:
    """Parks twice; each resume should need only the events appended since."""
    x = await wjournal_double(1)
    x += await ctx.wait_for_signal("go")
    x = await wjournal_double(x)
    x += await ctx.wait_for_signal("go")
    return await wjournal_double(x)


async def run_chain(store: Any, **options: Any) -> tuple[int, list[Any]]:
    spy = Spy(store, "append")
    worker = WorkflowWorker(
        store=store, workflows=[wjournal_chain], options=fast_options(**options)
    )
    async with serving(worker):
        run = await worker.client.submit(wjournal_chain, {})
        assert await worker.client.result(run.run_id, timeout=10) == 2**STEPS
    return spy.count("append", run.run_id), await worker.client.events(run.run_id)


async def test_step_boundary_durability_appends_once_per_step(store: Any) -> None:
    appends, events = await run_chain(store)
    assert appends == STEPS
    assert [e["type"] for e in events].count("step:completed") == STEPS


async def test_write_behind_batches_and_keeps_the_same_journal(store: Any) -> None:
    durable_appends, durable = await run_chain(store)
    whole_run_appends, whole_run = await run_chain(store, step_boundary_durability=False)
    buffered_appends, buffered = await run_chain(
        store, step_boundary_durability=False, event_buffer_size=4
    )
    assert durable_appends == STEPS
    assert whole_run_appends == 0  # everything goes with the terminal write
    # 2 events a step: the buffer reaches 4 after every second step.
    assert buffered_appends == STEPS // 2
    assert shape(whole_run) == shape(durable) == shape(buffered)


async def test_a_run_resumed_on_the_same_worker_reads_only_new_events(store: Any) -> None:
    spy = Spy(store, "read_events")
    worker = WorkflowWorker(store=store, workflows=[wjournal_waits], options=fast_options())
    async with serving(worker):
        run = await worker.client.submit(wjournal_waits, {})
        for _ in range(2):
            await wait_parked(worker, run.run_id)
            await worker.client.signal(run.run_id, "go", 1)
        assert await worker.client.result(run.run_id, timeout=10) == RESULT
    assert spy.count("read_events", run.run_id) == 0
    assert worker._cache.hits == 2


async def test_journal_cache_events_zero_turns_the_cache_off(store: Any) -> None:
    spy = Spy(store, "read_events")
    worker = WorkflowWorker(
        store=store, workflows=[wjournal_waits], options=fast_options(journal_cache_events=0)
    )
    async with serving(worker):
        run = await worker.client.submit(wjournal_waits, {})
        for _ in range(2):
            await wait_parked(worker, run.run_id)
            await worker.client.signal(run.run_id, "go", 1)
        assert await worker.client.result(run.run_id, timeout=10) == RESULT
    reads = [args for args, _, _ in spy.of("read_events") if args[0] == run.run_id]
    assert len(reads) == 2  # one whole-journal read per resume
    assert len(worker._cache) == 0 and worker._cache.hits == 0


async def test_the_cache_is_bounded_in_events(store: Any) -> None:
    worker = WorkflowWorker(
        store=store, workflows=[wjournal_waits], options=fast_options(journal_cache_events=12)
    )
    async with serving(worker):
        runs = [await worker.client.submit(wjournal_waits, {}) for _ in range(3)]
        for run in runs:
            await wait_parked(worker, run.run_id)
        assert worker._cache.events <= 12
        assert len(worker._cache) < 3  # 3 journals of 5 events do not fit in 12
        for run in runs:
            await worker.client.signal(run.run_id, "go", 1)
            await wait_parked(worker, run.run_id)
            await worker.client.signal(run.run_id, "go", 1)
        for run in runs:  # a journal that fell out of the cache is read from the store
            assert await worker.client.result(run.run_id, timeout=10) == RESULT


async def test_cache_verify_compares_every_hit_with_the_store(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYRULA_JOURNAL_CACHE_VERIFY", "1")
    spy = Spy(store, "read_events")
    worker = WorkflowWorker(store=store, workflows=[wjournal_waits], options=fast_options())
    assert worker.options.journal_cache_verify is True
    async with serving(worker):
        run = await worker.client.submit(wjournal_waits, {})
        for _ in range(2):
            await wait_parked(worker, run.run_id)
            await worker.client.signal(run.run_id, "go", 1)
        assert await worker.client.result(run.run_id, timeout=10) == RESULT
    assert worker._cache.hits == 2
    assert spy.count("read_events", run.run_id) == 2  # one comparison per hit


async def test_a_corrupt_cache_entry_stops_the_worker_loudly(
    store: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    capture(caplog)
    monkeypatch.setenv("PYRULA_JOURNAL_CACHE_VERIFY", "1")
    worker = WorkflowWorker(store=store, workflows=[wjournal_waits], options=fast_options())
    task = await start(worker)
    run = await worker.client.submit(wjournal_waits, {})
    await wait_parked(worker, run.run_id)
    cached = worker._cache._journals[run.run_id]
    completed = next(e for e in cached if e["type"] == "step:completed")
    completed["result"] = 999  # what a cache bug would look like
    await worker.client.signal(run.run_id, "go", 1)
    with pytest.raises(JournalCacheMismatch, match=run.run_id):
        await asyncio.wait_for(task, 30)
    assert len(logged(caplog, "journal_cache_mismatch")) == 1
    assert worker.state == "stopped"
    info = await worker.client.get(run.run_id)
    assert info.status is not RunStatus.COMPLETED


async def wait_parked(worker: WorkflowWorker, run_id: str) -> None:
    """Until the run waits for a signal again and this worker has cached its journal."""

    async def parked() -> bool:
        info = await worker.client.get(run_id)
        return info.status is RunStatus.WAITING and worker.in_flight == 0

    await await_until(parked, what=f"run {run_id} parked")
