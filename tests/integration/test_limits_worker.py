"""Real workers under a per-key concurrency limit: two workers, twenty runs of one key
with ``max=1``; each run's step records when it began and ended in a file, and no two of
those intervals overlap. The runs are submitted by a client without the workflow's
definition, so each worker computes the keys at the first claim (the hand-back path).
On the SQLite store the two workers share one file. A store that cannot enforce limits
(Valkey, for now) makes the worker refuse to start."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import (
    ConfigurationError,
    Limit,
    MemoryStore,
    RunStatus,
    SQLiteStore,
    ValkeyStore,
    WorkflowClient,
    WorkflowWorker,
)
from pyrula.workflows.context import WorkflowContext
from pyrula.workflows.definition import Registry, StepSpec, WorkflowSpec
from tests.conftest import await_until
from tests.unit.worker.worker_support import fast_options, serving

NAME = "limits.one_at_a_time"


def _registry(log: Path) -> Registry:
    """A registry of its own: the workflow (max 1 per account) and its step, which
    appends "start end" (monotonic seconds) to ``log`` around a short sleep."""

    async def record(account: str) -> None:
        began = time.monotonic()
        await asyncio.sleep(0.02)
        with log.open("a") as f:
            f.write(f"{began} {time.monotonic()}\n")

    step = StepSpec(name="limits.record", fn=record, is_async=True)

    async def flow(ctx: WorkflowContext, params: Any) -> None:
        from pyrula.workflows.definition import current_engine

        engine = current_engine.get()
        assert engine is not None
        await engine.call_step(step, (params["account"],), {})

    registry = Registry()
    registry.add_step(step)
    registry.add_workflow(WorkflowSpec(
        name=NAME, fn=flow, concurrency=Limit(key=lambda p: p["account"], max=1)))
    return registry


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    s: Any = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "s.db")
    try:
        yield s
    finally:
        s.close()


async def test_two_workers_never_overlap_runs_of_one_key(store: Any, tmp_path: Path) -> None:
    log = tmp_path / "steps.log"
    client = WorkflowClient(store)
    runs = [(await client.submit(NAME, {"account": "acme", "i": i})).run_id
            for i in range(20)]
    registry = _registry(log)
    # On SQLite the second worker opens the file itself, as another process would.
    stores = [store, SQLiteStore(store.path) if isinstance(store, SQLiteStore) else store]
    workers = [WorkflowWorker(store=s, workflows=[NAME], registry=registry,
                              options=fast_options(max_concurrent_runs=4), cloud=False)
               for s in stores]

    async def all_done() -> bool:
        infos = [await client.get(r) for r in runs]
        return all(i.status is RunStatus.COMPLETED for i in infos)

    try:
        async with serving(workers[0]), serving(workers[1]):
            await await_until(all_done, timeout=60, interval=0.05, what="every run completed")
    finally:
        if stores[1] is not store:
            stores[1].close()

    spans = sorted(tuple(map(float, line.split())) for line in log.read_text().splitlines())
    assert len(spans) >= 20
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert end <= start, f"two runs of one key overlapped: ended {end}, began {start}"


def test_a_store_without_limits_refuses_a_limited_workflow(
    tmp_path: Path, valkey_url: str, valkey_namespace: str
) -> None:
    store = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=1)
    try:
        worker = WorkflowWorker(store=store, workflows=[NAME],
                                registry=_registry(tmp_path / "log"),
                                options=fast_options(), cloud=False)
        with pytest.raises(ConfigurationError, match=f"{NAME}.*ValkeyStore|ValkeyStore.*{NAME}"):
            asyncio.run(worker.run())
    finally:
        store.close()
