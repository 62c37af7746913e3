"""The worker's schedule loop: one run per occurrence (two workers too), overlap skip and
allow, catchup_window, downtime, pause/resume and run_now. Time is a ManualClock; the
loop ticks every few milliseconds of real time, and tests wait on conditions."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest

from pyrula.metrics import Metrics
from pyrula.timestamps import iso_utc
from pyrula.workflows import (
    ValkeyStore,
    WorkflowClient,
    WorkflowContext,
    WorkflowWorker,
    workflow,
)
from pyrula.workflows.clock import ManualClock
from pyrula.workflows.records import RunInfo
from pyrula.workflows.schedules import Schedule
from pyrula.workflows.schedules.control import (
    apause_schedule,
    aresume_schedule,
    arun_schedule_now,
)
from pyrula.workflows.worker.schedules import BATCH, SKIPPED, ScheduleLoop
from tests.conftest import await_until
from tests.unit.worker.worker_support import capture, fast_options, logged, serving, unique

#: The manual clock's start: on the hour, so cron and interval grids line up with it.
T = 1_800_000_000.0
MINUTE = 60.0


@workflow(name="sched.echo")
async def echo(ctx: WorkflowContext, params: Any) -> Any:
    return params


@workflow(name="sched.gate")
async def gate(ctx: WorkflowContext, params: Any) -> str:
    await ctx.wait_for_signal("go")
    return "done"


def _worker(store: Any, clock: ManualClock, *workflows: Any) -> WorkflowWorker:
    return WorkflowWorker(
        store=store, workflows=list(workflows) or [echo],
        options=fast_options(schedule_interval=0.01, lock_ttl=60.0), clock=clock,
    )


def _every_minute(wf: Any, **kwargs: Any) -> Schedule:
    return Schedule.create(wf, every=MINUTE, params={"from": "schedule"},
                           schedule_id=unique("sched"), created_at=T, **kwargs)


async def _runs(store: Any, name: str) -> list[RunInfo]:
    return [r async for r in WorkflowClient(store).list_runs(name=name)]


async def _count(store: Any, name: str, n: int) -> list[RunInfo]:
    """Wait until exactly-or-more ``n`` runs of ``name`` exist; return them."""
    found: list[RunInfo] = []

    async def enough() -> bool:
        found[:] = await _runs(store, name)
        return len(found) >= n

    await await_until(enough, what=f"{n} runs of {name}")
    return found


async def _next_run_at(store: Any, schedule_id: str, at: float) -> None:
    async def moved() -> bool:
        sched = await store.aschedule_get(schedule_id)
        return sched is not None and sched.next_run_at.timestamp() == at

    await await_until(moved, what=f"next_run_at of {schedule_id} to reach {at}")


def _last_pass(worker: WorkflowWorker) -> float | None:
    state = worker._loops.get("schedule")
    return None if state is None else state.last_ok


async def _passes(*workers: WorkflowWorker, n: int = 3) -> None:
    """Let each worker's schedule loop complete ``n`` more passes."""
    for worker in workers:
        for _ in range(n):
            before = _last_pass(worker)
            await await_until(
                lambda w=worker, b=before: _last_pass(w) not in (None, b),
                what="a schedule pass",
            )


async def test_two_workers_fire_each_occurrence_once(store: Any) -> None:
    await _two_workers_three_occurrences(store, store)


async def test_two_workers_on_valkey_fire_each_occurrence_once(
    valkey_url: str, valkey_namespace: str
) -> None:
    # Two store objects, as two processes would have: the compare-and-set is the script's.
    a, b = (ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=2)
            for _ in range(2))
    try:
        await _two_workers_three_occurrences(a, b)
    finally:
        await a.aclose()
        await b.aclose()


async def _two_workers_three_occurrences(store_a: Any, store_b: Any) -> None:
    clock = ManualClock(start=T)
    sched = await store_a.aschedule_create(_every_minute(echo), now=T)
    w1, w2 = _worker(store_a, clock, echo), _worker(store_b, clock, echo)
    async with serving(w1), serving(w2):
        for k in (1, 2, 3):
            clock.advance(MINUTE)
            await _next_run_at(store_a, sched.schedule_id, T + (k + 1) * MINUTE)
            await _count(store_a, "sched.echo", k)
            await _passes(w1, w2)
        runs = await _runs(store_a, "sched.echo")
        client = WorkflowClient(store_a)
        results = [await client.result(r.run_id, timeout=10) for r in runs]
    assert len(runs) == 3
    assert sorted(r.idempotency_key or "" for r in runs) == [
        f"schedule:{sched.schedule_id}:{int(T + k * MINUTE)}" for k in (1, 2, 3)
    ]
    assert results == [{"from": "schedule"}] * 3
    fired = w1.metrics.get("pyrula.workflows.schedules.fired")
    assert fired + w2.metrics.get("pyrula.workflows.schedules.fired") == 3


async def test_overlap_skip_waits_for_the_previous_run(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    capture(caplog)
    clock = ManualClock(start=T)
    sched = store.schedule_create(_every_minute(gate), now=T)
    worker = _worker(store, clock, gate)
    client = WorkflowClient(store)
    async with serving(worker):
        clock.advance(MINUTE)
        (first,) = await _count(store, "sched.gate", 1)
        await await_until(lambda: _status(client, first.run_id, "waiting"))

        clock.advance(MINUTE)  # the run is still waiting: this occurrence is skipped
        await _next_run_at(store, sched.schedule_id, T + 3 * MINUTE)
        await _passes(worker)
        assert len(await _runs(store, "sched.gate")) == 1
        skipped = logged(caplog, "schedule_skipped_overlap")
        assert len(skipped) == 1
        assert first.run_id in skipped[0].getMessage()
        assert worker.metrics.get(SKIPPED) == 1
        assert worker.metrics.get(SKIPPED, reason="overlap") == 1

        await client.signal(first.run_id, "go")
        assert await client.result(first.run_id, timeout=10) == "done"
        clock.advance(MINUTE)  # finished: the next occurrence fires
        runs = await _count(store, "sched.gate", 2)
        for run in runs:
            if run.status != "completed":
                await client.signal(run.run_id, "go")
    assert len(logged(caplog, "schedule_skipped_overlap")) == 1


async def test_overlap_allow_fires_while_the_previous_run_is_unfinished(store: Any) -> None:
    clock = ManualClock(start=T)
    sched = store.schedule_create(_every_minute(gate, overlap="allow"), now=T)
    worker = _worker(store, clock, gate)
    client = WorkflowClient(store)
    async with serving(worker):
        clock.advance(MINUTE)
        (first,) = await _count(store, "sched.gate", 1)
        await await_until(lambda: _status(client, first.run_id, "waiting"))
        clock.advance(MINUTE)
        runs = await _count(store, "sched.gate", 2)
        await _next_run_at(store, sched.schedule_id, T + 3 * MINUTE)
        for run in runs:
            await client.signal(run.run_id, "go")
        for run in runs:
            assert await client.result(run.run_id, timeout=10) == "done"
    assert worker.metrics.get(SKIPPED) == 0


async def test_after_downtime_fires_once_and_moves_past_now(store: Any) -> None:
    clock = ManualClock(start=T)
    sched = store.schedule_create(_every_minute(echo), now=T)
    clock.advance(10 * MINUTE + 30)  # ten occurrences fell while no worker ran
    worker = _worker(store, clock, echo)
    async with serving(worker):
        await _next_run_at(store, sched.schedule_id, T + 11 * MINUTE)
        (run,) = await _count(store, "sched.echo", 1)
        await _passes(worker)
        assert len(await _runs(store, "sched.echo")) == 1
    assert run.idempotency_key == f"schedule:{sched.schedule_id}:{int(T + 10 * MINUTE)}"


async def test_the_fired_line_says_its_occurrence_in_iso(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    capture(caplog)
    clock = ManualClock(start=T)
    sched = store.schedule_create(_every_minute(echo), now=T)
    clock.advance(MINUTE + 1)
    async with serving(_worker(store, clock, echo)):
        await _count(store, "sched.echo", 1)
        await await_until(lambda: logged(caplog, "schedule_fired"), what="schedule_fired")
    (fired,) = logged(caplog, "schedule_fired")
    occurrence = iso_utc(T + MINUTE)  # 2027-01-15T08:01:00.000Z, not 1800000060
    assert fired.getMessage().endswith(f"for its occurrence at {occurrence}")
    assert getattr(fired, "occurrence", None) == occurrence
    assert sched.schedule_id in fired.getMessage()


async def test_catchup_window_fires_a_recent_miss(store: Any) -> None:
    clock = ManualClock(start=T)
    sched = store.schedule_create(
        Schedule.create(echo, every=10 * MINUTE, schedule_id=unique("catchup"), created_at=T,
                        catchup_window=timedelta(minutes=2)),
        now=T,
    )
    clock.advance(30 * MINUTE + 90)  # the latest occurrence (T + 30 min) is 90 s old
    worker = _worker(store, clock, echo)
    async with serving(worker):
        await _next_run_at(store, sched.schedule_id, T + 40 * MINUTE)
        (run,) = await _count(store, "sched.echo", 1)
    assert run.idempotency_key == f"schedule:{sched.schedule_id}:{int(T + 30 * MINUTE)}"


async def test_catchup_window_drops_an_older_miss(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    capture(caplog)
    clock = ManualClock(start=T)
    sched = store.schedule_create(
        Schedule.create(echo, every=10 * MINUTE, schedule_id=unique("catchup"), created_at=T,
                        catchup_window=timedelta(minutes=1)),
        now=T,
    )
    clock.advance(30 * MINUTE + 90)  # 90 s late, the window is 60 s
    worker = _worker(store, clock, echo)
    async with serving(worker):
        await _next_run_at(store, sched.schedule_id, T + 40 * MINUTE)
        await _passes(worker)
        assert await _runs(store, "sched.echo") == []
        assert worker.metrics.get(SKIPPED, reason="catchup_window") == 1
        assert len(logged(caplog, "schedule_skipped_catchup")) == 1

        clock.advance(10 * MINUTE - 60)  # 30 s after the next occurrence: it fires
        (run,) = await _count(store, "sched.echo", 1)
    assert run.idempotency_key == f"schedule:{sched.schedule_id}:{int(T + 40 * MINUTE)}"


async def test_a_paused_schedule_never_fires_and_resumes_after_now(store: Any) -> None:
    clock = ManualClock(start=T)
    sched = store.schedule_create(_every_minute(echo), now=T)
    await apause_schedule(store, sched.schedule_id)
    worker = _worker(store, clock, echo)
    async with serving(worker):
        clock.advance(5 * MINUTE + 30)
        await _passes(worker)
        assert await _runs(store, "sched.echo") == []

        await aresume_schedule(store, sched.schedule_id, now=clock.now())
        await _passes(worker)
        assert await _runs(store, "sched.echo") == []  # what fell while paused is gone
        clock.advance(MINUTE)
        (run,) = await _count(store, "sched.echo", 1)
    assert run.idempotency_key == f"schedule:{sched.schedule_id}:{int(T + 6 * MINUTE)}"


async def test_run_now_submits_at_once_and_counts_as_the_previous_run(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    capture(caplog)
    clock = ManualClock(start=T)
    sched = store.schedule_create(_every_minute(gate), now=T)
    worker = _worker(store, clock, gate)
    client = WorkflowClient(store)
    async with serving(worker):
        manual = await arun_schedule_now(store, sched.schedule_id, now=clock.now())
        await await_until(lambda: _status(client, manual.run_id, "waiting"))
        clock.advance(MINUTE)  # the manual run is unfinished: overlap=skip holds this one
        await _next_run_at(store, sched.schedule_id, T + 2 * MINUTE)
        assert [r.run_id for r in await _runs(store, "sched.gate")] == [manual.run_id]
        assert len(logged(caplog, "schedule_skipped_overlap")) == 1
        await client.signal(manual.run_id, "go")
        assert await client.result(manual.run_id, timeout=10) == "done"


async def test_schedules_of_names_the_worker_does_not_serve_stay_due(store: Any) -> None:
    clock = ManualClock(start=T)
    sched = store.schedule_create(_every_minute("sched.nobody_serves_this"), now=T)
    worker = _worker(store, clock, echo)
    async with serving(worker):
        clock.advance(MINUTE)
        await _passes(worker)
    got = await store.aschedule_get(sched.schedule_id)
    assert got is not None and got.next_run_at.timestamp() == T + MINUTE
    assert await _runs(store, "sched.nobody_serves_this") == []


async def test_a_broken_schedule_is_logged_and_the_others_fire(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="pyrula.workflows.worker")
    clock = ManualClock(start=T)
    good = store.schedule_create(_every_minute(echo), now=T)
    bad = store.schedule_create(_every_minute(echo), now=T - 30)  # due first
    worker = _worker(store, clock, echo)
    real_submit = store.submit

    async def submit(name: str, params: Any, **kwargs: Any) -> Any:
        if str(kwargs.get("idempotency_key", "")).startswith(f"schedule:{bad.schedule_id}:"):
            raise RuntimeError("injected")
        return await real_submit(name, params, **kwargs)

    store.submit = submit
    async with serving(worker):
        clock.advance(MINUTE)
        await _next_run_at(store, good.schedule_id, T + 2 * MINUTE)
        await await_until(lambda: logged(caplog, "schedule_failed"), what="schedule_failed")
    assert worker.state == "stopped"
    assert bad.schedule_id in logged(caplog, "schedule_failed")[0].getMessage()


async def _status(client: WorkflowClient, run_id: str, status: str) -> bool:
    return (await client.get(run_id)).status == status


async def test_a_full_batch_is_followed_by_another_pass_at_once(store: Any) -> None:
    clock = ManualClock(start=T)
    for _ in range(BATCH + 20):
        store.schedule_create(_every_minute(echo), now=T)
    loop = ScheduleLoop(store, ["sched.echo"], Metrics(), {}, interval=MINUTE)
    clock.advance(MINUTE)
    assert await loop.tick(clock.now()) == 0.0  # a full batch: more may be due
    assert await loop.tick(clock.now()) is None  # the rest
    assert len(await _runs(store, "sched.echo")) == BATCH + 20
    assert await loop.tick(clock.now()) is None  # nothing due


async def test_a_full_batch_of_broken_schedules_does_not_spin(store: Any) -> None:
    clock = ManualClock(start=T)
    for _ in range(BATCH):
        store.schedule_create(_every_minute(echo), now=T)
    loop = ScheduleLoop(store, ["sched.echo"], Metrics(), {}, interval=MINUTE)

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected")

    store.submit = broken
    clock.advance(MINUTE)
    assert await loop.tick(clock.now()) is None
