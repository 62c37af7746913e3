"""Store contract: submit, idempotency keys, params, and what the store answers for unknown ids."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pyrula.workflows.errors import WorkflowNotFound
from pyrula.workflows.events import EventType
from pyrula.workflows.records import RunStatus
from pyrula.workflows.stores.base import Store
from tests.conformance.support import T0, WF, complete, info, journal, submit, take


def test_the_store_implements_the_protocol(store: Store) -> None:
    assert isinstance(store, Store)


async def test_ping_answers(store: Store) -> None:
    store.ping()
    await store.aping()


async def test_bind_records_project_and_environment_once(store: Store) -> None:
    assert await store.bind(None, None) == (None, None)  # None records nothing
    assert await store.bind("shop", None) == ("shop", None)
    assert await store.bind("other", "prod") == ("shop", "prod")  # the first value stays
    assert await store.bind(None, "staging") == ("shop", "prod")
    assert await store.bind(None, None) == ("shop", "prod")


async def test_submit_creates_a_queued_run_with_a_submitted_event(store: Store) -> None:
    handle, created = await store.submit(WF, {"order": 1}, now=T0, owner="tenant-1")

    assert created is True
    assert handle.name == WF
    assert isinstance(handle.run_id, str) and handle.run_id
    run = await info(store, handle.run_id)
    assert isinstance(run.status, RunStatus)
    assert run.status == RunStatus.QUEUED
    assert (run.run_id, run.name, run.params, run.owner) == (
        handle.run_id, WF, {"order": 1}, "tenant-1"
    )
    assert run.attempt == 0
    assert run.created_at == T0
    assert run.started_at is None and run.finished_at is None
    assert run.result is None and run.error is None
    assert run.start_id == handle.run_id
    assert run.successor_id is None
    events = await journal(store, handle.run_id)
    assert len(events) == 1
    assert events[0]["seq"] == 1
    assert events[0]["type"] == EventType.RUN_SUBMITTED
    assert events[0]["ts"] == T0


async def test_a_run_without_owner_reports_owner_none(store: Store) -> None:
    run_id = await submit(store)
    assert (await info(store, run_id)).owner is None


async def test_run_ids_are_unique(store: Store) -> None:
    ids = {await submit(store, now=T0) for _ in range(20)}
    assert len(ids) == 20


async def test_same_name_and_key_returns_the_first_run(store: Store) -> None:
    first, created = await store.submit(WF, {"v": 1}, now=T0, idempotency_key="order-1")
    again, created_again = await store.submit(
        WF, {"v": 2}, now=T0 + 5, owner="someone", idempotency_key="order-1"
    )

    assert created is True and created_again is False
    assert again == first
    run = await info(store, first.run_id)
    assert run.params == {"v": 1}
    assert run.idempotency_key == "order-1"
    assert [r.run_id for r in await store.list_runs(name=WF)] == [first.run_id]
    assert len(await journal(store, first.run_id)) == 1


async def test_same_key_under_another_name_is_another_run(store: Store) -> None:
    a, created_a = await store.submit("wf.a", None, now=T0, idempotency_key="k")
    b, created_b = await store.submit("wf.b", None, now=T0, idempotency_key="k")

    assert created_a and created_b
    assert a.run_id != b.run_id
    assert (a.name, b.name) == ("wf.a", "wf.b")


async def test_without_a_key_every_submit_is_a_new_run(store: Store) -> None:
    a, created_a = await store.submit(WF, {"same": True}, now=T0)
    b, created_b = await store.submit(WF, {"same": True}, now=T0)
    assert created_a and created_b
    assert a.run_id != b.run_id


async def test_the_key_still_answers_once_the_first_run_has_ended(store: Store) -> None:
    run_id = await submit(store, key="k-ended")
    claimed = await take(store, run_id)
    await complete(store, run_id, claimed.token, "done")

    handle, created = await store.submit(WF, None, now=T0 + 1, idempotency_key="k-ended")
    assert created is False
    assert handle.run_id == run_id


async def test_concurrent_submits_with_one_key_create_one_run(store: Store) -> None:
    answers = await asyncio.gather(
        *(store.submit(WF, {"i": i}, now=T0, idempotency_key="race") for i in range(16))
    )

    assert {handle.run_id for handle, _ in answers} == {answers[0][0].run_id}
    assert sum(created for _, created in answers) == 1
    assert len(await store.list_runs(name=WF)) == 1


PARAMS: list[Any] = [
    None,
    0,
    -7,
    2.5,
    True,
    "plain",
    "ünïcødé ✓ 雪",
    [],
    {},
    [1, "two", 3.25, None, False, {"nested": [1, 2]}],
    {"order_id": "o-1", "lines": [{"sku": "a", "qty": 2}], "meta": {"rush": None}},
]


@pytest.mark.parametrize("params", PARAMS, ids=[repr(p)[:20] for p in PARAMS])
async def test_params_round_trip(store: Store, params: Any) -> None:
    run_id = await submit(store, params=params)

    assert (await info(store, run_id)).params == params
    assert (await take(store, run_id)).params == params


async def test_stored_values_are_copies_of_the_callers_objects(store: Store) -> None:
    """Mutating what was passed in, or what came back, never changes the stored run.

    (A workflow body that mutates its params or a step result must replay the same.)
    """
    params = {"items": [1, 2]}
    run_id = await submit(store, params=params)
    params["items"].append(3)

    claimed = await take(store, run_id)
    claimed.params["items"].append(4)
    (await info(store, run_id)).params["items"].append(5)
    result = {"total": [10]}
    await complete(store, run_id, claimed.token, result, now=T0 + 1)
    result["total"].append(11)
    (await journal(store, run_id))[-1]["result"]["total"].append(12)

    run = await info(store, run_id)
    assert run.params == {"items": [1, 2]}
    assert run.result == {"total": [10]}
    events = await journal(store, run_id)
    assert events[-1]["result"] == {"total": [10]}


async def test_unknown_run_ids(store: Store) -> None:
    missing = "0" * 32
    assert await store.get_run(missing) is None
    with pytest.raises(WorkflowNotFound):
        await store.read_events(missing)
    with pytest.raises(WorkflowNotFound):
        await store.wait_result(missing, timeout=1.0)
    assert await store.claim_run(missing, "w", now=T0, lock_ttl=10.0) is None
