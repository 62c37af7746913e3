"""Batch triggers across real worker processes: several ``pyrula worker`` processes on
one store (SQLite, Valkey standalone, a Valkey cluster) while threads emit events at
once; one worker killed with SIGKILL mid-load and replaced. Afterwards every event is in
exactly one completed run's params, and every run completed."""

from __future__ import annotations

import signal
import textwrap
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import RunStatus, SyncWorkflowClient, store_from_url
from tests.conftest import wait_until
from tests.integration.workerprocs import WorkerProcess, child_env

APP = textwrap.dedent(
    '''
    """The triggered workflow of the trigger process tests."""

    import time

    from pyrula.workflows import BatchTrigger, step, workflow


    @step
    def handle(ids):
        time.sleep(0.02)  # runs are in flight when a worker is killed
        return len(ids)


    @workflow(name="trig_proc", trigger=BatchTrigger("trig.proc", max_size=7, max_wait=0.3))
    async def collect(ctx, params):
        ids = [event["id"] for event in params["events"]]
        await handle(ids)
        return ids
    '''
)

NAME, TOPIC = "trig_proc", "trig.proc"
EMITTERS, PER_EMITTER = 4, 60
WORKER_FLAGS = ("--trigger-interval", "0.05", "--claim-poll-interval", "0.02",
                "--lock-ttl", "2", "--orphan-scan-interval", "0.5", "--shutdown-grace", "5")


@pytest.fixture(params=["sqlite", pytest.param("valkey", marks=pytest.mark.valkey),
                        pytest.param("valkey-cluster",
                                     marks=[pytest.mark.valkey, pytest.mark.cluster])])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """The store's URL and the flags that name it to a worker."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
        yield url, ["--store", url]
        return
    namespace = request.getfixturevalue("valkey_namespace")
    if request.param == "valkey":
        url = request.getfixturevalue("valkey_url")
    else:
        url = request.getfixturevalue("valkey_cluster").url
        namespace = f"t{uuid.uuid4().hex[:16]}"
    yield f"{url}?namespace={namespace}", ["--store", url, "--namespace", namespace]


class Fleet:
    """Worker processes in one directory, each reaped at the end."""

    def __init__(self, directory: Path, store_flags: list[str]) -> None:
        self.directory = directory
        self.flags = store_flags
        self.started: list[WorkerProcess] = []
        (directory / "trigapp.py").write_text(APP)

    def start(self) -> WorkerProcess:
        worker = WorkerProcess(self.directory, f"worker-{len(self.started)}",
                               ["worker", "--app", "trigapp", *self.flags, *WORKER_FLAGS],
                               child_env())
        self.started.append(worker)
        worker.wait_for_log("worker_started", timeout=30)
        return worker

    def reap(self) -> None:
        for worker in self.started:
            worker.reap()


def _client(url: str) -> SyncWorkflowClient:
    base, _, namespace = url.partition("?namespace=")
    options: dict[str, Any] = {"namespace": namespace} if namespace else {}
    return SyncWorkflowClient(store_from_url(base, **options))


def _emit_all(url: str, during: Any = None) -> list[str]:
    """Emit EMITTERS x PER_EMITTER events from as many threads at once (each with its own
    store object); call ``during`` once a third of them are out. Their ids."""
    ids: list[list[str]] = [[] for _ in range(EMITTERS)]
    third = threading.Event()

    def emitter(k: int) -> None:
        client = _client(url)
        try:
            for i in range(PER_EMITTER):
                ids[k].append(client.emit(TOPIC, {"k": k, "i": i}, owner=f"tenant-{i % 3}"))
                if k == 0 and i == PER_EMITTER // 3:
                    third.set()
        finally:
            client.store.close()

    threads = [threading.Thread(target=emitter, args=(k,)) for k in range(EMITTERS)]
    for thread in threads:
        thread.start()
    if during is not None:
        third.wait(60)
        during()
    for thread in threads:
        thread.join(120)
    return [event_id for chunk in ids for event_id in chunk]


def _settled(url: str, emitted: list[str]) -> Counter[str]:
    """Wait until every emitted event is in a completed run; how often each id appears."""
    client = _client(url)

    def done() -> Counter[str] | None:
        runs = list(client.list_runs(name=NAME))
        if not runs or any(r.status is not RunStatus.COMPLETED for r in runs):
            return None
        seen = Counter(e["id"] for r in runs for e in r.params["events"])
        for r in runs:  # the run's own result says what it handled
            assert r.result == [e["id"] for e in r.params["events"]]
        return seen if set(seen) >= set(emitted) else None

    try:
        found: Counter[str] = wait_until(done, timeout=90, interval=0.2,
                                         what="every event in a completed run")
        return found
    finally:
        client.store.close()


def test_workers_put_each_event_in_exactly_one_run(tmp_path: Path,
                                                    store_url: tuple[str, list[str]]) -> None:
    url, flags = store_url
    fleet = Fleet(tmp_path, flags)
    try:
        for _ in range(3):
            fleet.start()
        emitted = _emit_all(url)
        seen = _settled(url, emitted)
        assert len(emitted) == len(set(emitted)) == EMITTERS * PER_EMITTER
        assert set(seen) == set(emitted)
        assert max(seen.values()) == 1, [e for e, n in seen.items() if n > 1]
    finally:
        fleet.reap()


def test_a_worker_killed_mid_load_loses_no_event_and_doubles_none(
        tmp_path: Path, store_url: tuple[str, list[str]]) -> None:
    url, flags = store_url
    fleet = Fleet(tmp_path, flags)
    try:
        victim, _ = fleet.start(), fleet.start()

        def kill_and_replace() -> None:
            victim.send(signal.SIGKILL)
            assert victim.wait(10) == -signal.SIGKILL
            fleet.start()

        emitted = _emit_all(url, during=kill_and_replace)
        seen = _settled(url, emitted)
        assert set(seen) == set(emitted)
        assert max(seen.values()) == 1, [e for e, n in seen.items() if n > 1]
    finally:
        fleet.reap()
