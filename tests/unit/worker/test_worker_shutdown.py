"""Graceful shutdown in its five ordered steps, and the bounded sync-step pool."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from pyrula.workflows import (
    RunStatus,
    StoreUnavailable,
    WorkflowContext,
    WorkflowWorker,
    step,
    workflow,
)
from pyrula.workflows.worker.pool import default_pool_size
from tests.conftest import await_until
from tests.unit.worker.worker_support import (
    Outage,
    capture,
    claim_cut,
    fast_options,
    logged,
    of_type,
    start,
    stop,
    unique,
)

#: Gates a test opens to let its steps finish, by key (events for async steps, threading
#: events for sync ones). Each test uses its own keys.
ASYNC_GATES: dict[str, asyncio.Event] = {}
THREAD_GATES: dict[str, threading.Event] = {}
ENTERED: set[str] = set()


@step(name="wshut_async_hold")
async def wshut_async_hold(key: str) -> str:
    ENTERED.add(key)
    await ASYNC_GATES[key].wait()
    return key


@step(name="wshut_sync_hold")
def wshut_sync_hold(key: str) -> str:
    ENTERED.add(key)
    THREAD_GATES[key].wait(60)
    return key


@workflow(name="wshut_async")
async def wshut_async(ctx: WorkflowContext, params: Any) -> Any:
    return await wshut_async_hold(params["key"])


@workflow(name="wshut_sync")
async def wshut_sync(ctx: WorkflowContext, params: Any) -> Any:
    return await wshut_sync_hold(params["key"])


@workflow(name="wshut_await")
async def wshut_await(ctx: WorkflowContext, params: Any) -> Any:
    """Awaits a gate in its own code, not in a step: a replay check of it runs until the
    check's timeout."""
    ENTERED.add(params["key"])
    await ASYNC_GATES[params["key"]].wait()
    return params["key"]


@pytest.fixture
def thread_gates() -> Iterator[list[str]]:
    """Keys of sync gates opened at teardown, so no step thread outlives its test."""
    keys: list[str] = []
    try:
        yield keys
    finally:
        for key in keys:
            THREAD_GATES[key].set()


def async_gate(key: str) -> asyncio.Event:
    ASYNC_GATES[key] = asyncio.Event()
    return ASYNC_GATES[key]


def shutdown_steps(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()[len("shutdown: "):][:3] for r in caplog.records
        if r.getMessage().startswith("shutdown: ")
    ]


class ShardRelease:
    """Makes a store a sharded one (``ShardLeases``), holding no shard, and records the
    shard release."""

    def __init__(self, store: Any) -> None:
        self.released: list[str] = []
        self.pool_idle_at_release: bool | None = None
        store.shard_lease_tick = self.shard_lease_tick
        store.shards_held = self.shards_held
        store.release_shards = self.release_shards
        self.worker: WorkflowWorker | None = None

    async def shard_lease_tick(self, **_: Any) -> None:
        return None

    def shards_held(self, worker_id: str) -> dict[str, int]:
        return {}

    async def release_shards(self, worker_id: str) -> None:
        assert self.worker is not None and self.worker._pool is not None
        self.pool_idle_at_release = self.worker._pool.all_idle.is_set()
        self.released.append(worker_id)


async def test_the_five_steps_run_in_order_and_a_run_within_grace_completes(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    capture(caplog)
    sharded = ShardRelease(store)
    key = unique("grace")
    gate = async_gate(key)
    worker = WorkflowWorker(
        store=store, workflows=[wshut_async], options=fast_options(shutdown_grace=20.0)
    )
    sharded.worker = worker
    task = await start(worker)
    run = await worker.client.submit(wshut_async, {"key": key})
    await await_until(lambda: key in ENTERED, what="the run in its step")
    worker.stop()
    await await_until(lambda: "2/5" in shutdown_steps(caplog), what="the grace period")
    assert not task.done()
    gate.set()
    await asyncio.wait_for(task, 30)
    assert shutdown_steps(caplog) == ["1/5", "2/5", "3/5", "4/5", "5/5"]
    assert sharded.released == [worker.worker_id]
    assert sharded.pool_idle_at_release is True
    info = await worker.client.get(run.run_id)
    assert (info.status, info.result) == (RunStatus.COMPLETED, key)
    assert worker.state == "stopped"


async def test_an_idle_worker_also_logs_every_step(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    capture(caplog)
    worker = WorkflowWorker(store=store, workflows=[wshut_async], options=fast_options())
    task = await start(worker)
    await stop(worker, task)
    assert shutdown_steps(caplog) == ["1/5", "2/5", "3/5", "4/5", "5/5"]


async def test_runs_past_the_grace_are_requeued_with_reason_shutdown(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    capture(caplog)
    keys = [unique("late") + f"-{i}" for i in range(3)]
    for key in keys:
        async_gate(key)
    worker = WorkflowWorker(
        store=store, workflows=[wshut_async],
        options=fast_options(shutdown_grace=0.1, cancel_timeout=5.0),
    )
    task = await start(worker)
    runs = [await worker.client.submit(wshut_async, {"key": k}) for k in keys]
    await await_until(lambda: all(k in ENTERED for k in keys), what="every run in its step")
    await stop(worker, task)
    assert worker.in_flight == 0
    for run in runs:
        info = await worker.client.get(run.run_id)
        assert info.status is RunStatus.QUEUED
        events = await worker.client.events(run.run_id)
        assert [e["reason"] for e in of_type(events, "run:requeued")] == ["shutdown"]
    assert logged(caplog, "worker_thread_calls_still_running") == []

    # The next worker picks them up and finishes them.
    for key in keys:
        ASYNC_GATES[key].set()
    successor = WorkflowWorker(store=store, workflows=[wshut_async], options=fast_options())
    task = await start(successor)
    try:
        for run, key in zip(runs, keys, strict=True):
            assert await successor.client.result(run.run_id, timeout=10) == key
    finally:
        await stop(successor, task)


async def test_a_run_claimed_but_not_begun_at_the_stand_down_is_requeued(store: Any) -> None:
    """A run whose attempt is still being prepared when the worker stands its runs down
    (here a replay check, up to a second, of a run another build ran last) is requeued with
    reason shutdown once prepared, not left running under a lock only orphan recovery,
    charging a crash, would take back."""
    key = unique("preparing")
    async_gate(key)
    options = fast_options(shutdown_grace=0.1, cancel_timeout=5.0)
    first = WorkflowWorker(store=store, workflows=[wshut_await], options=options,
                           build="build-a")
    task = await start(first)
    run = await first.client.submit(wshut_await, {"key": key})
    await await_until(lambda: key in ENTERED, what="the run in its code")
    await stop(first, task)

    second = WorkflowWorker(store=store, workflows=[wshut_await], options=options,
                            build="build-b")
    task = await start(second)
    await await_until(lambda: run.run_id in second.held_runs(), what="the second claim")
    await stop(second, task)
    ASYNC_GATES[key].set()

    assert (await second.client.get(run.run_id)).status is RunStatus.QUEUED
    events = await second.client.events(run.run_id)
    assert [e["reason"] for e in of_type(events, "run:requeued")] == ["shutdown", "shutdown"]


async def test_a_hung_sync_step_is_logged_and_run_still_returns(
    store: Any, caplog: pytest.LogCaptureFixture, thread_gates: list[str]
) -> None:
    capture(caplog)
    key = unique("hung")
    THREAD_GATES[key] = threading.Event()
    thread_gates.append(key)
    worker = WorkflowWorker(
        store=store, workflows=[wshut_sync],
        options=fast_options(shutdown_grace=0.1, cancel_timeout=0.2),
    )
    task = await start(worker)
    run = await worker.client.submit(wshut_sync, {"key": key})
    await await_until(lambda: key in ENTERED, what="the sync step running")
    await stop(worker, task, deadline=10.0)  # grace + 2 x cancel_timeout, with room
    assert len(logged(caplog, "worker_thread_calls_still_running")) == 1
    assert shutdown_steps(caplog) == ["1/5", "2/5", "3/5", "4/5", "5/5"]
    events = await worker.client.events(run.run_id)
    assert [e["reason"] for e in of_type(events, "run:requeued")] == ["shutdown"]
    assert (await worker.client.get(run.run_id)).status is RunStatus.QUEUED


async def test_the_pool_logs_saturation_once_when_every_thread_is_busy(
    store: Any, caplog: pytest.LogCaptureFixture, thread_gates: list[str]
) -> None:
    capture(caplog)
    size = default_pool_size()
    assert size == min(32, (os.cpu_count() or 1) + 4)
    key = unique("saturate")
    THREAD_GATES[key] = threading.Event()
    thread_gates.append(key)
    worker = WorkflowWorker(
        store=store, workflows=[wshut_sync], options=fast_options(max_concurrent_runs=size + 3)
    )
    task = await start(worker)
    try:
        assert worker._pool is not None and worker._pool.size == size
        runs = [await worker.client.submit(wshut_sync, {"key": key}) for _ in range(size + 3)]
        await await_until(lambda: worker.in_flight == size + 3, what="every run claimed")
        await await_until(lambda: worker._pool is not None and worker._pool.busy == size + 3,
                          what="every sync step submitted")
        assert len(logged(caplog, "user_code_threads_saturated")) == 1
        THREAD_GATES[key].set()
        for run in runs:
            assert await worker.client.result(run.run_id, timeout=10) == key
    finally:
        await stop(worker, task)
    assert len(logged(caplog, "user_code_threads_saturated")) == 1


class HeldReply:
    """Holds back the reply of the first claim that returns runs: the claim has run in
    the store (its runs are locked by the worker) while the worker still waits for it."""

    def __init__(self, store: Any) -> None:
        self.ran = asyncio.Event()
        self.reply = asyncio.Event()
        self._real = store.claim
        self._armed = True
        store.claim = self._claim

    async def _claim(self, *args: Any, **kwargs: Any) -> Any:
        claimed = await self._real(*args, **kwargs)
        if self._armed and claimed:
            self._armed = False
            self.ran.set()
            await self.reply.wait()
        return claimed


async def _claim_held_back(store: Any, name: str, **options: Any
                           ) -> tuple[str, HeldReply, WorkflowWorker, asyncio.Task[None], Any]:
    """A serving worker whose claim of a submitted run has run in the store, its reply
    held back: (the run's gate key, the hold, the worker, its task, the run)."""
    key = unique(name)
    async_gate(key).set()
    held = HeldReply(store)
    worker = WorkflowWorker(store=store, workflows=[wshut_async],
                            options=fast_options(**options))
    task = await start(worker)
    run = await worker.client.submit(wshut_async, {"key": key})
    await asyncio.wait_for(held.ran.wait(), 10)
    return key, held, worker, task, run


async def test_a_claim_in_flight_when_the_worker_stops_is_finished_and_its_runs_drained(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    capture(caplog)
    key, held, worker, task, run = await _claim_held_back(store, "inflight")
    worker.stop()
    await await_until(lambda: "1/5" in shutdown_steps(caplog), what="stop claiming")
    held.reply.set()
    await asyncio.wait_for(task, 30)
    # Cut in half, the claim would leave the run locked by a worker that never knew it.
    info = await worker.client.get(run.run_id)
    assert (info.status, info.result) == (RunStatus.COMPLETED, key)


async def test_a_claim_that_never_answers_is_cancelled_and_its_runs_put_back(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """It is let answer within the grace (its runs would be in flight), then cancelled."""
    capture(caplog)
    _, _, worker, task, run = await _claim_held_back(store, "unanswered", shutdown_grace=0.2)
    await stop(worker, task)
    info = await worker.client.get(run.run_id)
    assert info.status is RunStatus.QUEUED
    assert info.owner is None
    events = await worker.client.events(run.run_id)
    assert [e["reason"] for e in of_type(events, "run:requeued")] == ["store_unavailable"]
    assert worker.metrics.get("pyrula.workflows.runs.requeued", reason="store_unavailable") == 1


async def test_a_failed_put_back_of_an_unanswered_claim_is_logged_and_the_worker_stops(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The runs then lapse and are reclaimed as orphans: the stop goes on, and says why."""
    capture(caplog)
    _, _, worker, task, run = await _claim_held_back(store, "putback", shutdown_grace=0.2)
    Outage(store, "requeue_unheld").active = True
    await stop(worker, task)
    [record] = [r for r in caplog.records
                if r.getMessage() == "putting back the runs of an unanswered claim failed"]
    assert record.levelname == "WARNING"
    assert record.exc_info is not None and record.exc_info[0].__name__ == "StoreUnavailable"
    assert record.worker_id == worker.worker_id  # type: ignore[attr-defined]


class Hang:
    """From ``active`` on, some store methods never answer (until ``release()``, when they
    raise StoreUnavailable). ``stubborn`` ones also outlive a first cancellation, as a call
    whose clean-up waits on the same store would."""

    def __init__(self, store: Any, methods: list[str], stubborn: tuple[str, ...] = ()) -> None:
        self.active = False
        self.hung: list[str] = []
        self._released = threading.Event()  # threads too: the renewal thread calls renew
        for method in methods:
            setattr(store, method, self._wrap(method, getattr(store, method),
                                              method in stubborn))

    def _wrap(self, method: str, real: Any, stubborn: bool) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            if not self.active:
                return await real(*args, **kwargs)
            self.hung.append(method)
            try:
                await self._never()
            except asyncio.CancelledError:
                if not stubborn:
                    raise
                await self._never()
            raise StoreUnavailable(f"{method} gave up")

        return call

    async def _never(self) -> None:
        while not self._released.is_set():  # a fake call that never answers, not a sync
            await asyncio.sleep(0.01)

    def release(self) -> None:
        self._released.set()


async def test_a_drain_whose_store_calls_hang_ends_within_its_bound(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Every store call of the drain hangs: the claim in flight, its put-back, the stand-down
    write (which outlives its cancellation), the lock renewal, the unregistering. The drain
    still ends within shutdown_grace + 3 x cancel_timeout, with no wait of its own beside
    (a fixed 5 s wait for the claim would break the bound)."""
    capture(caplog)
    key = unique("hung-store")
    async_gate(key)
    grace, cancel = 0.3, 0.4
    hang = Hang(store, ["claim", "requeue", "requeue_unheld", "renew", "unregister_worker"],
                stubborn=("requeue",))
    worker = WorkflowWorker(
        store=store, workflows=[wshut_async],
        options=fast_options(shutdown_grace=grace, cancel_timeout=cancel, lock_ttl=0.6),
    )
    task = await start(worker)
    try:
        await worker.client.submit(wshut_async, {"key": key})
        await await_until(lambda: key in ENTERED, what="the run in its step")
        hang.active = True
        await await_until(lambda: {"claim", "renew"} <= set(hang.hung),
                          what="a claim and a renewal hung")
        began = time.monotonic()
        worker.stop()
        await asyncio.wait_for(asyncio.shield(task), 30)
        took = time.monotonic() - began
    finally:
        hang.release()
        ASYNC_GATES[key].set()
    assert took < grace + 3 * cancel + 1.0, took
    assert {"requeue", "requeue_unheld", "unregister_worker"} <= set(hang.hung)
    assert shutdown_steps(caplog) == ["1/5", "2/5", "3/5", "4/5", "5/5"]
    assert claim_cut(caplog)
    assert len(logged(caplog, "worker_store_calls_still_running")) == 1
