"""A run that fails is a warning in the worker's log, with the frame it failed in: the
default level of ``make run`` (WARNING) shows every failure and where it happened."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from pyrula.workflows import WorkflowContext, WorkflowWorker, step, workflow
from tests.conftest import await_until
from tests.unit.worker.worker_support import fast_options, serving


@step(name="wfail.charge")
def charge(amount: int) -> int:
    if amount < 0:
        raise ValueError(f"cannot charge {amount}")
    return amount


@workflow(name="wfail.order")
async def order(ctx: WorkflowContext, params: Any) -> Any:
    return await charge(params["amount"])


@workflow(name="wfail.body")
async def body(ctx: WorkflowContext, params: Any) -> Any:
    return {}["missing"]


@pytest.mark.parametrize("name, params, says, frame", [
    ("wfail.order", {"amount": -3}, "cannot charge -3", "in charge"),
    ("wfail.body", {}, "KeyError", "in body"),
])
async def test_a_failed_run_is_a_warning_with_its_failing_frame(
    store: Any, caplog: pytest.LogCaptureFixture, name: str, params: Any, says: str,
    frame: str,
) -> None:
    caplog.set_level(logging.WARNING, logger="pyrula")
    worker = WorkflowWorker(store=store, workflows=[order, body], options=fast_options())
    async with serving(worker):
        run = await worker.client.submit(name, params)
        await await_until(lambda: _ended(worker, run.run_id), what="the run failed")
    [record] = [r for r in caplog.records if getattr(r, "event", None) == "run_failed"]
    assert record.levelno == logging.WARNING
    text = record.getMessage()
    assert text.startswith(f"run_failed: run {run.run_id} of {name} failed"), text
    assert says in text and "test_worker_failures_logged.py:" in text and frame in text, text


async def _ended(worker: WorkflowWorker, run_id: str) -> bool:
    return (await worker.client.get(run_id)).status.value == "failed"
