"""ArchivingStore over a real Valkey and the machine's Postgres.

Finished runs go to the archive as they end and stay readable after their live copy has
expired; runs ended while Postgres was away are archived by the reconcile loop, and none
is lost. Store-level tests use the fake times of the contract suite (tests/conformance);
tests that run a worker use the real clock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from pyrula.workflows import (
    ArchivingStore,
    PostgresArchive,
    RunNotActive,
    RunStatus,
    ValkeyStore,
    WorkflowContext,
    WorkflowNotFound,
    WorkflowWorker,
    step,
    workflow,
)
from pyrula.workflows.events import EventType
from pyrula.workflows.records import PoisonPolicy
from pyrula.workflows.stores.archive import ArchiveError
from tests.conformance.support import T0, TTL, WF, complete, ev, running, submit
from tests.conftest import await_until
from tests.postgres import PostgresAdmin
from tests.unit.worker.worker_support import fast_options, logged, serving

pytestmark = pytest.mark.postgres

MAKE = Callable[..., ArchivingStore]
ERROR = {"code": "workflow_error", "error_type": "KeyError", "message": "'sku'", "detail": None}


@step(name="archive_store.double")
def double(x: int) -> int:
    return 2 * x


@workflow(name="archive_store.order")
async def order(ctx: WorkflowContext, params: Any) -> Any:
    total = await double(params["qty"])
    return {"order": params["id"], "total": total}


@pytest.fixture
def make(valkey_url: str, valkey_namespace: str, postgres_archive_dsn: str
         ) -> Iterator[MAKE]:
    """``make(**options)``: an ArchivingStore on this test's namespace (live: one shard)."""
    made: list[ArchivingStore] = []

    def build(dsn: str = postgres_archive_dsn, **options: Any) -> ArchivingStore:
        completed_ttl = options.pop("completed_ttl", 86400)
        store = ArchivingStore(
            live=ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=1,
                             completed_ttl=completed_ttl),
            archive=PostgresArchive(dsn=dsn), **options,
        )
        made.append(store)
        return store

    yield build
    for store in made:
        store.close()


def _ttl(store: ArchivingStore, url: str, run_id: str) -> int:
    """The live run record's TTL in seconds (-1: none, -2: gone)."""
    with redis.Redis.from_url(url) as client:
        return int(client.ttl(store.live.keys.run(run_id)))


async def _gone_from_live(store: ArchivingStore, run_id: str) -> bool:
    return await store.live.get_run(run_id) is None


async def test_a_completed_run_stays_readable_after_its_live_copy_expires(make: MAKE) -> None:
    store = make(live_ttl_after_archive=1)
    worker = WorkflowWorker(store=store, workflows=[order], options=fast_options())
    async with serving(worker):
        client = worker.client
        run = await client.submit(order, {"id": "o-1", "qty": 21}, owner="tenant-7",
                                  idempotency_key="o-1")
        assert await client.result(run.run_id, timeout=30) == {"order": "o-1", "total": 42}
        live_info = await client.get(run.run_id)
        live_events = await client.events(run.run_id)

        await await_until(lambda: _gone_from_live(store, run.run_id), timeout=15,
                          what="the live copy to expire")

        assert await store.archive.get_run(run.run_id, store.namespace) == live_info
        assert await client.get(run.run_id) == live_info
        assert await client.events(run.run_id) == live_events
        assert await client.events(run.run_id, after_seq=2) == live_events[2:]
        assert await client.result(run.run_id, timeout=5) == {"order": "o-1", "total": 42}
        listed = [i async for i in client.list_runs(name=order, status=RunStatus.COMPLETED)]
        assert listed == [live_info]
        assert [i.run_id async for i in client.list_runs(owner="tenant-7")] == [run.run_id]
        # The idempotency key outlives the live copy (it keeps completed_ttl).
        again = await client.submit(order, {"id": "o-1", "qty": 21}, idempotency_key="o-1")
        assert again.run_id == run.run_id


async def test_runs_ended_by_cancel_quarantine_and_stranding_are_archived_as_they_end(
    make: MAKE, valkey_url: str
) -> None:
    store = make(live_ttl_after_archive=300)
    quarantine = PoisonPolicy(max_retries=0)

    queued = await submit(store, now=T0)
    assert await store.cancel(queued, now=T0 + 1)

    crashed = await running(store, now=T0)
    outcome = await store.requeue(crashed.run_id, crashed.token, now=T0 + 1, reason="orphaned",
                                  crash=True, poison=quarantine)
    assert outcome.quarantined

    asked = await running(store, now=T0)
    assert await store.cancel(asked.run_id, now=T0 + 1)  # only requested: it is running
    assert await store.archive.get_run(asked.run_id) is None
    await store.requeue(asked.run_id, asked.token, now=T0 + 2, reason="shutdown")

    orphan = await running(store, now=T0)
    outcomes = await store.reclaim(None, now=T0 + TTL + 1, limit=10, poison=quarantine)
    assert [(o.run_id, o.quarantined) for o in outcomes] == [(orphan.run_id, True)]

    stranded = await submit(store, "archive_store.unserved", now=T0)
    error = {"code": "stranded", "error_type": "Stranded", "message": "no worker",
             "detail": None}
    assert await store.fail_stranded("archive_store.unserved", older_than=T0 + 1, now=T0 + 2,
                                     limit=10, error=error) == [stranded]

    in_flight = await running(store, now=T0)
    expected = {queued: RunStatus.CANCELLED, crashed.run_id: RunStatus.FAILED,
                asked.run_id: RunStatus.CANCELLED, orphan.run_id: RunStatus.FAILED,
                stranded: RunStatus.FAILED}
    for run_id, status in expected.items():
        archived = await store.archive.get_run(run_id, store.namespace)
        assert archived is not None and archived.status == status, run_id
        assert archived == await store.live.get_run(run_id)
        assert await store.archive.read_events(run_id) == await store.live.read_events(run_id)
        assert 0 < _ttl(store, valkey_url, run_id) <= 300
    assert (await store.archive.get_run(crashed.run_id)).error["code"] == "max_retries"
    assert await store.archive.get_run(in_flight.run_id) is None
    assert _ttl(store, valkey_url, in_flight.run_id) == -1


async def test_reads_fall_back_to_the_archive_and_lists_merge_both(make: MAKE) -> None:
    store = make(live_ttl_after_archive=0)  # the live copy goes as soon as it is archived

    q1 = await submit(store, "wf.a", {"n": 1}, now=T0, owner="t1")
    r1 = await running(store, "wf.a", {"n": 2}, now=T0 + 1, owner="t2")
    await complete(store, r1.run_id, r1.token, {"r": 1}, now=T0 + 10)
    q2 = await submit(store, "wf.b", {"n": 3}, now=T0 + 2)
    r2 = await running(store, "wf.b", {"n": 4}, now=T0 + 3, owner="t1")
    await store.finish(r2.run_id, r2.token, [ev(EventType.RUN_ERROR, T0 + 11, **ERROR)],
                       now=T0 + 11, status=RunStatus.FAILED, error=ERROR)
    r3 = await running(store, "wf.a", {"n": 5}, now=T0 + 4, owner="t1")
    finished = await store.finish(
        r3.run_id, r3.token, [ev(EventType.RUN_CONTINUED, T0 + 12)], now=T0 + 12,
        status=RunStatus.CONTINUED, successor_params={"n": 6},
    )
    successor = finished.successor_id
    assert successor is not None

    for run in (r1, r2):
        assert await _gone_from_live(store, run.run_id)
    # A chain's earlier run is archived too but keeps completed_ttl in Valkey.
    assert await store.archive.get_run(r3.run_id) == await store.live.get_run(r3.run_id)
    newest_first = [successor, r3.run_id, r2.run_id, q2, r1.run_id, q1]

    async def ids(**filters: Any) -> list[str]:
        return [i.run_id for i in await store.list_runs(**filters)]

    assert await ids() == newest_first
    assert await ids(limit=3) == newest_first[:3]
    pages: list[str] = []
    before = None
    while page := await store.list_runs(limit=2, before=before):
        pages += [i.run_id for i in page]
        before = (page[-1].created_at, page[-1].run_id)
    assert pages == newest_first
    assert await ids(status=RunStatus.COMPLETED) == [r1.run_id]
    assert await ids(status=RunStatus.QUEUED) == [successor, q2, q1]
    assert await ids(name="wf.a") == [successor, r3.run_id, r1.run_id, q1]
    assert await ids(owner="t1") == [successor, r3.run_id, r2.run_id, q1]
    assert await ids(owner="t2") == [r1.run_id]

    archived = await store.get_run(r3.run_id)
    assert archived is not None
    assert (archived.status, archived.successor_id, archived.owner, archived.params) == (
        RunStatus.CONTINUED, successor, "t1", {"n": 5})
    assert (await store.wait_result(r2.run_id, timeout=1)).error == ERROR
    events = await store.read_events(r1.run_id)
    assert [e["type"] for e in events] == ["run:submitted", "run:started", "run:completed"]
    assert await store.read_events(r1.run_id, after_seq=2) == events[2:]
    with pytest.raises(RunNotActive, match="completed"):
        await store.signal(r1.run_id, "go", None, now=T0 + 20)
    assert await store.cancel(r1.run_id, now=T0 + 20) is False
    assert await store.wake_run(r1.run_id, now=T0 + 20) is False

    unknown = "f" * 40
    assert await store.get_run(unknown) is None
    with pytest.raises(WorkflowNotFound):
        await store.read_events(unknown)
    with pytest.raises(WorkflowNotFound):
        await store.wait_result(unknown, timeout=1)
    with pytest.raises(WorkflowNotFound):
        await store.cancel(unknown, now=T0)


async def test_reconcile_archives_runs_it_missed_and_moves_its_cursor(
    make: MAKE, valkey_url: str, valkey_namespace: str
) -> None:
    store = make(live_ttl_after_archive=300)
    # A plain ValkeyStore client on the same namespace (e.g. the CLI) ends runs unseen.
    plain = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=1)
    try:
        missed = [await submit(plain, now=T0 + i) for i in range(3)]
        for i, run_id in enumerate(missed):
            assert await plain.cancel(run_id, now=T0 + 10 + i)
    finally:
        await plain.aclose()
    seen = await running(store, now=T0)
    await complete(store, seen.run_id, seen.token, now=T0 + 20)

    # Runs ended within reconcile_grace (30 s) of `now` are left to their process.
    early = await store.reconcile(now=T0 + 11 + store.reconcile_grace)
    assert (early.leader, early.scanned, early.archived) == (True, 2, 2)
    assert early.cursor == (T0 + 11, missed[1])

    late = await store.reconcile(now=T0 + 100)
    assert (late.scanned, late.archived, late.lost, late.caught_up) == (2, 1, 0, True)
    assert late.cursor == (T0 + 20, seen.run_id)
    for run_id in missed:
        assert (await store.archive.get_run(run_id)).status == RunStatus.CANCELLED
        assert 0 < _ttl(store, valkey_url, run_id) <= 300
    assert await store.archive.cursor(store.namespace) == late.cursor
    nothing = await store.reconcile(now=T0 + 200)
    assert (nothing.scanned, nothing.archived) == (0, 0)


async def test_reconcile_reads_the_live_store_in_batches(make: MAKE) -> None:
    store = make(reconcile_batch=2)
    run_ids = [await submit(store, now=T0 + i) for i in range(5)]
    for run_id in run_ids:
        await store.live.cancel(run_id, now=T0 + 10)  # one timestamp: ties on the cursor
    report = await store.reconcile(now=T0 + 100, max_batches=2)
    assert (report.scanned, report.archived, report.caught_up) == (4, 4, False)

    rest = await store.reconcile(now=T0 + 100)
    assert (rest.scanned, rest.archived, rest.caught_up) == (1, 1, True)
    assert await store.archive.archived(store.namespace, run_ids) == set(run_ids)


async def test_one_reconciler_per_namespace_at_a_time(make: MAKE, postgres_archive_dsn: str
                                                     ) -> None:
    store = make()
    other = PostgresArchive(dsn=postgres_archive_dsn)
    try:
        async with other.leader(store.namespace) as leading:
            assert leading
            assert (await store.reconcile(now=T0)).leader is False
        assert (await store.reconcile(now=T0)).leader is True
    finally:
        await other.aclose()


async def test_a_run_the_archive_refuses_is_logged_and_skipped(
    make: MAKE, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make()
    run_ids = [await submit(store, now=T0 + i) for i in range(3)]
    bad = run_ids[1]
    real = store.archive.upsert_runs

    async def refusing(namespace: str, records: Any) -> int:
        records = list(records)
        if any(info.run_id == bad for info, _ in records):
            raise ValueError("value out of range")  # what a data error looks like
        return await real(namespace, records)

    monkeypatch.setattr(store.archive, "upsert_runs", refusing)
    for run_id in run_ids:
        await store.live.cancel(run_id, now=T0 + 10)

    with caplog.at_level(logging.ERROR, logger="pyrula.workflows.stores.archive"):
        report = await store.reconcile(now=T0 + 100)

    assert (report.archived, report.failed, report.caught_up) == (2, 1, True)
    assert await store.archive.archived(store.namespace, run_ids) == {run_ids[0], run_ids[2]}
    assert [r.run_id for r in logged(caplog, "archive_failed")] == [bad]


async def test_a_run_that_expired_before_it_was_archived_is_reported_lost(
    make: MAKE, caplog: pytest.LogCaptureFixture
) -> None:
    store = make(completed_ttl=1)
    run_id = await submit(store.live, now=T0)
    await store.live.cancel(run_id, now=T0 + 1)
    await await_until(lambda: _gone_from_live(store, run_id), timeout=15)

    with caplog.at_level(logging.ERROR, logger="pyrula.workflows.stores.archive"):
        report = await store.reconcile(now=T0 + 100)

    assert (report.scanned, report.archived, report.lost) == (1, 0, 1)
    assert len(logged(caplog, "archive_lost")) == 1


# --- a Postgres outage ------------------------------------------------------------------


@pytest.fixture
def outage_db(postgres_admin: PostgresAdmin) -> Iterator[tuple[str, Callable[[bool], None]]]:
    """A migrated archive database of this test's own, and ``down(bool)`` that takes it
    away (refusing connections and ending those it has) and brings it back."""
    name = postgres_admin.create_database()
    dsn = postgres_admin.dsn(name)

    async def migrate() -> None:
        archive = PostgresArchive(dsn=dsn)
        await archive.migrate()
        await archive.aclose()

    try:
        asyncio.run(migrate())
        yield dsn, lambda down: postgres_admin.allow_connections(name, not down)
    finally:
        postgres_admin.allow_connections(name, True)
        postgres_admin.drop_database(name)


async def test_an_outage_is_retried_by_reconcile_and_nothing_finished_is_lost(
    make: MAKE, valkey_url: str, outage_db: tuple[str, Callable[[bool], None]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    dsn, down = outage_db
    store = make(dsn=dsn, live_ttl_after_archive=300)
    caplog.set_level(logging.INFO, logger="pyrula.workflows.stores.archive")
    before = await running(store, now=T0)
    await complete(store, before.run_id, before.token, now=T0 + 1)
    assert await store.archive.get_run(before.run_id) is not None

    down(True)
    during = [await running(store, now=T0 + 2) for _ in range(3)]
    for claimed in during:  # the terminal writes succeed; archiving waits
        await complete(store, claimed.run_id, claimed.token, {"ok": True}, now=T0 + 3)
    cancelled = await submit(store, now=T0 + 2)
    assert await store.cancel(cancelled, now=T0 + 4)
    ended = [c.run_id for c in during] + [cancelled]
    for run_id in ended:  # nothing expires before it is archived
        assert _ttl(store, valkey_url, run_id) > 300

    delay = await store.reconcile_tick(worker_id="w", names=[WF], now=T0 + 100)
    assert delay is not None and 0 < delay <= 30
    assert len(logged(caplog, "archive_unavailable")) == 1

    down(False)
    report = await store.reconcile(now=T0 + 100)

    assert (report.archived, report.lost, report.failed, report.caught_up) == (4, 0, 0, True)
    for run_id in ended:
        archived = await store.archive.get_run(run_id, store.namespace)
        assert archived == await store.live.get_run(run_id)
        assert 0 < _ttl(store, valkey_url, run_id) <= 300
    assert len(logged(caplog, "archive_recovered")) == 1
    assert await store.reconcile_tick(worker_id="w", names=[WF], now=T0 + 200) is None


async def test_a_worker_keeps_running_runs_through_an_outage_and_archives_them_after(
    make: MAKE, outage_db: tuple[str, Callable[[bool], None]]
) -> None:
    dsn, down = outage_db
    store = make(dsn=dsn, reconcile_grace=0.0)
    worker = WorkflowWorker(store=store, workflows=[order],
                            options=fast_options(reconcile_interval=0.1))
    async with serving(worker):
        down(True)
        runs = [await worker.client.submit(order, {"id": f"o-{i}", "qty": i})
                for i in range(5)]
        results = [await worker.client.result(r.run_id, timeout=30) for r in runs]
        assert [r["total"] for r in results] == [0, 2, 4, 6, 8]
        started = time.monotonic()
        down(False)

        async def all_archived() -> bool:
            found = await store.archive.archived(store.namespace, [r.run_id for r in runs])
            return len(found) == len(runs)

        await await_until(all_archived, timeout=60, interval=0.1, what="the archive drain")
        assert time.monotonic() - started < 60


async def test_a_database_error_in_reconcile_is_logged_and_retried_not_fatal(
    make: MAKE, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make()
    run_id = await submit(store.live, now=T0)
    await store.live.cancel(run_id, now=T0 + 1)
    real = store.archive.archived

    async def deadlocked(namespace: str, run_ids: Any) -> set[str]:
        raise ArchiveError("Postgres archive: DeadlockDetectedError: deadlock detected",
                           "40P01")

    monkeypatch.setattr(store.archive, "archived", deadlocked)
    with caplog.at_level(logging.ERROR, logger="pyrula.workflows.stores.archive"):
        delay = await store.reconcile_tick(worker_id="w", names=[WF], now=T0 + 100)
    assert delay is not None and delay > 0
    assert len(logged(caplog, "archive_reconcile_failed")) == 1

    monkeypatch.setattr(store.archive, "archived", real)
    assert await store.reconcile_tick(worker_id="w", names=[WF], now=T0 + 100) is None
    assert await store.archive.get_run(run_id) is not None


async def test_a_projection_folds_the_runs_only_the_archive_still_holds(make: MAKE) -> None:
    from pyrula.workflows.projections import ProjectionSpec
    from pyrula.workflows.worker.projections import fold_once

    store = make(live_ttl_after_archive=0)  # the live copy goes as soon as it is archived
    kept = make(live_ttl_after_archive=86400)  # the same namespace: these stay live too
    ended = []
    for i in range(3):  # archived, then gone from Valkey
        r = await running(store, WF, {"n": i}, now=T0 + i)
        await complete(store, r.run_id, r.token, {"i": i}, now=T0 + 10 + i)
        ended.append(r.run_id)
        assert await _gone_from_live(store, r.run_id)
    for i in range(2):  # archived and still live
        r = await running(kept, WF, {"n": i}, now=T0 + 20 + i)
        await complete(kept, r.run_id, r.token, {"i": i}, now=T0 + 30 + i)
        ended.append(r.run_id)
    spec = ProjectionSpec("archive_store.ids", (WF,),
                          lambda state, run: [*(state or []), run.run_id])

    for _ in range(10):
        if (await fold_once(store, spec, now=T0 + 100, grace=0.0, batch=2)).outcome == "idle":
            break

    states = await store.projection_states(spec.name, None)
    assert states == {"": ended}  # each once, in end order, expired ones from the archive
