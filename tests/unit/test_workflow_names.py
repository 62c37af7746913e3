"""What a workflow name may hold, checked where a name enters: ``@workflow`` and submit."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given

from pyrula.workflows import MemoryStore, WorkflowClient, WorkflowContext, workflow
from pyrula.workflows.definition import (
    MAX_NAME_LENGTH,
    REGISTRY,
    check_workflow_name,
    unknown_name,
)
from tests.generative.strategies import names


@given(names)
def test_every_drawn_name_is_accepted(name: str) -> None:
    assert check_workflow_name(name) == name


@pytest.mark.parametrize("bad, why", [
    ("", "non-empty"),
    ("a\nb", "control characters"),
    ("tab\there", "control characters"),
    ("nul\x00", "control characters"),
    ("half\ud800", "surrogates"),
    ("x" * (MAX_NAME_LENGTH + 1), f"limit of {MAX_NAME_LENGTH}"),
])
def test_a_bad_name_is_refused_at_the_decorator_and_at_submit(bad: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        workflow(name=bad)(_body)  # type: ignore[call-overload]
    if isinstance(bad, str):
        client = WorkflowClient(MemoryStore())
        with pytest.raises(ValueError, match=why):
            asyncio.run(client.submit(bad, {}))


@pytest.mark.parametrize("bad", [None, 7, b"bytes"])
def test_a_name_must_be_a_str(bad: object) -> None:
    with pytest.raises(ValueError, match="non-empty str"):
        check_workflow_name(bad)


def test_a_refused_name_registers_nothing() -> None:
    with pytest.raises(ValueError):
        workflow(name="bad\nname")(_body)
    assert "bad\nname" not in REGISTRY.workflows()


async def _body(ctx: WorkflowContext, params: object) -> None:
    return None


@pytest.mark.parametrize("name, served, says", [
    ("fetch_thnig", ["fetch_thing", "other"], "did you mean 'fetch_thing'?"),
    ("zzz", ["fetch_thing", "other"], "workers have served 'fetch_thing', 'other'"),
    ("fetch_thing", ["fetch_thing"], None),
    ("anything", [], None),  # no worker yet: nothing to check against
])
def test_an_unknown_name_is_named_with_the_closest_served_ones(
        name: str, served: list[str], says: str | None) -> None:
    found = unknown_name(name, served)
    if says is None:
        assert found is None
    else:
        assert found is not None and says in found and repr(name) in found


async def test_submit_without_params_stores_an_empty_object() -> None:
    store = MemoryStore()
    client = WorkflowClient(store)
    for handle in (await client.submit("anything"), await client.submit("anything", None)):
        assert (await client.get(handle.run_id)).params == {}
    kept = await client.submit("anything", [])
    assert (await client.get(kept.run_id)).params == []
