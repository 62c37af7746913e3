"""Queued runs of a name no live worker serves: "wait" logs run_stranded once, "fail" ends
them with run:error code stranded after stranded_timeout."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from pyrula.workflows import (
    WorkerOptions,
    WorkflowClient,
    WorkflowContext,
    WorkflowWorker,
    workflow,
)
from tests.conftest import await_until


@workflow(name="stranded.served")
async def served(ctx: WorkflowContext, params: Any) -> str:
    return "ok"


def _options(**extra: Any) -> WorkerOptions:
    return WorkerOptions(claim_poll_interval=0.01, orphan_scan_interval=0.05, **extra)


async def test_wait_logs_run_stranded_once_and_keeps_the_run(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    client = WorkflowClient(store)
    orphan = await client.submit("stranded.nobody_serves_this", {})
    worker = WorkflowWorker(store=store, workflows=[served], options=_options())
    task = asyncio.create_task(worker.run())
    done = await client.submit(served, {})
    assert await client.result(done.run_id, timeout=10) == "ok"

    def stranded_logs() -> list[logging.LogRecord]:
        return [r for r in caplog.records if getattr(r, "event", None) == "run_stranded"]

    await await_until(stranded_logs, what="run_stranded")
    await await_until(lambda: worker._loops["orphan"].last_ok is not None)
    ticks = worker._loops["orphan"].last_ok
    await await_until(lambda: worker._loops["orphan"].last_ok != ticks, what="another scan")
    worker.stop()
    await task
    assert len(stranded_logs()) == 1
    assert "stranded.nobody_serves_this" in stranded_logs()[0].getMessage()
    assert (await client.get(orphan.run_id)).status == "queued"


async def test_fail_ends_runs_queued_past_the_timeout(store: Any) -> None:
    client = WorkflowClient(store)
    orphan = await client.submit("stranded.nobody_serves_that", {})
    worker = WorkflowWorker(store=store, workflows=[served],
                            options=_options(stranded_policy="fail", stranded_timeout=0.01))
    task = asyncio.create_task(worker.run())
    try:
        info = await await_until(
            lambda: _ended(client, orphan.run_id), what="the stranded run to fail"
        )
    finally:
        worker.stop()
        await task
    assert info.status == "failed"
    assert info.error["code"] == "stranded"
    events = await client.events(orphan.run_id)
    assert events[-1]["type"] == "run:error" and events[-1]["code"] == "stranded"


async def _ended(client: WorkflowClient, run_id: str) -> Any:
    info = await client.get(run_id)
    return info if info.status.terminal else None


async def test_a_name_some_live_worker_serves_is_not_stranded(store: Any) -> None:
    client = WorkflowClient(store)
    await store.register_worker("other-host", ["stranded.elsewhere"], now=0.0, ttl=1e12)
    queued = await client.submit("stranded.elsewhere", {})
    worker = WorkflowWorker(store=store, workflows=[served],
                            options=_options(stranded_policy="fail", stranded_timeout=0.01))
    task = asyncio.create_task(worker.run())
    await await_until(lambda: worker._loops.get("orphan") and worker._loops["orphan"].last_ok)
    ticks = worker._loops["orphan"].last_ok
    await await_until(lambda: worker._loops["orphan"].last_ok != ticks, what="another scan")
    worker.stop()
    await task
    assert (await client.get(queued.run_id)).status == "queued"
