"""Orphan recovery: runs whose worker died are requeued by the scan, counted as crashes.

A "dead worker" is a claim made straight on the store with a tiny lock_ttl that nobody
renews or finishes: exactly what a worker that died mid-run leaves behind.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from pyrula.workflows import (
    RunFailed,
    RunStatus,
    WorkflowClient,
    WorkflowContext,
    WorkflowWorker,
    step,
    workflow,
)
from pyrula.workflows.records import PoisonPolicy, SuspectsAt
from tests.conftest import await_until
from tests.unit.worker.worker_support import Spy, capture, fast_options, logged, of_type, serving

UNSERVED = "worphan_nobody_serves_this"


@step(name="worphan_work")
def worphan_work(x: int) -> int:
    return x * 10


@workflow(name="worphan_job")
async def worphan_job(ctx: WorkflowContext, params: Any) -> Any:
    return await worphan_work(params["x"])


async def die_holding(store: Any, name: str, *, now: float | None = None) -> str:
    """A worker claims the next run of ``name`` (a suspect, if only one waits) and dies: its
    lock lapses at once."""
    at = time.time() if now is None else now
    claimed = list(await store.claim("dead-worker", [name], limit=1, now=at, lock_ttl=0.01))
    if not claimed:
        suspect = await store.claim_suspect("dead-worker", [SuspectsAt(name)], now=at,
                                            lock_ttl=0.01)
        claimed = [] if suspect is None else [suspect]
    assert len(claimed) == 1
    return str(claimed[0].run_id)


def make_worker(store: Any, **options: Any) -> WorkflowWorker:
    return WorkflowWorker(
        store=store, workflows=[worphan_job],
        options=fast_options(orphan_scan_interval=0.05, **options),
    )


async def test_the_orphan_scan_recovers_a_dead_workers_run(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    capture(caplog)
    run = await WorkflowClient(store).submit(worphan_job, {"x": 4})
    await die_holding(store, "worphan_job")
    worker = make_worker(store)
    async with serving(worker):
        assert await worker.client.result(run.run_id, timeout=10) == 40
    events = await worker.client.events(run.run_id)
    assert [e["reason"] for e in of_type(events, "run:requeued")] == ["orphaned"]
    assert [e["worker"] for e in of_type(events, "run:started")] == [
        "dead-worker", worker.worker_id
    ]
    assert [r.run_id for r in logged(caplog, "run_reclaimed")] == [  # type: ignore[attr-defined]
        run.run_id
    ]
    assert worker.metrics.get("pyrula.workflows.runs.reclaimed") == 1


@pytest.mark.parametrize(("poison_max_retries", "quarantined"), [(1, True), (2, False)])
async def test_crashes_past_poison_max_retries_quarantine_the_run(
    store: Any, caplog: pytest.LogCaptureFixture, poison_max_retries: int, quarantined: bool
) -> None:
    capture(caplog)
    run = await WorkflowClient(store).submit(worphan_job, {"x": 1})
    # One earlier crash, recovered by some other worker's scan...
    await die_holding(store, "worphan_job")
    await store.reclaim(["worphan_job"], now=time.time() + 1, limit=10,
                        poison=PoisonPolicy(max_retries=100))
    # ...and a second one, left for this worker's scan to find.
    await die_holding(store, "worphan_job")
    worker = make_worker(store, poison_max_retries=poison_max_retries)
    async with serving(worker):
        if quarantined:
            with pytest.raises(RunFailed) as failed:
                await worker.client.result(run.run_id, timeout=10)
        else:
            assert await worker.client.result(run.run_id, timeout=10) == 10
    events = await worker.client.events(run.run_id)
    if quarantined:
        error = failed.value.error
        assert (error["code"], error["error_type"]) == ("max_retries", "WorkerCrashed")
        assert error["detail"]["cause"] == "worker_crash"
        assert error["detail"]["worker"] == "dead-worker"
        assert [e["code"] for e in of_type(events, "run:error")] == ["max_retries"]
        assert len(logged(caplog, "run_quarantined")) == 1
        assert len(of_type(events, "run:started")) == 2  # never started again
    else:
        assert [e["reason"] for e in of_type(events, "run:requeued")] == ["orphaned"] * 2
        assert logged(caplog, "run_quarantined") == []


async def test_a_crash_older_than_poison_retry_ttl_no_longer_counts(store: Any) -> None:
    run = await WorkflowClient(store).submit(worphan_job, {"x": 2})
    long_ago = time.time() - 100
    await die_holding(store, "worphan_job", now=long_ago)
    await store.reclaim(["worphan_job"], now=long_ago + 1, limit=10,
                        poison=PoisonPolicy(max_retries=100))
    await die_holding(store, "worphan_job")
    # With the default TTL (an hour) these two crashes would quarantine the run.
    worker = make_worker(store, poison_max_retries=1, poison_retry_ttl_s=30.0)
    async with serving(worker):
        assert await worker.client.result(run.run_id, timeout=10) == 20


async def test_recover_pending_runs_requeues_orphans_of_a_name_no_worker_serves(
    store: Any,
) -> None:
    spy = Spy(store, "reclaim")
    client = WorkflowClient(store)
    stranded = await client.submit(UNSERVED, {})
    await die_holding(store, UNSERVED)
    worker = make_worker(store)
    async with serving(worker):
        await await_until(lambda: spy.count("reclaim") >= 3, what="a few orphan scans")
        assert (await client.get(stranded.run_id)).status is RunStatus.RUNNING
        assert {tuple(args[0]) for args, _, _ in spy.of("reclaim")} == {("worphan_job",)}
    assert store.recover_pending_runs(UNSERVED) == 1
    info = await client.get(stranded.run_id)
    assert info.status is RunStatus.QUEUED
    events = await client.events(stranded.run_id)
    assert [e["reason"] for e in of_type(events, "run:requeued")] == ["orphaned"]
    assert store.recover_pending_runs(UNSERVED) == 0


# --- after an outage --------------------------------------------------------------------------


class _Store:
    """What the orphan loop asks of a store, counting its reclaims."""

    def __init__(self) -> None:
        self.reclaims = 0

    async def register_worker(self, *args: object, **kwargs: object) -> None:
        return None

    async def stranded(self, *, now: float) -> list[str]:
        return []

    async def reclaim(self, *args: object, **kwargs: object) -> list[object]:
        self.reclaims += 1
        return []


class _Runtime:
    """A worker runtime whose last failed store call was at ``failed_at`` (monotonic)."""

    def __init__(self) -> None:
        self.failed_at = float("-inf")

    def store_failed_within(self, seconds: float) -> bool:
        return time.monotonic() - self.failed_at < seconds

    def last_store_failure(self) -> float:
        return self.failed_at


#: The lock_ttl of the loops below (seconds).
LOCK_TTL = 0.4


def _orphan_loop(store: _Store, runtime: _Runtime) -> Any:
    """An orphan loop over ``store`` and ``runtime``, scanning every 50 ms."""
    from pyrula.config.worker import WorkerOptions
    from pyrula.metrics import Metrics
    from pyrula.workflows.worker.orphans import OrphanLoop, Serving

    options = WorkerOptions(lock_ttl=LOCK_TTL, orphan_scan_interval=0.05)
    return OrphanLoop(Serving(store, "w1", ["wf"], options, {}),  # type: ignore[arg-type]
                      PoisonPolicy(max_retries=3), runtime, Metrics())  # type: ignore[arg-type]


async def test_after_an_outage_the_scan_waits_a_lock_ttl_of_the_store_answering() -> None:
    # Its own last failure may be older than the outage's end (its calls backed off): the
    # others get one lock_ttl from when the store answers this loop again to renew or put
    # back their runs, before a reclaim would charge each one a crash.
    store, runtime = _Store(), _Runtime()
    loop = _orphan_loop(store, runtime)
    await loop.tick(time.time())
    assert store.reclaims == 1  # no outage seen: it scans
    runtime.failed_at = time.monotonic() - 0.39  # failed a while ago, within the lock_ttl
    await loop.tick(time.time())
    assert store.reclaims == 1
    # Past the lock_ttl since that failure, but the store has only just answered this loop.
    deadline = time.monotonic() + 0.02
    while time.monotonic() < deadline or runtime.store_failed_within(LOCK_TTL):
        await loop.tick(time.time())
    answering = time.monotonic()
    while time.monotonic() - answering < 0.3:
        await loop.tick(time.time())
        assert store.reclaims == 1, "scanned before the store had answered a lock_ttl"
        await asyncio.sleep(0.01)
    await _until_scanned(loop, store, 2)


async def _until_scanned(loop: Any, store: _Store, count: int) -> None:
    deadline = time.monotonic() + 5
    while store.reclaims < count:
        assert time.monotonic() < deadline, "never scanned again"
        await loop.tick(time.time())
        await asyncio.sleep(0.01)


async def test_an_outage_the_loop_slept_through_still_gives_the_others_a_lock_ttl() -> None:
    # Its calls backed off through the outage: the first tick after it is the first to find
    # the store answering, its last failure already more than a lock_ttl old.
    store, runtime = _Store(), _Runtime()
    loop = _orphan_loop(store, runtime)
    await loop.tick(time.time())
    assert store.reclaims == 1
    runtime.failed_at = time.monotonic() - 1.0  # failed while it slept, long enough ago
    answering = time.monotonic()
    while time.monotonic() - answering < 0.3:
        await loop.tick(time.time())
        assert store.reclaims == 1, "scanned as soon as the store answered after an outage"
        await asyncio.sleep(0.01)
    await _until_scanned(loop, store, 2)

