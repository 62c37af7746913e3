"""SQLiteStore's store thread: calls queued together share one transaction, each atomic
on its own, none reported before the commit; a lock held by another connection is waited
for off the event loop."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from pyrula.workflows import SQLiteStore, StaleToken, StoreUnavailable
from pyrula.workflows.events import EventType, make_event
from pyrula.workflows.records import ClaimedRun

T = 1_800_000_000.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "b.db")
    try:
        yield s
    finally:
        s.close()


def _commits(store: SQLiteStore) -> list[str]:
    """Every COMMIT the store's connection runs from here on."""
    seen: list[str] = []
    store._db.connection().set_trace_callback(
        lambda sql: seen.append(sql) if sql.strip().upper() == "COMMIT" else None
    )
    return seen


def _step(call: int) -> list[dict[str, object]]:
    return [make_event(EventType.STEP_COMPLETED, T, step="s", call=call, result=call)]


async def _running(store: SQLiteStore, count: int) -> list[ClaimedRun]:
    for i in range(count):
        await store.submit("wf", {"i": i}, now=T)
    claimed = await store.claim("w", ["wf"], limit=count, now=T, lock_ttl=60)
    assert len(claimed) == count
    return claimed


def _visible_elsewhere(path: str) -> int:
    """Events another connection (another process, say) can read right now."""
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM events").fetchone()[0])
    finally:
        conn.close()


async def test_calls_queued_together_share_one_commit(store: SQLiteStore) -> None:
    runs = await _running(store, 20)
    commits = _commits(store)

    results = await asyncio.gather(
        *(store.append(r.run_id, r.token, _step(1), now=T, lock_ttl=60) for r in runs)
    )

    assert [r.last_seq for r in results] == [3] * 20
    assert 1 <= len(commits) < 20
    for run in runs:
        assert [e["seq"] for e in await store.read_events(run.run_id)] == [1, 2, 3]


async def test_a_refused_call_leaves_the_others_of_its_batch_alone(store: SQLiteStore) -> None:
    a, b, c = await _running(store, 3)

    outcomes = await asyncio.gather(
        store.append(a.run_id, a.token, _step(1), now=T, lock_ttl=60),
        store.append(b.run_id, b.token + 1, _step(1), now=T, lock_ttl=60),  # stale
        store.finish(c.run_id, c.token, [make_event(EventType.RUN_COMPLETED, T, result=7)],
                     now=T, status="completed", result=7),
        return_exceptions=True,
    )

    assert not isinstance(outcomes[0], BaseException) and outcomes[0].last_seq == 3
    assert isinstance(outcomes[1], StaleToken)
    assert len(await store.read_events(a.run_id)) == 3
    assert len(await store.read_events(b.run_id)) == 2  # nothing of the stale write
    done = await store.get_run(c.run_id)
    assert done is not None and done.status == "completed" and done.result == 7


async def test_nothing_is_reported_before_it_is_committed(store: SQLiteStore) -> None:
    runs = await _running(store, 10)
    before = _visible_elsewhere(store.path)
    seen: list[int] = []

    async def append(run: ClaimedRun) -> None:
        await store.append(run.run_id, run.token, _step(1), now=T, lock_ttl=60)
        seen.append(_visible_elsewhere(store.path) - before)

    await asyncio.gather(*(append(r) for r in runs))

    # Each caller, when its call returned, found its write (and those before it) in the
    # file already, from another connection.
    assert min(seen) >= 1 and seen == sorted(seen) and seen[-1] == 10


async def test_a_failed_commit_fails_every_call_of_the_batch(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = await _running(store, 5)
    real_commit = store._db.commit

    def failing_commit(conn: sqlite3.Connection) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(store._db, "commit", failing_commit)
    outcomes = await asyncio.gather(
        *(store.append(r.run_id, r.token, _step(1), now=T, lock_ttl=60) for r in runs),
        return_exceptions=True,
    )
    monkeypatch.setattr(store._db, "commit", real_commit)

    assert all(isinstance(o, StoreUnavailable) for o in outcomes), outcomes
    for run in runs:  # rolled back, every one
        assert len(await store.read_events(run.run_id)) == 2
    appended = await store.append(runs[0].run_id, runs[0].token, _step(1), now=T, lock_ttl=60)
    assert appended.last_seq == 3  # and the store goes on


def _hold_write_lock(path: str, seconds: float, held: threading.Event) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        held.set()
        time.sleep(seconds)
        conn.execute("COMMIT")
    finally:
        conn.close()


async def test_a_lock_held_elsewhere_is_waited_for_off_the_event_loop(
    store: SQLiteStore,
) -> None:
    (run,) = await _running(store, 1)
    held = threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(store.path, 0.5, held))
    holder.start()
    try:
        assert held.wait(5)
        ticks = 0
        reads: list[asyncio.Future[object]] = []

        async def tick() -> None:
            # The rest of a worker: more store calls, made while the first one waits.
            nonlocal ticks
            while True:
                ticks += 1
                reads.append(asyncio.ensure_future(store.get_run(run.run_id)))
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        started = time.monotonic()
        appended = await store.append(run.run_id, run.token, _step(1), now=T, lock_ttl=60)
        waited = time.monotonic() - started
        ticker.cancel()
        await asyncio.gather(*reads)
    finally:
        holder.join()

    assert appended.last_seq == 3
    assert waited >= 0.3  # it did wait for the other connection's transaction ...
    assert ticks >= 15  # ... and the loop kept turning meanwhile


async def test_a_lock_held_past_busy_timeout_fails_the_batch_fast(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "t.db", busy_timeout=0.2)
    try:
        runs = await _running(store, 4)
        held = threading.Event()
        holder = threading.Thread(target=_hold_write_lock, args=(store.path, 1.5, held))
        holder.start()
        try:
            assert held.wait(5)
            started = time.monotonic()
            outcomes = await asyncio.gather(
                *(store.append(r.run_id, r.token, _step(1), now=T, lock_ttl=60) for r in runs),
                return_exceptions=True,
            )
            waited = time.monotonic() - started
        finally:
            holder.join()
        assert all(isinstance(o, StoreUnavailable) for o in outcomes), outcomes
        assert waited < 1.0  # one busy_timeout for the batch, not one per call
        assert (await store.append(runs[0].run_id, runs[0].token, _step(1), now=T,
                                   lock_ttl=60)).last_seq == 3
    finally:
        store.close()


async def test_a_call_cancelled_before_it_ran_is_skipped(store: SQLiteStore) -> None:
    (run,) = await _running(store, 1)
    release, occupied = threading.Event(), threading.Event()

    def occupy() -> None:
        occupied.set()
        release.wait()

    blocker = asyncio.ensure_future(store._calls.call(occupy))  # occupies the thread
    assert await asyncio.to_thread(occupied.wait, 10)
    append = asyncio.ensure_future(
        store.append(run.run_id, run.token, _step(1), now=T, lock_ttl=60)
    )
    for _ in range(5):  # loop turns (no time passes): the append queues behind the blocker
        await asyncio.sleep(0)
    append.cancel()
    release.set()
    await blocker
    with pytest.raises(asyncio.CancelledError):
        await append
    assert len(await store.read_events(run.run_id)) == 2


def _file_size(path: str) -> int:
    return Path(path).stat().st_size


async def test_the_wal_is_checkpointed_off_the_store_thread(store: SQLiteStore) -> None:
    # Far fewer pages than wal_autocheckpoint (1,000): only the Checkpointer's own thread
    # copies them into the database file, shortly after the commits.
    runs = await _running(store, 20)
    for _ in range(3):
        await asyncio.gather(
            *(store.append(r.run_id, r.token, _step(1), now=T, lock_ttl=60) for r in runs)
        )
    commits = _commits(store)
    size = _file_size(store.path)
    grown = False
    for _ in range(100):
        await asyncio.sleep(0.02)
        grown = _file_size(store.path) > size
        if grown:
            break
    assert grown, "the WAL was not checkpointed into the database file"
    assert commits == []  # nobody committed meanwhile: the checkpoint did it
    # The file grows as the Checkpointer copies pages: until its checkpoint ends, ours is
    # blocked (busy 1). It must end, and leave nothing that blocks a checkpoint.
    conn = sqlite3.connect(store.path)
    try:
        busy = 1
        for _ in range(250):
            busy = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[0]
            if busy == 0:
                break
            await asyncio.sleep(0.02)
        assert busy == 0
    finally:
        conn.close()


async def test_a_failing_checkpointer_hands_back_to_sqlites_own_checkpoint(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyrula.workflows.stores.sqlite.checkpoint import Checkpointer

    def autocheckpoint() -> int:
        return int(store._db.connection().execute("PRAGMA wal_autocheckpoint").fetchone()[0])

    runs = await _running(store, 2)
    await store.append(runs[0].run_id, runs[0].token, _step(1), now=T, lock_ttl=60)
    assert autocheckpoint() == 0  # the Checkpointer's thread checkpoints

    monkeypatch.setattr(Checkpointer, "failed", property(lambda self: True))
    await store.append(runs[1].run_id, runs[1].token, _step(1), now=T, lock_ttl=60)
    assert autocheckpoint() == 1000  # SQLite's default again


async def test_calls_run_on_the_loop_when_nothing_makes_them_wait(store: SQLiteStore) -> None:
    runs = await _running(store, 10)
    results = await asyncio.gather(
        *(store.append(r.run_id, r.token, _step(1), now=T, lock_ttl=60) for r in runs)
    )
    assert [r.last_seq for r in results] == [3] * 10
    assert store._calls.thread is None  # no call needed the store thread: it never started


async def test_many_calls_at_once_leave_the_loop_turns_in_between(store: SQLiteStore) -> None:
    turns = 0
    stop = False

    async def turn() -> None:
        nonlocal turns
        while not stop:
            turns += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(turn())
    await asyncio.gather(*(store.submit("wf", {"i": i}, now=T) for i in range(300)))
    stop = True
    await ticker
    # 300 submits run 32 at a time at most (and 2 ms at most) per turn of the loop.
    assert turns >= 300 // 32
    assert len(await store.list_runs(limit=1000)) == 300


async def test_with_synchronous_full_no_call_runs_on_the_loop(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "full.db", synchronous="FULL")  # a commit syncs
    try:
        await store.submit("wf", {}, now=T)
        assert store._calls.thread is not None
    finally:
        store.close()


async def test_a_store_nobody_closed_ends_its_thread_once_collected(tmp_path: Path) -> None:
    import gc
    import weakref

    path = tmp_path / "g.db"
    store = SQLiteStore(path)
    await store._calls.call(lambda: None)  # a call for the store thread: it starts
    assert store._calls.thread is not None
    thread = store._calls.thread._thread
    collected = weakref.ref(store)
    del store
    gc.collect()
    assert collected() is None
    thread.join(5)
    assert not thread.is_alive()
    # ... and its connection is closed, not left for the collector to find open.
    assert str(path) not in {f.path for f in psutil.Process().open_files()}


def test_a_checkpointer_ends_when_idle_and_stops_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyrula.workflows.stores.sqlite.checkpoint import Checkpointer

    path = str(tmp_path / "c.db")
    SQLiteStore(path).close()
    monkeypatch.setattr(Checkpointer, "IDLE_S", 0.05)
    idle = Checkpointer(path, "NORMAL", 0.01)
    idle.committed()
    first = idle._thread
    assert first is not None
    first.join(5)
    assert not first.is_alive() and idle._thread is None  # ended, idle
    idle.committed()  # the next commit starts it again
    assert idle._thread is not None and idle._thread is not first
    idle.stop()
    for _ in range(50):  # stop() right after a commit, whatever the thread was doing
        checkpointer = Checkpointer(path, "NORMAL", 0.001)
        checkpointer.committed()
        time.sleep(0.001)
        started = time.monotonic()
        checkpointer.stop()
        assert time.monotonic() - started < 2.0
