"""The memory store's own parts: its synchronous path and the facade over its components."""

from __future__ import annotations

from typing import Any

import pytest

from pyrula.workflows import MemoryStore, SyncWorkflowClient
from pyrula.workflows.errors import WorkflowNotFound
from pyrula.workflows.records import RunInfo
from pyrula.workflows.stores import admin
from pyrula.workflows.stores.memory.queue import MemoryQueue
from pyrula.workflows.stores.memory.store import _Via

WF = "memory.wf"


def _no_background_loop(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a synchronous call went to the background event loop")


def test_admin_twins_run_on_the_calling_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admin, "run_sync", _no_background_loop)
    store = MemoryStore()

    store.ping()
    store.flow_control_set("tenant", max_concurrent=2)

    flow = store.flow_control_get("tenant")
    assert flow is not None and flow.max_concurrent == 2
    assert store.flow_control_delete("tenant") is True
    assert store.schedule_list() == []
    assert store.recover_pending_runs(WF) == 0


def test_a_synchronous_wait_on_a_run_that_does_not_end_times_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(admin, "run_sync", _no_background_loop)  # run_for decides
    client = SyncWorkflowClient(MemoryStore())
    run = client.submit(WF)

    with pytest.raises(TimeoutError, match=run.run_id):
        client.result(run.run_id, timeout=0.05)


def test_a_synchronous_wait_on_an_unknown_run_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admin, "run_sync", _no_background_loop)  # run_for decides
    with pytest.raises(WorkflowNotFound):
        SyncWorkflowClient(MemoryStore()).result("no-such-run", timeout=1.0)


async def test_a_subclass_overrides_a_forwarded_method() -> None:
    class Counting(MemoryStore):
        reads = 0

        async def get_run(self, run_id: str) -> RunInfo | None:
            self.reads += 1
            return await super().get_run(run_id)

    store = Counting()
    handle, _ = await store.submit(WF, None, now=1.0)

    info = await store.get_run(handle.run_id)
    assert info is not None and info.run_id == handle.run_id
    assert store.reads == 1


def test_a_method_forwarded_under_another_name_is_refused() -> None:
    with pytest.raises((TypeError, RuntimeError)) as raised:

        class Wrong:
            claim = _Via("_queue", MemoryQueue.submit)

    # Python 3.11 wraps an error raised by __set_name__ in a RuntimeError.
    error = raised.value if isinstance(raised.value, TypeError) else raised.value.__cause__
    assert "Wrong.claim would answer with submit" in str(error)
