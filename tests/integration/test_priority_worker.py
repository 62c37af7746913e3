"""A real worker works through a backlog highest priority first: runs submitted with
``priority=9`` after a backlog of priority-0 runs of the same owner all finish before any
of that backlog, on SQLite and on Valkey (one shard: there the order is exact)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import RunStatus, SQLiteStore, ValkeyStore, WorkflowClient, WorkflowWorker
from tests.conftest import await_until
from tests.generative.strategies import echo_registry
from tests.unit.worker.worker_support import fast_options, serving

NAME = "prio.backlog"


@pytest.fixture(params=["sqlite", pytest.param("valkey", marks=pytest.mark.valkey)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "sqlite":
        s: Any = SQLiteStore(str(tmp_path / "store.db"))
    else:
        url = request.getfixturevalue("valkey_url")
        s = ValkeyStore(url=url, namespace=f"t{uuid.uuid4().hex[:16]}", shard_count=1)
    try:
        yield s
    finally:
        s.close()


async def test_higher_priority_runs_of_a_backlog_finish_first(store: Any) -> None:
    client = WorkflowClient(store)
    backlog = [(await client.submit(NAME, {"i": i}, owner="t")).run_id for i in range(30)]
    urgent = [(await client.submit(NAME, {"u": i}, owner="t", priority=9)).run_id
              for i in range(5)]
    middle = (await client.submit(NAME, {"m": 0}, owner="t", priority=4)).run_id
    worker = WorkflowWorker(store=store, workflows=[NAME], registry=echo_registry([NAME]),
                            options=fast_options(max_concurrent_runs=1), cloud=False)

    async def all_done() -> bool:
        infos = [await client.get(r) for r in [*backlog, *urgent, middle]]
        return all(i.status is RunStatus.COMPLETED for i in infos)

    async with serving(worker):
        await await_until(all_done, timeout=60, interval=0.05, what="every run completed")

    started = {r: (await client.get(r)).started_at or 0.0 for r in [*backlog, *urgent, middle]}
    # (<=, not <: two runs may start within the clock's resolution)
    assert max(started[r] for r in urgent) <= started[middle], "a priority-9 run waited"
    assert started[middle] <= min(started[r] for r in backlog), "the priority-4 run waited"
    for runs in (urgent, backlog):  # FIFO within a priority
        assert [started[r] for r in runs] == sorted(started[r] for r in runs)
    assert (await client.get(urgent[0])).priority == 9
