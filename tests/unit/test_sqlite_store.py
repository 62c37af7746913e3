"""SQLiteStore specifics: the schema version (an additive change upgrades an older file in
place, filling in what an added column can learn from it, and builds what rests on it; a
file from a newer pyrula is refused) and closing a store others still use."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import psutil
import pytest

from pyrula.workflows import ConfigurationError, SQLiteStore, SyncWorkflowClient
from pyrula.workflows.records import PoisonPolicy
from pyrula.workflows.schedules import Schedule
from pyrula.workflows.stores.capabilities import QueueStat
from pyrula.workflows.stores.sqlite.schema import SCHEMA_VERSION


def _version(path: Path) -> int:
    # Not ``with sqlite3.connect(...)``: that block ends the transaction, not the connection.
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0])
    finally:
        conn.close()


def _set_version(path: Path, version: int, *statements: str, drop: str | None = None) -> None:
    """Make the file what pyrula with schema ``version`` left behind: ``statements`` (and
    ``DROP TABLE drop``) take out what came later, and the version is set back."""
    conn = sqlite3.connect(path)
    try:
        if drop is not None:
            conn.execute(f"DROP TABLE {drop}")
        for statement in statements:
            conn.execute(statement)
        conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (version,))
        conn.commit()
    finally:
        conn.close()


def test_a_version_1_file_gains_the_schedules_table(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    SQLiteStore(path).close()
    _set_version(path, 1, drop="schedules")  # what pyrula with schema 1 left behind

    store = SQLiteStore(path)
    try:
        assert _version(path) == SCHEMA_VERSION == 9
        store.schedule_create(Schedule.create("wf", "0 * * * *", schedule_id="s"))
        assert [s.schedule_id for s in store.schedule_list()] == ["s"]
    finally:
        store.close()


async def test_a_version_2_file_gains_queued_at_from_what_it_recorded(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    store = SQLiteStore(path)
    try:
        fresh, _ = await store.submit("wf", {}, now=100.0)
        again, _ = await store.submit("wf", {}, now=101.0)
        claimed = await store.claim_run(again.run_id, "w", now=102.0, lock_ttl=30.0)
        assert claimed is not None
        await store.requeue(again.run_id, claimed.token, now=110.0, reason="shutdown")
        await store.signal(fresh.run_id, "note", None, now=120.0)
    finally:
        store.close()
    conn = sqlite3.connect(path)  # what pyrula with schema 2 left behind: no queued_at
    try:
        conn.execute("ALTER TABLE runs DROP COLUMN queued_at")
        conn.execute("UPDATE meta SET value='2' WHERE key='schema_version'")
        conn.commit()
    finally:
        conn.close()

    store = SQLiteStore(path)
    try:
        assert _version(path) == SCHEMA_VERSION
        # Never claimed: queued since it was created (the signal since does not count).
        # Requeued by the older pyrula: dated by its last write, the requeue.
        assert await store.queue_stats(["wf"]) == {"wf": QueueStat(2, 100.0)}
        await store.claim_run(fresh.run_id, "w", now=130.0, lock_ttl=30.0)
        assert await store.queue_stats(["wf"]) == {"wf": QueueStat(1, 110.0)}
    finally:
        store.close()


async def test_a_version_3_file_gains_suspect_seq_and_its_queued_runs_stay_ordinary(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v3.db"
    store = SQLiteStore(path)
    try:
        crashed, _ = await store.submit("wf", {}, now=100.0)
        await store.claim_run(crashed.run_id, "w", now=101.0, lock_ttl=30.0)
    finally:
        store.close()
    conn = sqlite3.connect(path)  # what pyrula with schema 3 left behind: no suspect_seq
    try:
        conn.execute("DROP INDEX runs_suspects")
        conn.execute("ALTER TABLE runs DROP COLUMN suspect_seq")
        conn.execute("UPDATE meta SET value='3' WHERE key='schema_version'")
        conn.commit()
    finally:
        conn.close()

    store = SQLiteStore(path)
    try:
        assert _version(path) == SCHEMA_VERSION
        # The run an older pyrula left running crashes now: a suspect, put aside.
        await store.reclaim(None, now=200.0, limit=10, poison=PoisonPolicy())
        passed = await store.claim("w", ["wf"], limit=10, now=201.0, lock_ttl=30.0)
        assert list(passed) == [] and passed.suspects
        again = await store.claim_suspect("w", passed.suspects, now=202.0, lock_ttl=30.0)
        assert again is not None and again.run_id == crashed.run_id and again.suspect
    finally:
        store.close()


async def test_a_version_4_file_gains_the_trigger_tables(tmp_path: Path) -> None:
    path = tmp_path / "v4.db"
    store = SQLiteStore(path)
    try:
        queued, _ = await store.submit("wf", {"x": 1}, now=100.0)
    finally:
        store.close()
    conn = sqlite3.connect(path)  # what pyrula with schema 4 left behind: no trigger tables
    try:
        for table in ("trigger_events", "trigger_subs", "trigger_pending"):
            conn.execute(f"DROP TABLE {table}")
        conn.execute("UPDATE meta SET value='4' WHERE key='schema_version'")
        conn.commit()
    finally:
        conn.close()

    store = SQLiteStore(path)
    try:
        assert _version(path) == SCHEMA_VERSION
        event_id, created = await store.emit("topic", {"n": 1}, now=200.0, key="k")
        assert created
        [run] = await store.take_batches("batch", "topic", max_size=1, max_wait=1.0,
                                         now=200.0, limit=5)
        info = await store.get_run(run.run_id)
        assert info is not None and info.params["events"][0]["id"] == event_id
        assert (await store.get_run(queued.run_id)) is not None  # the old run is kept
    finally:
        store.close()


async def test_a_version_5_file_gains_the_projection_tables(tmp_path: Path) -> None:
    from pyrula.workflows.stores.capabilities import ProjectionHead

    path = tmp_path / "v5.db"
    store = SQLiteStore(path)
    try:
        claimed = await store.claim_run((await store.submit("wf", {}, now=100.0))[0].run_id,
                                        "w", now=100.0, lock_ttl=30.0)
        assert claimed is not None
    finally:
        store.close()
    _set_version(path, 5, "DROP TABLE projection_heads", "DROP TABLE projection_states",
                 "DROP INDEX runs_ended")  # no projections

    store = SQLiteStore(path)
    try:
        assert _version(path) == SCHEMA_VERSION == 9
        head = ProjectionHead("p", 0, "fp", False, None, 0, 200.0)
        assert await store.save_projection(head, {"": [1]}, expected=0, reset=False)
        assert await store.projection_states("p", None) == {"": [1]}
        assert (await store.get_run(claimed.run_id)) is not None  # the old run is kept
    finally:
        store.close()


def test_a_file_from_a_newer_pyrula_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    SQLiteStore(path).close()
    _set_version(path, SCHEMA_VERSION + 1)
    with pytest.raises(ConfigurationError, match="schema version"):
        SQLiteStore(path)


def test_a_refused_file_is_not_left_open(tmp_path: Path) -> None:
    path = tmp_path / "newer.db"
    SQLiteStore(path).close()
    _set_version(path, SCHEMA_VERSION + 1)
    with pytest.raises(ConfigurationError, match="schema version"):
        SQLiteStore(path)
    assert str(path) not in {f.path for f in psutil.Process().open_files()}


async def test_closing_a_store_others_still_use_lets_their_calls_finish(tmp_path: Path) -> None:
    # A worker's lock-renewal thread closes the store when the worker stops, while another
    # worker (or the application) may still be using the same store object.
    store = SQLiteStore(tmp_path / "shared.db")
    try:
        handle, _ = await store.submit("wf", {}, now=1.0)

        async def reader() -> None:
            for _ in range(200):
                assert await store.get_run(handle.run_id) is not None

        async def closer() -> None:
            for _ in range(20):
                await store.aclose()
                await asyncio.sleep(0)

        await asyncio.gather(reader(), reader(), closer())
        assert await store.get_run(handle.run_id) is not None  # reopened on use
    finally:
        store.close()


def _claim_steps(store: SQLiteStore, queued: int, tmp: Path) -> int:
    """SQLite VM steps of one claim of 10 runs with ``queued`` runs of two owners queued."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    async def main() -> None:
        for i in range(queued):
            await store.submit("wf", {"i": i}, now=1.0 + i, owner=("a", "b")[i % 2])
        conn = store._db.connection()
        conn.set_progress_handler(count, 1)
        try:
            claimed = await store.claim("w", ["wf"], limit=10, now=1e6, lock_ttl=60)
        finally:
            conn.set_progress_handler(None, 1)
        # Deficit round robin over the two owners, FIFO within each.
        assert [r.params["i"] for r in claimed] == list(range(10))

    asyncio.run(main())
    return steps


def test_a_claim_does_not_read_every_queued_run(tmp_path: Path) -> None:
    # The claim finds each owner's oldest queued run by index seeks: its cost must not
    # grow with the backlog (it once scanned every queued run for every run it took).
    costs = []
    for queued in (50, 2000):
        store = SQLiteStore(tmp_path / f"backlog-{queued}.db")
        try:
            costs.append(_claim_steps(store, queued, tmp_path))
        finally:
            store.close()
    assert costs[1] < costs[0] * 1.5, costs


def test_create_false_refuses_a_missing_file_and_makes_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError) as refused:
        SQLiteStore("pyrula.db", create=False)
    assert str(refused.value).startswith(f"no store at {tmp_path / 'pyrula.db'}: ")
    assert list(tmp_path.iterdir()) == []  # no empty store left for a reader to find


def test_create_false_opens_the_store_a_worker_made(tmp_path: Path) -> None:
    made = SQLiteStore(tmp_path / "fleet.db")
    run_id = SyncWorkflowClient(made).submit("wf", {"n": 1}).run_id
    made.close()
    store = SQLiteStore(tmp_path / "fleet.db", create=False)
    try:
        assert SyncWorkflowClient(store).get(run_id).params == {"n": 1}
    finally:
        store.close()


async def test_a_version_6_file_gains_run_priorities(tmp_path: Path) -> None:
    """A schema-6 file (no runs.priority, the runs_queue index): its queued runs are
    priority 0 and still claimed in their order; a new run of a higher priority first."""
    path = tmp_path / "v6.db"
    store = SQLiteStore(path)
    try:
        old = [(await store.submit("wf", {}, now=100.0 + i, owner="o"))[0].run_id
               for i in range(2)]
    finally:
        store.close()
    _set_version(path, 6, "DROP INDEX runs_queue_p", "ALTER TABLE runs DROP COLUMN priority",
                 "CREATE INDEX runs_queue ON runs(name, owner, queue_seq) "
                 "WHERE status = 'queued'")

    store = SQLiteStore(path)
    try:
        assert _version(path) == SCHEMA_VERSION == 9
        high = (await store.submit("wf", {}, now=200.0, owner="o", priority=4))[0].run_id
        claimed = await store.claim("w", ["wf"], limit=3, now=300.0, lock_ttl=30.0)
        assert [c.run_id for c in claimed] == [high, *old]
        info = await store.get_run(old[0])
        assert info is not None and info.priority == 0
    finally:
        store.close()


async def test_a_version_7_file_gains_per_key_limits(tmp_path: Path) -> None:
    """A schema-7 file (no runs.limit_* columns, their indexes nor limit_buckets): its
    queued runs have no keys and are still claimed; a limited run waits in its key's line."""
    from pyrula.workflows.limits import LimitKeys, WorkflowLimits

    path = tmp_path / "v7.db"
    store = SQLiteStore(path)
    try:
        old = (await store.submit("wf", {}, now=100.0, owner="o"))[0].run_id
    finally:
        store.close()
    _set_version(path, 7, "DROP INDEX runs_held", "DROP INDEX runs_slots",
                 "DROP TABLE limit_buckets",
                 *(f"ALTER TABLE runs DROP COLUMN {column}"
                   for column in ("limit_conc", "limit_rate", "limit_line", "limit_seq")))

    store = SQLiteStore(path)
    try:
        assert _version(path) == SCHEMA_VERSION == 9
        store.use_limits({"wf": WorkflowLimits(max=1, per_second=10.0)})
        keys = LimitKeys(concurrency="k", rate="k")
        first = (await store.submit("wf", {}, now=200.0, owner="o", limit_keys=keys))[0].run_id
        second = (await store.submit("wf", {}, now=201.0, owner="o", limit_keys=keys))[0].run_id
        claimed = await store.claim("w", ["wf"], limit=3, now=300.0, lock_ttl=30.0)
        assert [c.run_id for c in claimed] == [old, first]
        assert claimed[1].limit_keys == keys and claimed[0].limit_keys is None
        assert await store.claim("w", ["wf"], limit=3, now=301.0, lock_ttl=30.0) == []
        from tests.conformance.support import complete

        await complete(store, first, claimed[1].token, now=302.0)
        [nxt] = await store.claim("w", ["wf"], limit=3, now=303.0, lock_ttl=30.0)
        assert nxt.run_id == second
    finally:
        store.close()


async def test_a_version_8_file_gains_the_nudge_mark(tmp_path: Path) -> None:
    """A schema-8 file (no runs.nudged): a run running when it is opened is not marked,
    and a nudge marks it from then on."""
    from pyrula.workflows.events import CHILD_SIGNAL

    path = tmp_path / "v8.db"
    store = SQLiteStore(path)
    try:
        run_id = (await store.submit("wf", {}, now=100.0))[0].run_id
        [claimed] = await store.claim("w", ["wf"], limit=1, now=101.0, lock_ttl=30.0)
    finally:
        store.close()
    _set_version(path, 8, "ALTER TABLE runs DROP COLUMN nudged")

    store = SQLiteStore(path)
    try:
        assert _version(path) == SCHEMA_VERSION == 9
        known = int(claimed.journal[-1]["seq"])
        await store.nudge(run_id, now=102.0)
        refused = await store.park(run_id, claimed.token, [], now=103.0, wake_at=None,
                                   signals=[CHILD_SIGNAL], known_seq=known)
        assert refused.parked is False
        parked = await store.park(run_id, claimed.token, [], now=104.0, wake_at=None,
                                  signals=[CHILD_SIGNAL], known_seq=known)
        assert parked.parked is True
    finally:
        store.close()


@pytest.mark.parametrize("sql", [
    "SELECT run_id FROM runs WHERE name='wf' AND status='queued' AND limit_line='c:k' "
    "ORDER BY limit_seq LIMIT 1",
    "SELECT COUNT(*) FROM runs WHERE name='wf' AND limit_conc='k' AND (status='running' "
    "OR (status='queued' AND queue_seq IS NOT NULL))",
    "SELECT MIN(limit_line) FROM runs WHERE name='wf' AND status='queued' "
    "AND limit_line IS NOT NULL AND limit_line>'a'",
])
def test_the_limit_queries_read_an_index(tmp_path: Path, sql: str) -> None:
    """The reads a claim adds for a limited workflow seek an index, never scan runs."""
    SQLiteStore(tmp_path / "s.db").close()
    conn = sqlite3.connect(tmp_path / "s.db")
    try:
        plan = " ".join(str(row[3]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}"))
    finally:
        conn.close()
    assert "SEARCH runs USING" in plan and "SCAN runs" not in plan, plan
