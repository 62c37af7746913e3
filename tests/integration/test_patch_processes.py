"""A deploy with real worker processes: a run parked by a worker on the code before a
change (``patchapp`` v1) resumes on a worker of the code with ``ctx.patched`` (v2) and
keeps to the old branch, while a run started on v2 takes the new one."""

from __future__ import annotations

import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import RunStatus, SQLiteStore, SyncWorkflowClient
from tests.conftest import wait_until
from tests.integration.workerprocs import WorkerProcess, child_env

V1 = '''
from pyrula.workflows import step, workflow


@step(name="subtotal")
def subtotal(items):
    return sum(items)


@workflow(name="invoice")
async def invoice(ctx, params):
    amount = await subtotal(params["items"])
    await ctx.wait_for_signal("approved")
    return {"total": amount, "version": 1}
'''

V2 = '''
from pyrula.workflows import step, workflow


@step(name="subtotal")
def subtotal(items):
    return sum(items)


@step(name="fee")
def fee(amount):
    return 1


@workflow(name="invoice")
async def invoice(ctx, params):
    amount = await subtotal(params["items"])
    extra = await fee(amount) if ctx.patched("add-fee") else 0
    await ctx.wait_for_signal("approved")
    return {"total": amount + extra, "version": 2}
'''


class Deploy:
    """One directory, one SQLite store, and the worker serving the app's current code."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.url = f"sqlite:///{directory / 'store.db'}"
        self.store = SQLiteStore(str(directory / "store.db"))
        self.client = SyncWorkflowClient(self.store)
        self.workers: list[WorkerProcess] = []

    def start(self, code: str, name: str) -> None:
        (self.directory / "patchapp.py").write_text(textwrap.dedent(code))
        worker = WorkerProcess(self.directory, name, [
            "worker", "--app", "patchapp", "--store", self.url, "--no-cloud",
            "--claim-poll-interval", "0.1",
        ], child_env(PYTHONDONTWRITEBYTECODE="1"))  # no stale bytecode of the other version
        self.workers.append(worker)
        worker.wait_for_log("worker_started", timeout=30)

    def stop(self) -> None:
        worker = self.workers[-1]
        worker.send(signal.SIGTERM)
        assert worker.wait() == 0, worker.log()

    def parked(self, run_id: str) -> None:
        wait_until(lambda: self.client.get(run_id).status is RunStatus.WAITING, 20,
                   what=f"run {run_id} waiting for its approval")

    def approve(self, run_id: str) -> Any:
        self.client.signal(run_id, "approved", True)
        return self.client.result(run_id, timeout=20)


@pytest.fixture
def deploy(tmp_path: Path) -> Iterator[Deploy]:
    d = Deploy(tmp_path)
    try:
        yield d
    finally:
        for worker in d.workers:
            worker.reap()
        d.store.close()


def test_a_run_parked_on_v1_keeps_to_the_old_branch_on_v2(deploy: Deploy) -> None:
    deploy.start(V1, "worker-v1")
    old = deploy.client.submit("invoice", {"items": [2, 3]}).run_id
    deploy.parked(old)
    deploy.stop()

    deploy.start(V2, "worker-v2")
    new = deploy.client.submit("invoice", {"items": [2, 3]}).run_id
    deploy.parked(new)
    assert deploy.approve(old) == {"total": 5, "version": 2}
    assert deploy.approve(new) == {"total": 6, "version": 2}

    def steps_and_markers(run_id: str) -> list[str]:
        return [e.get("step") or e["patch"] for e in deploy.client.events(run_id)
                if e["type"] in ("step:completed", "patch:applied")]

    assert steps_and_markers(old) == ["subtotal"]
    assert steps_and_markers(new) == ["subtotal", "add-fee", "fee"]
