"""Projections across real worker processes: several ``pyrula worker`` processes on one
store (SQLite, Valkey standalone, a Valkey cluster) fold runs while threads submit them;
one worker killed with SIGKILL mid-load and replaced. Afterwards the projection, which
lists the ids of the runs it folded, holds every completed run exactly once."""

from __future__ import annotations

import signal
import textwrap
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from pyrula.workflows import RunStatus
from tests.conftest import wait_until
from tests.integration.test_trigger_processes import _client, store_url
from tests.integration.workerprocs import WorkerProcess, child_env

__all__ = ["store_url"]  # the store fixture, shared with the trigger process tests

APP = textwrap.dedent(
    '''
    """The workflow and the projection of the projection process tests."""

    import time

    from pyrula.workflows import projection, step, workflow


    @step
    def work(n):
        time.sleep(0.01)  # runs are in flight when a worker is killed
        return n


    @workflow(name="proj_proc")
    async def proc(ctx, params):
        return await work(params["n"])


    @projection("proj_proc.ids", on=["proj_proc"])
    def ids(state, run):
        return [*(state or []), run.run_id]
    '''
)

NAME, PROJECTION = "proj_proc", "proj_proc.ids"
SUBMITTERS, PER_SUBMITTER = 3, 50
WORKER_FLAGS = ("--projection-interval", "0.05", "--projection-grace", "1",
                "--claim-poll-interval", "0.02", "--lock-ttl", "2",
                "--orphan-scan-interval", "0.5", "--shutdown-grace", "5")


class Fleet:
    """Worker processes in one directory, each reaped at the end."""

    def __init__(self, directory: Path, store_flags: list[str]) -> None:
        self.directory = directory
        self.flags = store_flags
        self.started: list[WorkerProcess] = []
        (directory / "projapp.py").write_text(APP)

    def start(self) -> WorkerProcess:
        worker = WorkerProcess(self.directory, f"worker-{len(self.started)}",
                               ["worker", "--app", "projapp", *self.flags, *WORKER_FLAGS],
                               child_env())
        self.started.append(worker)
        worker.wait_for_log("worker_started", timeout=30)
        return worker

    def reap(self) -> None:
        for worker in self.started:
            worker.reap()


def _submit_all(url: str, during: Any = None) -> list[str]:
    """Submit SUBMITTERS x PER_SUBMITTER runs from as many threads (each with its own store
    object); call ``during`` once a third of them are out. Their ids."""
    ids: list[list[str]] = [[] for _ in range(SUBMITTERS)]
    third = threading.Event()

    def submitter(k: int) -> None:
        client = _client(url)
        try:
            for i in range(PER_SUBMITTER):
                ids[k].append(client.submit(NAME, {"n": i}).run_id)
                if k == 0 and i == PER_SUBMITTER // 3:
                    third.set()
        finally:
            client.store.close()

    threads = [threading.Thread(target=submitter, args=(k,)) for k in range(SUBMITTERS)]
    for thread in threads:
        thread.start()
    if during is not None:
        third.wait(60)
        during()
    for thread in threads:
        thread.join(120)
    return [run_id for chunk in ids for run_id in chunk]


def _folded(url: str, submitted: list[str]) -> Counter[str]:
    """Wait until every submitted run completed and is in the projection; how often each
    run id is there."""
    client = _client(url)

    def done() -> Counter[str] | None:
        runs = [client.get(run_id) for run_id in submitted]
        if any(r.status is not RunStatus.COMPLETED for r in runs):
            return None
        seen = Counter(client.projection(PROJECTION) or [])
        return seen if set(seen) >= set(submitted) else None

    try:
        found: Counter[str] = wait_until(done, timeout=120, interval=0.2,
                                         what="every run completed and folded")
        return found
    finally:
        client.store.close()


def test_workers_fold_each_run_exactly_once(tmp_path: Path,
                                            store_url: tuple[str, list[str]]) -> None:
    url, flags = store_url
    fleet = Fleet(tmp_path, flags)
    try:
        for _ in range(3):
            fleet.start()
        submitted = _submit_all(url)
        seen = _folded(url, submitted)
        assert set(seen) == set(submitted)
        assert max(seen.values()) == 1, [r for r, n in seen.items() if n > 1]
    finally:
        fleet.reap()


def test_a_worker_killed_mid_load_leaves_no_run_unfolded_or_doubled(
        tmp_path: Path, store_url: tuple[str, list[str]]) -> None:
    url, flags = store_url
    fleet = Fleet(tmp_path, flags)
    try:
        victim, _ = fleet.start(), fleet.start()

        def kill_and_replace() -> None:
            victim.send(signal.SIGKILL)
            assert victim.wait(10) == -signal.SIGKILL
            fleet.start()

        submitted = _submit_all(url, during=kill_and_replace)
        seen = _folded(url, submitted)
        assert set(seen) == set(submitted)
        assert max(seen.values()) == 1, [r for r, n in seen.items() if n > 1]
        info = _client(url).projection_info(PROJECTION)
        assert info is not None and info.folded == len(submitted)
    finally:
        fleet.reap()
