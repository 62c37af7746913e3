"""Result waits on SQLite when the run ends in another process (another connection): the
waiters of one event loop are looked up together (EndWatch), not each on its own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import SQLiteStore
from pyrula.workflows.events import EventType, make_event
from pyrula.workflows.records import RunInfo, RunStatus
from pyrula.workflows.stores.sqlite.reads import Reads
from pyrula.workflows.stores.waiters import EndWatch, ResultWaiters

T = 1_800_000_000.0


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "w.db")


@pytest.fixture
def stores(path: str) -> Iterator[tuple[SQLiteStore, SQLiteStore]]:
    """Two store objects on one file: what the waiting process and the working one see."""
    waiting, working = SQLiteStore(path), SQLiteStore(path)
    try:
        yield waiting, working
    finally:
        waiting.close()
        working.close()


def _count(target: object, name: str, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = getattr(target, name)

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return await real(*args, **kwargs)

    monkeypatch.setattr(target, name, counted)
    return calls


async def watched(watch: EndWatch, runs: int, *, backed_off_past: float = 0.0) -> None:
    """Poll until this loop's end watch looks for ``runs`` runs (every waiter has made its
    own first check and waits) and its round has backed off past ``backed_off_past``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while True:
        state = watch._loops.get(loop)
        if state is not None and len(state.runs) >= runs and state.delay > backed_off_past:
            return
        assert loop.time() < deadline, f"the end watch never watched {runs} runs"
        await asyncio.sleep(0.001)  # a poll interval, not a synchronisation


async def _finish_all(store: SQLiteStore, count: int) -> None:
    done = 0
    while done < count:
        for run in await store.claim("w", ["wf"], limit=10, now=T, lock_ttl=60):
            await store.finish(run.run_id, run.token,
                               [make_event(EventType.RUN_COMPLETED, T, result=run.params)],
                               now=T, status="completed", result=run.params)
            done += 1
        await asyncio.sleep(0.002)


async def test_waiters_on_runs_ended_elsewhere_share_their_lookups(
    stores: tuple[SQLiteStore, SQLiteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    waiting, working = stores
    ids = [(await waiting.submit("wf", i, now=T))[0].run_id for i in range(40)]
    lookups = _count(waiting._reads.ends, "_ended", monkeypatch)
    reads = _count(waiting, "get_run", monkeypatch)

    waits = asyncio.gather(*(waiting.wait_result(run_id, timeout=30) for run_id in ids))
    await watched(waiting._reads.ends, len(ids))
    await _finish_all(working, 40)
    infos = await waits

    assert [i.result for i in infos] == list(range(40))
    assert all(i.status == RunStatus.COMPLETED for i in infos)
    assert reads[0] <= 40 + 5  # each waiter's first look; the end came with the lookup
    assert 1 <= lookups[0] < 40, lookups  # ... which covered many waiters at a time


async def test_a_run_that_never_ends_is_only_looked_up_ever_less_often(
    stores: tuple[SQLiteStore, SQLiteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    waiting, _ = stores
    run_id = (await waiting.submit("wf", 1, now=T))[0].run_id
    lookups = _count(waiting._reads.ends, "_ended", monkeypatch)
    reads = _count(waiting, "get_run", monkeypatch)

    with pytest.raises(TimeoutError):
        await waiting.wait_result(run_id, timeout=1.5)

    # 5 ms doubling to RESULT_POLL_MAX (50 ms): about 33 lookups in 1.5 s, not one per
    # 5 ms (300); and the waiter's own checks: its first and one more after a second.
    cap = Reads.RESULT_POLL_MAX
    assert 3 <= lookups[0] <= 1.5 / cap + 8, lookups
    assert reads[0] <= 3, reads


def test_a_sync_waiter_looks_again_from_5_ms_doubling_to_the_cap(
    stores: tuple[SQLiteStore, SQLiteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script's ``result()`` sees a run another process ended at most RESULT_POLL_MAX
    late (one that ends soon after the wait began: within about twice its time)."""
    waiting, _ = stores
    run_id = asyncio.run(waiting.submit("wf", 1, now=T))[0].run_id
    slept: list[float] = []
    monkeypatch.setattr(waiting._reads._wakeups, "sleep",
                        lambda seen, seconds: slept.append(seconds))  # no real sleep
    with pytest.raises(TimeoutError):
        waiting._reads._wait_on_this_thread(run_id, 0.2)
    assert slept[:5] == [0.005, 0.01, 0.02, 0.04, Reads.RESULT_POLL_MAX]
    assert max(slept) == Reads.RESULT_POLL_MAX <= 0.05


async def test_an_end_elsewhere_wakes_every_waiter_of_that_run(
    stores: tuple[SQLiteStore, SQLiteStore],
) -> None:
    waiting, working = stores
    run_id = (await waiting.submit("wf", {"x": 1}, now=T))[0].run_id
    waits = asyncio.gather(*(waiting.wait_result(run_id, timeout=30) for _ in range(3)))
    await watched(waiting._reads.ends, 1)
    await _finish_all(working, 1)
    infos = await waits
    assert [i.result for i in infos] == [{"x": 1}] * 3
    infos[0].result["x"] = 2  # each waiter got a copy of its own
    assert infos[1].result == {"x": 1}


async def test_a_new_waiter_cuts_a_backed_off_round_short() -> None:
    ended: dict[str, RunInfo] = {}
    rounds: list[float] = []

    async def lookup(run_ids: list[str]) -> dict[str, RunInfo]:
        rounds.append(time.monotonic())
        return {r: ended[r] for r in run_ids if r in ended}

    waiters = ResultWaiters()
    watch = EndWatch(waiters, lookup, max_interval=30.0)

    async def wait(run_id: str) -> None:
        with watch.watching(run_id):
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            waiters._waiting.setdefault(run_id, []).append(fut)
            await fut

    first = asyncio.create_task(wait("a"))
    await watched(watch, 1, backed_off_past=0.1)  # rounds of 5, 10, 20, ... ms
    assert 4 <= len(rounds) <= 8
    ended["b"] = RunInfo(run_id="b", name="wf", status=RunStatus.COMPLETED, attempt=1,
                         params=None, owner=None, created_at=T, updated_at=T, started_at=T,
                         finished_at=T, result=None, error=None, wake_at=None,
                         waiting_for=(), interrupt=None, idempotency_key=None,
                         start_id="b", successor_id=None)
    started = time.monotonic()
    await asyncio.wait_for(wait("b"), 5)
    assert time.monotonic() - started < 1.0  # not the 30 s the round had backed off to
    first.cancel()
