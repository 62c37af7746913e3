"""Which live workers serve which names, and stranded runs of names nobody serves."""

from __future__ import annotations

from pyrula.workflows.records import RunStatus
from pyrula.workflows.stores.base import Store
from tests.conformance.support import T0, WF, submit

ERROR = {"code": "stranded", "error_type": "Stranded", "message": "nobody serves it",
         "detail": {"stranded_timeout": 5.0}}


async def test_a_queued_name_no_live_worker_serves_is_stranded(store: Store) -> None:
    await submit(store, now=T0)
    assert await store.stranded(now=T0 + 1) == [WF]
    await store.register_worker("w1", [WF], now=T0 + 1, ttl=10.0)
    assert await store.stranded(now=T0 + 2) == []
    # The registration lapses without renewal...
    assert await store.stranded(now=T0 + 12) == [WF]
    # ...and is dropped at once by unregister.
    await store.register_worker("w1", [WF], now=T0 + 12, ttl=10.0)
    await store.unregister_worker("w1")
    assert await store.stranded(now=T0 + 13) == [WF]


async def test_a_name_with_nothing_queued_is_not_stranded(store: Store) -> None:
    assert await store.stranded(now=T0) == []


async def test_fail_stranded_ends_only_runs_queued_long_enough(store: Store) -> None:
    old = await submit(store, now=T0)
    new = await submit(store, now=T0 + 100)

    failed = await store.fail_stranded(WF, older_than=T0 + 50, now=T0 + 101, limit=10,
                                       error=ERROR)

    assert failed == [old]
    info = await store.get_run(old)
    assert info is not None and info.status == RunStatus.FAILED
    assert info.error is not None and info.error["code"] == "stranded"
    events = await store.read_events(old)
    assert events[-1]["type"] == "run:error" and events[-1]["code"] == "stranded"
    still = await store.get_run(new)
    assert still is not None and still.status == RunStatus.QUEUED
    assert await store.wait_result(old, timeout=1.0) == info


async def test_served_names_are_every_name_a_worker_ever_served(store: Store) -> None:
    assert await store.served_names() == []
    await submit(store, "never.served", now=T0)  # a submit does not make a name served
    await store.register_worker("w1", ["b.two", "a.one"], now=T0, ttl=10.0)
    await store.register_worker("w2", ["c:three ü"], now=T0, ttl=10.0)
    await store.unregister_worker("w1")  # gone, but its names were served
    assert await store.served_names() == ["a.one", "b.two", "c:three ü"]
