"""Real workers under per-key limits, on every store that enforces them: memory, SQLite
(two workers sharing one file), Valkey standalone and a real Valkey cluster (two workers,
each with its own store object, as two processes would have).

- concurrency: twenty runs of one key with ``max=1``; each run's step records when it
  began and ended in a file, and no two of those intervals overlap. The runs are submitted
  by a client without the workflow's definition, so each worker computes the keys at the
  first claim (the hand-back path).
- rate: runs of one key with ``per_second=R``, submitted with their keys by a client that
  has the definition; their steps start no faster than R a second.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import (
    ConfigurationError,
    Limit,
    MemoryStore,
    Rate,
    RunStatus,
    SQLiteStore,
    ValkeyStore,
    WorkflowClient,
    WorkflowWorker,
)
from pyrula.workflows.context import WorkflowContext
from pyrula.workflows.definition import Registry, StepSpec, WorkflowSpec
from pyrula.workflows.stores.capabilities import Capabilities, capabilities_of
from pyrula.workflows.stores.layer import StoreLayer
from tests.conftest import await_until
from tests.unit.worker.worker_support import fast_options, serving

NAME = "limits.one_at_a_time"
RATED = "limits.rated"
#: The rate test's starts a second.
PER_SECOND = 4.0


def _registry(log: Path) -> Registry:
    """A registry of its own: the workflows (max 1 per account; PER_SECOND starts a
    second per account) and their step, which appends "start end" (wall-clock seconds,
    shared by every worker process) to ``log`` around a short sleep."""

    async def record(account: str) -> None:
        began = time.time()
        await asyncio.sleep(0.02)
        with log.open("a") as f:
            f.write(f"{began} {time.time()}\n")

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
    registry.add_workflow(WorkflowSpec(
        name=RATED, fn=flow, rate=Rate(key=lambda p: p["account"], per_second=PER_SECOND)))
    return registry


@pytest.fixture(params=[
    "memory", "sqlite",
    pytest.param("valkey", marks=pytest.mark.valkey),
    pytest.param("valkey-cluster", marks=[pytest.mark.valkey, pytest.mark.cluster]),
])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[Any]]:
    """Two store objects on one store, one per worker (the first also the client's):
    the memory store shared; SQLite, Valkey and a Valkey cluster opened twice."""
    namespace = f"t{uuid.uuid4().hex[:16]}"
    if request.param == "memory":
        memory = MemoryStore()
        opened: list[Any] = [memory, memory]
    elif request.param == "sqlite":
        opened = [SQLiteStore(tmp_path / "s.db"), SQLiteStore(tmp_path / "s.db")]
    else:
        fixture = "valkey_server" if request.param == "valkey" else "valkey_cluster"
        url = request.getfixturevalue(fixture).url
        # The default shard count standalone: runs submitted without keys before a
        # worker recorded the name as limited land on shards other than its home.
        shards = 64 if request.param == "valkey" else 4
        opened = [ValkeyStore(url=url, namespace=namespace, shard_count=shards)
                  for _ in range(2)]
    try:
        yield opened
    finally:
        for s in {id(s): s for s in opened}.values():
            s.close()


def _workers(stores: list[Any], names: list[str], log: Path) -> list[WorkflowWorker]:
    registry = _registry(log)
    return [WorkflowWorker(store=s, workflows=names, registry=registry,
                           options=fast_options(max_concurrent_runs=4), cloud=False)
            for s in stores]


def _spans(log: Path) -> list[tuple[float, float]]:
    return sorted((float(a), float(b)) for a, b in
                  (line.split() for line in log.read_text().splitlines()))


async def _serve_until_done(workers: list[WorkflowWorker], client: WorkflowClient,
                            runs: list[str]) -> None:
    async def all_done() -> bool:
        infos = [await client.get(r) for r in runs]
        return all(i.status is RunStatus.COMPLETED for i in infos)

    async with serving(workers[0]), serving(workers[1]):
        await await_until(all_done, timeout=60, interval=0.05, what="every run completed")


async def test_two_workers_never_overlap_runs_of_one_key(
    stores: list[Any], tmp_path: Path
) -> None:
    log = tmp_path / "steps.log"
    client = WorkflowClient(stores[0])  # without the definition: no keys at submit
    runs = [(await client.submit(NAME, {"account": "acme", "i": i})).run_id
            for i in range(20)]
    await _serve_until_done(_workers(stores, [NAME], log), client, runs)
    spans = _spans(log)
    assert len(spans) >= 20
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert end <= start, f"two runs of one key overlapped: ended {end}, began {start}"


async def test_two_workers_hold_a_rate_per_key(
    stores: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten runs of one key, PER_SECOND starts a second: the bucket starts with one start
    and holds at most a second's, so with a backlog the n-th start comes at least
    (n - 1) / PER_SECOND seconds after the first, and no second holds more than
    PER_SECOND + 1 starts (what the bucket held when the second began, and its refill)."""
    log = tmp_path / "steps.log"
    # The client has the definition: it computes the keys at submit.
    monkeypatch.setattr("pyrula.workflows.client.REGISTRY", _registry(log))
    client = WorkflowClient(stores[0])
    runs = [(await client.submit(RATED, {"account": "acme", "i": i})).run_id
            for i in range(10)]
    await _serve_until_done(_workers(stores, [RATED], log), client, runs)
    starts = [start for start, _ in _spans(log)]
    assert len(starts) >= 10
    # A little slack for the time between a run's admission and its step's start.
    assert starts[-1] - starts[0] >= (len(starts) - 1) / PER_SECOND - 0.2, starts
    for t in starts:
        assert sum(1 for s in starts if t <= s < t + 1.0) <= PER_SECOND + 1, starts


class _WithoutLimits(StoreLayer):
    """A store that lacks the ability: the memory store with its limits hidden."""

    def capabilities(self) -> Capabilities:
        return replace(capabilities_of(self.inner), limits=None)


def test_a_store_without_limits_refuses_a_limited_workflow(tmp_path: Path) -> None:
    """A limit is never silently ignored: a worker serving a limited workflow on a store
    that cannot enforce it refuses to start, naming the workflow."""
    store = _WithoutLimits(MemoryStore())
    worker = WorkflowWorker(store=store, workflows=[NAME],
                            registry=_registry(tmp_path / "log"), options=fast_options(),
                            cloud=False)
    with pytest.raises(ConfigurationError, match=f"{NAME}.*cannot enforce"):
        asyncio.run(worker.run())
