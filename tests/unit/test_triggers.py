"""BatchTrigger and emit as a user calls them: arguments checked at the decorator and at
the call, with messages naming what is wrong; the sync client emits as the async one."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from pyrula.workflows import (
    BatchTrigger,
    MemoryStore,
    PayloadTooLarge,
    SyncWorkflowClient,
    WorkflowClient,
    WorkflowContext,
    workflow,
)
from pyrula.workflows.definition import WorkflowSpec
from pyrula.workflows.triggers import batch_due, batch_params, event_item


def test_a_trigger_keeps_its_arguments() -> None:
    trigger = BatchTrigger("orders", max_size=3, max_wait=2)
    assert (trigger.topic, trigger.max_size, trigger.max_wait) == ("orders", 3, 2.0)
    assert BatchTrigger("orders") == BatchTrigger("orders", max_size=100, max_wait=5.0)


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"topic": ""}, "a topic must be a non-empty str"),
    ({"topic": 7}, "a topic must be a non-empty str"),
    ({"topic": "a\nb"}, "control characters"),
    ({"topic": "t" * 201}, "above the limit of 200"),
    ({"topic": "t", "max_size": 0}, "max_size must be an int >= 1"),
    ({"topic": "t", "max_size": True}, "max_size must be an int >= 1"),
    ({"topic": "t", "max_size": 2.5}, "max_size must be an int >= 1"),
    ({"topic": "t", "max_wait": 0}, "max_wait must be a number of seconds > 0"),
    ({"topic": "t", "max_wait": -1.0}, "max_wait must be a number of seconds > 0"),
    ({"topic": "t", "max_wait": math.inf}, "max_wait must be a number of seconds > 0"),
    ({"topic": "t", "max_wait": math.nan}, "max_wait must be a number of seconds > 0"),
    ({"topic": "t", "max_wait": "5"}, "max_wait must be a number of seconds > 0"),
])
def test_bad_trigger_arguments_are_refused_naming_them(kwargs: dict[str, Any],
                                                       says: str) -> None:
    with pytest.raises(ValueError, match=says):
        BatchTrigger(**kwargs)


def test_the_workflow_decorator_records_its_trigger_and_refuses_anything_else() -> None:
    trigger = BatchTrigger("unit.topic", max_size=2)

    @workflow(name="unit.triggered", trigger=trigger)
    async def triggered(ctx: WorkflowContext, params: Any) -> Any:
        return params

    spec: WorkflowSpec = triggered.__pyrula_workflow__  # type: ignore[attr-defined]
    assert spec.trigger == trigger
    with pytest.raises(TypeError, match="trigger must be a BatchTrigger or None, got str"):
        workflow(name="unit.bad", trigger="unit.topic")  # type: ignore[arg-type]


@pytest.mark.parametrize(("call", "error", "says"), [
    ({"topic": ""}, ValueError, "a topic must be a non-empty str"),
    ({"payload": {1, 2}}, ValueError, "payload of the event on topic 't' is"),
    ({"payload": math.nan}, ValueError, "payload of the event on topic 't'"),
    ({"key": ""}, ValueError, "key must be a non-empty str or None"),
    ({"owner": 5}, ValueError, "owner must be a non-empty str or None"),
    ({"payload": "x" * 200}, PayloadTooLarge, "above max_payload_bytes \\(100\\)"),
])
def test_bad_emits_are_refused_naming_what_is_wrong(call: dict[str, Any], error: type,
                                                    says: str) -> None:
    client = WorkflowClient(MemoryStore(), max_payload_bytes=100)
    args = {"topic": "t", "payload": 1, **call}
    with pytest.raises(error, match=says):
        asyncio.run(client.emit(args.pop("topic"), args.pop("payload"), **args))


def test_the_sync_client_emits_once_per_key() -> None:
    client = SyncWorkflowClient(MemoryStore())
    first = client.emit("t", {"n": 1}, key="k")
    assert client.emit("t", {"n": 2}, key="k") == first
    assert client.emit("t", None) != first


def test_a_batch_is_due_by_size_or_by_its_oldest_wait() -> None:
    due = {"max_size": 3, "max_wait": 5.0, "now": 100.0}
    assert not batch_due(0, None, **due)
    assert not batch_due(2, 96.0, **due)
    assert batch_due(3, 99.0, **due)
    assert batch_due(1, 95.0, **due)


def test_a_batch_runs_params_name_each_event_with_its_iso_time() -> None:
    item = event_item("e1", None, {"x": 1}, 1_800_000_000.25)
    assert batch_params("t", [item]) == {"topic": "t", "events": [
        {"id": "e1", "key": None, "payload": {"x": 1}, "emitted_at": "2027-01-15T08:00:00.250Z"}
    ]}
