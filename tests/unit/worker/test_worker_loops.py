"""Background loops: restarts on store errors, fatal errors, and runs that lose the store."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pyrula.metrics import Metrics
from pyrula.workflows import (
    RunStatus,
    StoreUnavailable,
    WorkflowContext,
    WorkflowNotFound,
    WorkflowWorker,
    step,
    workflow,
)
from pyrula.workflows.clock import SYSTEM_CLOCK
from pyrula.workflows.worker.loops import (
    BACKOFF_MAX,
    BACKOFF_MIN,
    LIVENESS_FAILURE_S,
    LoopState,
    backoff_delays,
    failing_loop,
    run_loop,
)
from tests.conftest import await_until
from tests.unit.worker.worker_support import (
    Outage,
    Spy,
    capture,
    fast_options,
    logged,
    of_type,
    serving,
    start,
    stop,
)


@step(name="wloop_inc")
def wloop_inc(x: int) -> int:
    return x + 1


@workflow(name="wloop_steps")
async def wloop_steps(ctx: WorkflowContext, params: Any) -> Any:
    x = await wloop_inc(0)
    x = await wloop_inc(x)
    return x


@workflow(name="wloop_nap")
async def wloop_nap(ctx: WorkflowContext, params: Any) -> Any:
    await ctx.sleep(0.05)
    return "rested"


@pytest.fixture
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loops restart after 10 ms instead of 0.5 s; the restart logic itself is unchanged."""
    monkeypatch.setattr(
        "pyrula.workflows.worker.loops.backoff_delays", lambda *a, **k: lambda: 0.01
    )


def test_restart_delays_double_from_half_a_second_to_thirty_with_jitter() -> None:
    next_delay = backoff_delays()
    delays = [next_delay() for _ in range(12)]
    nominal = [min(BACKOFF_MAX, BACKOFF_MIN * 2**k) for k in range(12)]
    assert (BACKOFF_MIN, BACKOFF_MAX) == (0.5, 30.0)
    for delay, cap in zip(delays, nominal, strict=True):
        assert cap / 2 <= delay <= cap
    assert nominal[-1] == BACKOFF_MAX


@pytest.mark.usefixtures("quick_backoff")
async def test_a_store_outage_is_logged_once_restarted_counted_and_recovered(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    capture(caplog)
    outage = Outage(store, "claim")
    worker = WorkflowWorker(store=store, workflows=[wloop_steps], options=fast_options())
    async with serving(worker):
        outage.active = True
        run = await worker.client.submit(wloop_steps, {})
        await await_until(lambda: outage.failures >= 5, what="five failed claim ticks")
        assert len(logged(caplog, "loop_failed")) == 1
        assert worker.metrics.get("pyrula.workflows.loop.restarts", loop="claim") >= 5
        assert (await worker.client.get(run.run_id)).status is RunStatus.QUEUED

        outage.active = False
        assert await worker.client.result(run.run_id, timeout=10) == 2
        assert len(logged(caplog, "loop_recovered")) == 1

        restarts = worker.metrics.get("pyrula.workflows.loop.restarts")
        failures = outage.failures
        outage.active = True  # a second outage is logged again, once
        await await_until(lambda: outage.failures >= failures + 3, what="a second outage")
        assert len(logged(caplog, "loop_failed")) == 2
        assert worker.metrics.get("pyrula.workflows.loop.restarts") >= restarts + 3
        outage.active = False
    record = logged(caplog, "loop_failed")[0]
    assert record.loop == "claim"  # type: ignore[attr-defined]
    assert record.worker_id == worker.worker_id  # type: ignore[attr-defined]


@pytest.mark.usefixtures("quick_backoff")
async def test_the_timer_loop_survives_an_outage(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    capture(caplog)
    outage = Outage(store, "wake_due")
    outage.active = True
    worker = WorkflowWorker(store=store, workflows=[wloop_nap], options=fast_options())
    async with serving(worker):
        run = await worker.client.submit(wloop_nap, {})
        await await_until(lambda: outage.failures >= 3, what="failed timer ticks")
        outage.active = False
        assert await worker.client.result(run.run_id, timeout=10) == "rested"
    assert [r.loop for r in logged(caplog, "loop_failed")] == ["timer"]  # type: ignore[attr-defined]
    assert worker.metrics.get("pyrula.workflows.loop.restarts", loop="timer") >= 3


async def test_any_other_loop_error_stops_the_worker_and_is_raised_from_run(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    capture(caplog)

    class Boom(RuntimeError):
        pass

    outage = Outage(store, "reclaim", error=lambda: Boom("a bug in the orphan scan"))
    outage.active = True
    worker = WorkflowWorker(store=store, workflows=[wloop_steps], options=fast_options())
    task = asyncio.create_task(worker.run())
    with pytest.raises(Boom, match="a bug in the orphan scan"):
        await asyncio.wait_for(task, 30)
    assert worker.state == "stopped"
    assert [r.loop for r in logged(caplog, "loop_died")] == ["orphan"]  # type: ignore[attr-defined]
    assert worker.metrics.get("pyrula.workflows.loop.restarts") == 0


async def test_a_run_whose_attempt_loses_the_store_is_requeued_not_failed(store: Any) -> None:
    outage = Outage(store, "append")
    worker = WorkflowWorker(store=store, workflows=[wloop_steps], options=fast_options())
    outage.active = True
    outage.when = lambda *a, **k: outage.failures == 0  # only the first step boundary fails
    async with serving(worker):
        run = await worker.client.submit(wloop_steps, {})
        assert await worker.client.result(run.run_id, timeout=10) == 2
    events = await worker.client.events(run.run_id)
    assert [e["reason"] for e in of_type(events, "run:requeued")] == ["store_unavailable"]
    assert of_type(events, "run:error") == []
    info = await worker.client.get(run.run_id)
    assert info.status is RunStatus.COMPLETED and info.attempt == 2


async def test_a_run_that_cannot_read_its_journal_is_requeued(store: Any) -> None:
    """A resumed run whose journal read fails before the attempt begins goes back too."""
    outage = Outage(store, "read_events")
    worker = WorkflowWorker(
        store=store, workflows=[wloop_nap], options=fast_options(journal_cache_events=0)
    )
    outage.active = True
    outage.when = lambda *a, **k: outage.failures == 0
    task = await start(worker)
    try:
        run = await worker.client.submit(wloop_nap, {})
        assert await worker.client.result(run.run_id, timeout=10) == "rested"
    finally:
        await stop(worker, task)
    events = await worker.client.events(run.run_id)
    assert [e["reason"] for e in of_type(events, "run:requeued")] == ["store_unavailable"]


async def test_an_attempt_whose_run_the_store_lost_stands_down_and_the_scans_go_on(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # What a failover that lost a run does to the attempt running it: its next write
    # finds no such run. The attempt stands down (no requeue retried for ever, no store
    # outage reported that would hold the orphan scan back), and the worker carries on.
    capture(caplog)
    gone = Outage(store, "append", error=lambda: WorkflowNotFound("no run with that id"))
    worker = WorkflowWorker(store=store, workflows=[wloop_steps],
                            options=fast_options(orphan_scan_interval=0.05))
    async with serving(worker):
        gone.active = True
        lost = await worker.client.submit(wloop_steps, {})
        await await_until(lambda: gone.failures >= 1, what="a write that finds no run")
        gone.active = False
        await await_until(lambda: worker.in_flight == 0, what="the attempt stood down")
        assert worker.metrics.get("pyrula.workflows.attempts", outcome="lost") == 1
        assert worker.metrics.get("pyrula.workflows.runs.requeued",
                                  reason="store_unavailable") == 0
        # The run is still there here, its lock lapsing: the orphan scan takes it back.
        assert await worker.client.result(lost.run_id, timeout=10) == 2
    assert [r.getMessage() for r in caplog.records if "no such run" in r.getMessage()]


class LostReply:
    """The first claim that returns runs runs in the store, then its reply is lost."""

    def __init__(self, store: Any) -> None:
        self._real = store.claim
        self._armed = True
        store.claim = self._claim

    async def _claim(self, *args: Any, **kwargs: Any) -> Any:
        claimed = await self._real(*args, **kwargs)
        if self._armed and claimed:
            self._armed = False
            raise StoreUnavailable("injected: the claim's reply was lost")
        return claimed


@pytest.mark.usefixtures("quick_backoff")
async def test_the_runs_of_a_claim_whose_reply_was_lost_are_put_back_once(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Locked by this worker, which never learnt of them: put back before the next claim
    (not left to lapse and be reclaimed as orphans, charged a crash), counted and logged
    once, and not again by the claims after it."""
    capture(caplog)
    LostReply(store)
    spy = Spy(store, "claim", "requeue_unheld")
    worker = WorkflowWorker(store=store, workflows=[wloop_steps], options=fast_options())
    runs = [await worker.client.submit(wloop_steps, {}) for _ in range(2)]  # one claim
    async with serving(worker):
        for run in runs:
            assert await worker.client.result(run.run_id, timeout=10) == 2
        claims = spy.count("claim")
        await await_until(lambda: spy.count("claim") >= claims + 3, what="three more claims")
    assert spy.count("requeue_unheld") == 1
    assert worker.metrics.get("pyrula.workflows.runs.requeued", reason="store_unavailable") == 2
    records = logged(caplog, "run_requeued")
    assert sorted(r.run_id for r in records) == sorted(r.run_id for r in runs)  # type: ignore[attr-defined]
    assert records[0].getMessage() == (
        f"run {records[0].run_id} requeued: claimed by this worker when the store went "  # type: ignore[attr-defined]
        "away, but the claim's reply was lost")
    for run in runs:
        events = await worker.client.events(run.run_id)
        assert [e["reason"] for e in of_type(events, "run:requeued")] == ["store_unavailable"]
        assert (await worker.client.get(run.run_id)).attempt == 2


class Reconciling:
    """A loop with a long interval whose ticks fail while ``down``."""

    name = "reconcile"
    interval = 300.0

    def __init__(self) -> None:
        self.down = False
        self.ticks = 0

    async def tick(self, now: float) -> float | None:
        self.ticks += 1
        if self.down:
            raise StoreUnavailable("injected: the store is down")
        return None


@pytest.mark.usefixtures("quick_backoff")
async def test_a_long_interval_loop_fails_livez_from_the_window_after_a_failed_tick() -> None:
    """reconcile_interval=300: waiting 300 s for its next tick is not failing; a failed tick
    fails /livez from LIVENESS_FAILURE_S (2 minutes) after it until a tick completes. The
    monotonic clock is the test's, so no 2 minutes pass."""
    assert LIVENESS_FAILURE_S == 120.0
    clock = [1000.0]
    loop, state, stopping = Reconciling(), LoopState("reconcile"), asyncio.Event()
    task = asyncio.create_task(run_loop(state, loop, SYSTEM_CLOCK, stopping, Metrics(), {},
                                        monotonic=lambda: clock[0]))
    try:
        await await_until(lambda: loop.ticks == 1, what="the first tick")
        clock[0] += 299.0  # idle between ticks, far past the window
        assert failing_loop([state], clock[0]) is None
        loop.down = True
        stopping.set()  # wake it for a tick now rather than in 300 s; restart below
        await asyncio.wait_for(task, 5)
        stopping.clear()
        task = asyncio.create_task(run_loop(state, loop, SYSTEM_CLOCK, stopping, Metrics(),
                                            {}, monotonic=lambda: clock[0]))
        await await_until(lambda: state.failing_since == clock[0], what="a failed tick")
        failed_at = clock[0]
        clock[0] = failed_at + 119.0
        assert failing_loop([state], clock[0]) is None
        clock[0] = failed_at + 120.0
        assert failing_loop([state], clock[0]) == "reconcile"
        clock[0] = failed_at + 250.0
        assert failing_loop([state], clock[0]) == "reconcile"  # until a tick completes
        loop.down = False
        await await_until(lambda: state.failing_since is None, what="a completed tick")
        assert failing_loop([state], clock[0] + 299.0) is None
    finally:
        stopping.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
