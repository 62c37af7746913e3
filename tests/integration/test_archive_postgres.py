"""PostgresArchive on its own: idempotent upserts, namespaces, reads, pools per event loop;
and the ArchivingStore's group commit of runs that end together."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest

from pyrula.workflows import (
    ArchivingStore,
    PostgresArchive,
    RunStatus,
    SyncWorkflowClient,
    ValkeyStore,
    WorkflowNotFound,
)
from pyrula.workflows.records import RunInfo
from tests.conformance.support import T0, complete, running
from tests.conftest import await_until

pytestmark = pytest.mark.postgres


def _run(run_id: str, status: RunStatus = RunStatus.COMPLETED, **fields: Any) -> RunInfo:
    values: dict[str, Any] = {
        "run_id": run_id, "name": "wf", "status": status, "attempt": 1, "params": {"n": 1},
        "owner": None, "created_at": T0, "updated_at": T0 + 1, "started_at": T0,
        "finished_at": T0 + 1, "result": {"ok": True}, "start_id": run_id,
    }
    values.update(fields)
    return RunInfo(**values)


def _journal(count: int) -> list[dict[str, Any]]:
    return [{"seq": seq, "type": "step:completed", "ts": T0 + seq} for seq in range(1, count + 1)]


@pytest.fixture
def archive(postgres_archive_dsn: str) -> Iterator[PostgresArchive]:
    """An archive on the session's database (the test's loop closes its pool after it)."""
    archive = PostgresArchive(dsn=postgres_archive_dsn)
    yield archive
    archive.close()


def _ns() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


async def _count(dsn: str, sql: str, *args: Any) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(sql, *args))
    finally:
        await conn.close()


async def test_archiving_a_run_again_rewrites_it(postgres_archive_dsn: str) -> None:
    archive = PostgresArchive(dsn=postgres_archive_dsn)
    ns, run_id = _ns(), uuid.uuid4().hex
    try:
        await archive.archive_run(ns, _run(run_id), _journal(3))
        written = await archive.upsert_runs(ns, [(_run(run_id, result="first"), _journal(3)),
                                                 (_run(run_id, result="again"), _journal(3))])
        assert written == 1  # one run, given twice: the last copy wins

        got = await archive.get_run(run_id, ns)
        assert got is not None and got.result == "again"
        assert await archive.read_events(run_id, namespace=ns) == _journal(3)
        rows = await _count(postgres_archive_dsn,
                            "SELECT count(*) FROM pyrula.events WHERE run_id = $1", run_id)
        assert rows == 3
    finally:
        await archive.aclose()


async def test_only_finished_runs_are_archived(archive: PostgresArchive) -> None:
    with pytest.raises(ValueError, match="only finished runs"):
        await archive.archive_run(_ns(), _run("r", RunStatus.RUNNING), [])
    assert await archive.upsert_runs(_ns(), []) == 0


async def test_every_json_value_round_trips(archive: PostgresArchive) -> None:
    ns, run_id = _ns(), uuid.uuid4().hex
    odd = {"nul": "a\u0000b", "emoji": "\U0001f600", "big": 2**62, "float": 0.1, "none": None,
           "nested": [{"x": []}]}
    info = _run(run_id, RunStatus.FAILED, params=odd, result=None, owner="t1",
                error={"code": "step_failed", "error_type": "E", "message": "\u0000"},
                interrupt={"ask": "ok?"}, idempotency_key="k", successor_id=None,
                started_at=None)
    events = [{"seq": 1, "type": "run:submitted", "ts": T0, "params": odd}]

    await archive.archive_run(ns, info, events)

    assert await archive.get_run(run_id, ns) == info
    assert await archive.read_events(run_id, namespace=ns) == events


async def test_namespaces_do_not_see_each_other(archive: PostgresArchive) -> None:
    one, two, run_id = _ns(), _ns(), uuid.uuid4().hex
    await archive.archive_run(one, _run(run_id), _journal(2))

    assert await archive.get_run(run_id, two) is None
    assert await archive.get_run(run_id) is not None  # no namespace: any
    with pytest.raises(WorkflowNotFound):
        await archive.read_events(run_id, namespace=two)
    assert len(await archive.read_events(run_id)) == 2
    assert await archive.list_runs(namespace=two) == []
    assert [r.run_id for r in await archive.list_runs(namespace=one)] == [run_id]
    assert await archive.archived(two, [run_id]) == set()
    assert await archive.archived(one, [run_id, "other"]) == {run_id}
    assert await archive.cursor(one) is None
    await archive.set_cursor(one, (T0 + 5, run_id))
    assert await archive.cursor(one) == (T0 + 5, run_id)
    assert await archive.cursor(two) is None


async def test_list_runs_filters_and_pages(archive: PostgresArchive) -> None:
    ns = _ns()
    runs = [_run(f"{i:032x}", RunStatus.FAILED if i % 2 else RunStatus.COMPLETED,
                 created_at=T0 + i, name="a" if i < 3 else "b", owner="t1" if i % 3 else None)
            for i in range(6)]
    await archive.upsert_runs(ns, [(r, _journal(1)) for r in runs])

    async def ids(**filters: Any) -> list[str]:
        return [r.run_id for r in await archive.list_runs(namespace=ns, **filters)]

    newest = [r.run_id for r in reversed(runs)]
    assert await ids() == newest
    assert await ids(limit=2, before=(T0 + 4, runs[4].run_id)) == newest[2:4]
    assert await ids(status=RunStatus.FAILED) == [newest[0], newest[2], newest[4]]
    assert await ids(name="a") == newest[3:]
    assert await ids(owner="") == [runs[3].run_id, runs[0].run_id]
    assert await ids(owner="t1", status="completed") == [runs[4].run_id, runs[2].run_id]


def test_one_archive_serves_several_loops_and_threads(postgres_archive_dsn: str) -> None:
    archive = PostgresArchive(dsn=postgres_archive_dsn)
    ns = _ns()
    errors: list[BaseException] = []

    def thread(i: int) -> None:
        async def work() -> None:
            run_id = f"{i:032x}"
            await archive.archive_run(ns, _run(run_id), _journal(2))
            assert (await archive.get_run(run_id, ns)) is not None

        try:
            asyncio.run(work())
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=thread, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []

    async def listed() -> int:
        try:
            return len(await archive.list_runs(namespace=ns))
        finally:
            await archive.aclose()

    assert asyncio.run(listed()) == 4
    archive.close()


async def test_runs_that_end_together_are_archived_in_few_statements(
    valkey_url: str, valkey_namespace: str, postgres_archive_dsn: str
) -> None:
    store = ArchivingStore(
        live=ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=1),
        archive=PostgresArchive(dsn=postgres_archive_dsn),
    )
    calls: list[list[str]] = []
    gate = asyncio.Event()
    real = store.archive.upsert_runs

    async def gated(namespace: str, records: Any) -> int:
        records = list(records)
        calls.append([info.run_id for info, _ in records])
        if len(calls) == 1:
            await gate.wait()  # the first batch is in flight while the others end
        return await real(namespace, records)

    store.archive.upsert_runs = gated  # type: ignore[method-assign]
    try:
        claimed = [await running(store, now=T0) for _ in range(30)]
        finishing = [asyncio.create_task(complete(store, c.run_id, c.token, now=T0 + 1))
                     for c in claimed]
        await await_until(lambda: len(calls) == 1 and len(store.archiver._group().pending) == 29,
                          what="the other 29 runs to queue behind the first batch")
        gate.set()
        await asyncio.gather(*finishing)

        assert [len(batch) for batch in calls] == [1, 29]
        everyone = {c.run_id for c in claimed}
        assert await store.archive.archived(store.namespace, list(everyone)) == everyone
        # A synchronous client reads archived runs through the facade loop's own pool.
        client = SyncWorkflowClient(store)
        assert client.get(claimed[0].run_id).status == RunStatus.COMPLETED
    finally:
        await store.aclose()
        store.close()
