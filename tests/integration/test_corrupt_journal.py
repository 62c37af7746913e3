"""A journal entry forged or truncated straight in the store (not written by pyrula) fails
that run with a clear error, code ``corrupt_journal`` naming the entry, at once: the
worker that meets it keeps serving other runs, the claim that brought it still starts the
runs claimed with it, and the run is not charged a crash (no requeue, no quarantine).

Both shared stores: SQLite (an ``UPDATE events`` from another connection) and Valkey (an
``LSET`` on the run's journal list, as ``docs/valkey.md`` lays the keys out)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from pyrula.workflows import (
    RunFailed,
    RunStatus,
    SQLiteStore,
    ValkeyStore,
    WorkflowClient,
)
from pyrula.workflows.errors import JournalCorrupt
from tests.conftest import await_until
from tests.integration.valkey_support import (
    awaits_signal,
    captured_logs,
    make_worker,
    one_step,
    serving,
)

TRUNCATED = '{"type": "step:completed", "step": "vk.to'
#: Each forgery, and what the error says of it (lone surrogates: bytes that are not UTF-8).
FORGERIES = [
    pytest.param(TRUNCATED, "is not JSON", id="truncated"),
    pytest.param("\x00\udcff\udcfe garbage", "is not JSON", id="not-utf8"),
    pytest.param("", "is not JSON", id="empty"),
    pytest.param("[1, 2, 3]", "is not a JSON object", id="not-an-object"),
    pytest.param('{"ts": 1.0}', "has no type", id="no-type"),
    pytest.param('{"type": "step:completed", "call": "one"}', "has call 'one'", id="bad-call"),
]

class Target:
    """A store, and ``corrupt(run_id, seq, raw)``: overwrite entry ``seq`` of a run's
    journal behind the store's back. ``aclose`` closes this loop's connections (the test
    runner calls it)."""

    def __init__(self, store: Any, corrupt: Callable[[str, int, str], None]) -> None:
        self.store = store
        self.corrupt = corrupt

    async def aclose(self) -> None:
        close = getattr(self.store, "aclose", None)
        if close is not None:
            await close()


def _raw(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")  # lone surrogates: bytes not UTF-8


@pytest.fixture(params=["sqlite", pytest.param("valkey", marks=pytest.mark.valkey)])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    if request.param == "sqlite":
        path = tmp_path / "store.db"
        store: Any = SQLiteStore(str(path))

        def corrupt(run_id: str, seq: int, raw: str) -> None:
            conn = sqlite3.connect(path)
            with conn:
                done = conn.execute("UPDATE events SET data=? WHERE run_id=? AND seq=?",
                                    (_raw(raw), run_id, seq))
                assert done.rowcount == 1
            conn.close()
    else:
        url = request.getfixturevalue("valkey_url")
        namespace = request.getfixturevalue("valkey_namespace")
        store = ValkeyStore(url=url, namespace=namespace, shard_count=2)

        def corrupt(run_id: str, seq: int, raw: str) -> None:
            with redis.Redis.from_url(url) as client:
                client.lset(store.keys.journal(run_id), seq - 1, _raw(raw))
    try:
        yield Target(store, corrupt)
    finally:
        store.close()


async def _status(client: WorkflowClient, run_id: str, status: RunStatus) -> bool:
    return (await client.get(run_id)).status is status


async def _seq_of(client: WorkflowClient, run_id: str, type_: str) -> int:
    return next(int(e["seq"]) for e in await client.events(run_id) if e["type"] == type_)


@pytest.mark.parametrize(("raw", "says"), FORGERIES)
async def test_a_forged_entry_fails_its_run_and_the_worker_serves_the_others(
    target: Target, raw: str, says: str
) -> None:
    store, corrupt = target.store, target.corrupt
    client = WorkflowClient(store)
    # Workers without a journal cache, so a resumed run's head is read from the store.
    first = make_worker(store, [one_step, awaits_signal], journal_cache_events=0)
    async with serving(first):
        read, claimed = [await client.submit(awaits_signal, {"tag": t})
                         for t in ("read", "claimed")]
        for run in (read, claimed):
            await await_until(lambda r=run: _status(client, r.run_id, RunStatus.WAITING),
                              timeout=20, what="the run to wait for its signal")
    # With no worker running: "read" has its recorded step forged (met when its journal
    # is read at its resume); "claimed" is signalled, then its signal forged (met in the
    # journal tail the claim itself returns, in one batch with a healthy run).
    step_seq = await _seq_of(client, read.run_id, "step:completed")
    corrupt(read.run_id, step_seq, raw)
    await client.signal(claimed.run_id, "go", 1)
    signal_seq = await _seq_of(client, claimed.run_id, "signal:received")
    corrupt(claimed.run_id, signal_seq, raw)
    healthy = await client.submit(one_step, {"tag": "healthy"})

    second = make_worker(store, [one_step, awaits_signal], journal_cache_events=0,
                         max_concurrent_runs=4)
    with captured_logs() as logs:
        async with serving(second):
            assert await client.result(healthy.run_id, timeout=20) == "healthy"
            await client.signal(read.run_id, "go", 1)
            for run, seq in ((read, step_seq), (claimed, signal_seq)):
                with pytest.raises(RunFailed) as failed:
                    await client.result(run.run_id, timeout=20)
                error = failed.value.error
                assert error["code"] == "corrupt_journal"
                assert error["error_type"] == "JournalCorrupt"
                assert error["message"].startswith(f"run {run.run_id}: journal entry {seq} "
                                                   f"{says}")
                assert error["detail"]["seq"] == seq
            # The worker is alive and serves what comes next.
            after = await client.submit(one_step, {"tag": "after"})
            assert await client.result(after.run_id, timeout=20) == "after"
            assert second.state == "ready"
    # Failed at the attempt that met the entry: never requeued, never charged a crash.
    for run in (read, claimed):
        info = await client.get(run.run_id)
        assert info.status is RunStatus.FAILED and info.attempt == 2
    assert not logs.events("loop_died")
    assert not logs.events("run_quarantined") and not logs.events("run_reclaimed")
    assert len(logs.events("run_journal_corrupt")) == 2
    # Reading the journal says what is wrong with it, rather than failing to parse.
    with pytest.raises(JournalCorrupt, match=f"run {read.run_id}: journal entry {step_seq} "):
        await client.events(read.run_id)


@pytest.mark.postgres
async def test_the_archive_leaves_out_a_run_whose_journal_is_forged(
    valkey_url: str, valkey_namespace: str, postgres_archive_dsn: str
) -> None:
    """Under an ArchivingStore the failed run is not archived (``archive_failed`` names
    it): neither the archiving at its end nor the reconcile loop stops the worker, and the
    healthy runs around it are archived."""
    from pyrula.workflows import ArchivingStore, PostgresArchive

    live = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=1)
    store = ArchivingStore(live=live, archive=PostgresArchive(dsn=postgres_archive_dsn),
                           reconcile_grace=0.0)
    client = WorkflowClient(store)
    try:
        first = make_worker(store, [awaits_signal], journal_cache_events=0)
        async with serving(first):
            forged = await client.submit(awaits_signal, {"tag": "forged"})
            await await_until(lambda: _status(client, forged.run_id, RunStatus.WAITING),
                              timeout=20, what="the run to wait for its signal")
        step_seq = await _seq_of(client, forged.run_id, "step:completed")
        with redis.Redis.from_url(valkey_url) as raw:
            raw.lset(live.keys.journal(forged.run_id), step_seq - 1, TRUNCATED)
        await client.signal(forged.run_id, "go", 1)
        healthy = await client.submit(one_step, {"tag": "archived"})

        second = make_worker(store, [one_step, awaits_signal], journal_cache_events=0,
                             reconcile_interval=0.2)
        with captured_logs() as logs:
            async with serving(second):
                assert await client.result(healthy.run_id, timeout=20) == "archived"
                with pytest.raises(RunFailed) as failed:
                    await client.result(forged.run_id, timeout=20)
                assert failed.value.error["code"] == "corrupt_journal"
                await await_until(
                    lambda: any(r.getMessage().count(forged.run_id)
                                for r in logs.events("archive_failed")),
                    timeout=20, what="the reconcile loop to refuse the forged run")
                after = await client.submit(one_step, {"tag": "after"})
                assert await client.result(after.run_id, timeout=20) == "after"
                assert second.state == "ready"
            assert not logs.events("loop_died") and not logs.events("archive_lost")
        for run_id in (healthy.run_id, after.run_id):
            assert await store.archive.get_run(run_id, store.namespace) is not None
        assert await store.archive.get_run(forged.run_id, store.namespace) is None
    finally:
        await store.aclose()
        store.close()
