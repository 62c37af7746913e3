"""Limit and Rate: bad arguments are refused at decoration naming the argument; the
client computes a run's keys at submit when it has the definition, and a key function
that fails fails the submit, writing nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pyrula.workflows import Limit, MemoryStore, Rate, WorkflowClient, workflow
from pyrula.workflows.context import WorkflowContext
from pyrula.workflows.definition import REGISTRY
from pyrula.workflows.limits import LimitKeyFailed, LimitKeys, WorkflowLimits


def _account(params: Any) -> Any:
    return params["account"]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", None])
def test_a_bad_max_is_refused_naming_it(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"max"):
        Limit(key=_account, max=bad)


@pytest.mark.parametrize("bad", [0, -0.5, True, "2", None])
def test_a_bad_per_second_is_refused_naming_it(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"per_second"):
        Rate(key=_account, per_second=bad)


@pytest.mark.parametrize("cls, kwargs", [(Limit, {"max": 1}), (Rate, {"per_second": 1})])
def test_a_key_that_is_not_callable_is_refused(cls: Any, kwargs: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match=r"key"):
        cls(key="account", **kwargs)


def test_workflow_refuses_what_is_not_a_limit_or_rate() -> None:
    with pytest.raises(TypeError, match="concurrency"):
        workflow(name="limits.bad1", concurrency=3)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="rate"):
        workflow(name="limits.bad2", rate=Limit(key=_account, max=1))  # type: ignore[call-overload]


@pytest.fixture
def limited() -> Iterator[Any]:
    """A limited workflow in the global registry (where the client looks), for this test
    only: a worker serving every imported workflow elsewhere must not meet it."""

    @workflow(name="limits.unit", concurrency=Limit(key=_account, max=2),
              rate=Rate(key=lambda p: p["region"], per_second=5))
    async def flow(ctx: WorkflowContext, params: Any) -> None:
        return None

    try:
        yield flow
    finally:
        REGISTRY._workflows.pop("limits.unit", None)


def test_the_spec_carries_its_limits_and_keys(limited: Any) -> None:
    spec = limited.__pyrula_workflow__  # type: ignore[attr-defined]
    assert spec.limits == WorkflowLimits(max=2, per_second=5.0)
    assert spec.limit_keys({"account": 7, "region": "eu"}) == LimitKeys("7", "eu")


async def test_submit_computes_the_keys_where_the_definition_is_imported(limited: Any) -> None:
    store = MemoryStore()
    store.use_limits({"limits.unit": WorkflowLimits(max=2, per_second=5.0)})
    handle = await WorkflowClient(store).submit(limited, {"account": "a", "region": "eu"})
    [claimed] = await store.claim("w", ["limits.unit"], limit=5, now=1e9, lock_ttl=30)
    assert claimed.run_id == handle.run_id
    assert claimed.limit_keys == LimitKeys("a", "eu")


@pytest.mark.parametrize("params", [{}, {"account": None, "region": "eu"},
                                    {"account": "x" * 501, "region": "eu"}])
async def test_a_failing_key_fails_the_submit_and_writes_nothing(
    params: Any, limited: Any
) -> None:
    store = MemoryStore()
    with pytest.raises(LimitKeyFailed, match="limits.unit"):
        await WorkflowClient(store).submit(limited, params)
    assert await store.list_runs() == []
