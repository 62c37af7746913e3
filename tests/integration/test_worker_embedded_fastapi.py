"""The "Embedding a worker in your own app" snippet of the Deployment Modes page, run.

The app module is the page's code with ``SQLiteStore`` in place of ``ValkeyStore``, plus
one line that keeps the worker on ``app.state`` and a route that submits through
``worker.client``. FastAPI's TestClient drives the lifespan: entering starts the worker,
leaving stops it.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import RunStatus, SQLiteStore, SyncWorkflowClient
from tests.conftest import wait_until

with warnings.catch_warnings():
    # Starlette 1.x prefers the httpx2 package and warns when it falls back to httpx,
    # which is what the dev extras install; the fallback works the same.
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

WORKFLOWS = textwrap.dedent(
    '''
    import os

    from pyrula.workflows import WorkflowContext, step, workflow


    @step
    async def shout(who: str) -> str:
        return who.upper()


    @step
    def sign(text: str) -> str:  # a sync step: runs on the worker's thread pool
        return f"{text} (from pid {os.getpid()})"


    @workflow(name="embedded_greet")
    async def greet(ctx: WorkflowContext, params: dict) -> str:
        return await sign("hello " + await shout(params["who"]))
    '''
)

APP = textwrap.dedent(
    '''
    import asyncio
    from contextlib import asynccontextmanager
    from pathlib import Path

    from fastapi import FastAPI
    from pyrula.workflows import SQLiteStore, WorkflowWorker

    # Import @workflow modules before constructing the worker; it snapshots the registry.
    import embedded_workflows  # noqa: F401

    STORE_PATH = Path(__file__).with_name("embedded.db")


    @asynccontextmanager
    async def lifespan(app: FastAPI):
        worker = WorkflowWorker(store=SQLiteStore(STORE_PATH))
        app.state.worker = worker  # added: lets a route reach worker.client
        task = asyncio.create_task(worker.run())
        try:
            yield
        finally:
            worker.stop()
            await asyncio.gather(task, return_exceptions=True)


    app = FastAPI(lifespan=lifespan)


    @app.post("/greet/{who}")
    async def greet(who: str) -> dict:
        worker = app.state.worker
        run = await worker.client.submit("embedded_greet", {"who": who})
        result = await worker.client.result(run.run_id, timeout=10)
        return {"run_id": run.run_id, "result": result}
    '''
)


@pytest.fixture
def embedded_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    (tmp_path / "embedded_workflows.py").write_text(WORKFLOWS)
    (tmp_path / "embedded_app.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("embedded_app", "embedded_workflows"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module("embedded_app")
    try:
        yield module
    finally:
        worker = getattr(module.app.state, "worker", None)
        if worker is not None:
            worker.store.close()
        for name in ("embedded_app", "embedded_workflows"):
            sys.modules.pop(name, None)


def test_the_embedded_worker_serves_runs_submitted_from_a_route(embedded_app: Any) -> None:
    with TestClient(embedded_app.app) as http:
        worker = embedded_app.app.state.worker
        # run() is a task the lifespan started: the worker becomes ready on its own.
        wait_until(lambda: worker.state == "ready", what="the embedded worker to be ready")
        assert "embedded_greet" in worker.workflow_names
        response = http.post("/greet/ada")
        assert response.status_code == 200
        body = response.json()
        assert body["result"].startswith("hello ADA (from pid ")
        assert worker.state == "ready"
    # Leaving the lifespan stopped the worker, and the run is in the store.
    assert worker.state == "stopped"
    assert worker.in_flight == 0
    store = SQLiteStore(embedded_app.STORE_PATH)
    try:
        info = SyncWorkflowClient(store).get(body["run_id"])
        assert info.status == RunStatus.COMPLETED and info.result == body["result"]
    finally:
        store.close()
