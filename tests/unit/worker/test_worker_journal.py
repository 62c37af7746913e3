"""Journal durability (one append per step, or write-behind) and the journal cache."""

from __future__ import annotations

import asyncio
import threading
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


async def run_chain(store: Any, **options: Any) -> tuple[list[tuple[str, list[Any]]], list[Any]]:
    """Run wjournal_chain: its writes in order (append or finish, with their events) and
    its journal."""
    spy = Spy(store, "append", "finish")
    worker = WorkflowWorker(
        store=store, workflows=[wjournal_chain], options=fast_options(**options)
    )
    async with serving(worker):
        run = await worker.client.submit(wjournal_chain, {})
        assert await worker.client.result(run.run_id, timeout=10) == 2**STEPS
    writes = [(method, list(args[2])) for method, args, _, _ in spy.calls
              if args and args[0] == run.run_id]
    return writes, await worker.client.events(run.run_id)


def appends(writes: list[tuple[str, list[Any]]]) -> int:
    return sum(1 for method, _ in writes if method == "append")


async def test_step_boundary_durability_writes_each_step_before_the_next_starts(
    store: Any,
) -> None:
    writes, events = await run_chain(store)
    kinds = [[e["type"] for e in batch] for _, batch in writes]
    # One write per step: each carries its step's start and completion, so the next step's
    # start (and the step itself) comes only after it; the last step goes with the end.
    assert [method for method, _ in writes] == ["append"] * (STEPS - 1) + ["finish"]
    assert kinds[:-1] == [["step:started", "step:completed"]] * (STEPS - 1)
    assert kinds[-1] == ["step:started", "step:completed", "run:completed"]
    assert [e["type"] for e in events].count("step:completed") == STEPS


async def test_write_behind_batches_and_keeps_the_same_journal(store: Any) -> None:
    durable_writes, durable = await run_chain(store)
    whole_run_writes, whole_run = await run_chain(store, step_boundary_durability=False)
    buffered_writes, buffered = await run_chain(
        store, step_boundary_durability=False, event_buffer_size=4
    )
    assert appends(durable_writes) == STEPS - 1  # the last step is written with the end
    assert appends(whole_run_writes) == 0  # everything goes with the terminal write
    # 2 events a step: the buffer reaches 4 after every second step.
    assert appends(buffered_writes) == STEPS // 2
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


_RELEASE = threading.Event()


@step(name="wjournal_quick")
def wjournal_quick(x: int) -> int:
    return x + 1


@step(name="wjournal_held")
def wjournal_held(x: int) -> int:
    assert _RELEASE.wait(10), "the test never released the held step"
    return x + 2


@workflow(name="wjournal_siblings")
async def wjournal_siblings(ctx: WorkflowContext, params: Any) -> Any:
    return list(await asyncio.gather(wjournal_quick(1), wjournal_held(1)))


async def test_a_step_done_beside_a_running_sibling_is_durable_at_once(store: Any) -> None:
    """Its completion is written while the sibling still runs, not with the sibling's."""
    _RELEASE.clear()
    worker = WorkflowWorker(store=store, workflows=[wjournal_siblings], options=fast_options())
    async with serving(worker):
        run = await worker.client.submit(wjournal_siblings, {})

        async def quick_recorded() -> bool:
            events = await worker.client.events(run.run_id)
            return any(e["type"] == "step:completed" and e["step"] == "wjournal_quick"
                       for e in events)

        try:
            await await_until(quick_recorded, timeout=10, what="the quick step's completion")
            held = [e for e in await worker.client.events(run.run_id)
                    if e.get("step") == "wjournal_held"]
            assert "step:completed" not in [e["type"] for e in held]  # still running
        finally:
            _RELEASE.set()
        assert await worker.client.result(run.run_id, timeout=10) == [2, 3]
