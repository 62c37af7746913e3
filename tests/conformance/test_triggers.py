"""Store contract: events and batch triggers (the Triggers capability).

``emit`` is idempotent by key within a topic; ``take_batches`` starts one run per due
batch (``max_size`` events of one owner, or the oldest waited ``max_wait``), the batch's
events in emit order in its params; an event lands in exactly one run of each workflow
triggered by its topic, whoever takes and however many take at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pyrula.timestamps import iso_utc
from pyrula.workflows.records import RunStatus
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.capabilities import Triggers, capabilities_of
from tests.conformance.support import T0, WF, info
from tests.generative.harness import other_store

TOPIC = "orders.created"
#: A wait no test reaches unless it means to.
LONG = 3600.0


def triggers(store: Store) -> Triggers:
    found = capabilities_of(store).triggers
    assert found is not None, f"{store!r} lacks the Triggers capability"
    return found


async def emit(store: Store, payload: Any, *, now: float = T0, key: str | None = None,
               owner: str | None = None, topic: str = TOPIC) -> str:
    event_id, created = await triggers(store).emit(topic, payload, now=now, key=key,
                                                   owner=owner)
    assert created
    return event_id


async def take(store: Store, *, max_size: int = 10, max_wait: float = LONG,
               now: float = T0, limit: int = 100, name: str = WF,
               topic: str = TOPIC) -> list[str]:
    handles = await triggers(store).take_batches(name, topic, max_size=max_size,
                                                 max_wait=max_wait, now=now, limit=limit)
    assert all(h.name == name for h in handles)
    return [h.run_id for h in handles]


async def event_ids(store: Store, run_id: str) -> list[str]:
    return [e["id"] for e in (await info(store, run_id)).params["events"]]


async def test_every_store_keeps_events(store: Store) -> None:
    assert capabilities_of(store).triggers is not None


async def test_an_emit_key_is_one_event_per_topic(store: Store) -> None:
    t = triggers(store)
    first, created = await t.emit(TOPIC, {"n": 1}, now=T0, key="k-1")
    again, created_again = await t.emit(TOPIC, {"n": 2}, now=T0 + 1, key="k-1")
    other, created_other = await t.emit("other.topic", {"n": 3}, now=T0, key="k-1")
    assert (created, created_again, created_other) == (True, False, True)
    assert again == first and other != first
    await take(store)  # subscribe: the one event is pending, once
    [run_id] = await take(store, max_wait=1.0, now=T0 + 1)
    run = await info(store, run_id)
    assert run.params == {"topic": TOPIC, "events": [
        {"id": first, "key": "k-1", "payload": {"n": 1}, "emitted_at": iso_utc(T0)}]}


async def test_a_full_batch_starts_a_run_with_the_events_in_emit_order(store: Store) -> None:
    ids = [await emit(store, {"i": i}, now=T0 + i / 4) for i in range(5)]
    runs = await take(store, max_size=2, now=T0 + 2)
    assert len(runs) == 2  # two full batches; the fifth event waits for company
    assert [await event_ids(store, r) for r in runs] == [ids[0:2], ids[2:4]]
    run = await info(store, runs[0])
    assert run.status is RunStatus.QUEUED and run.name == WF and run.owner is None
    assert run.params["topic"] == TOPIC
    assert [e["payload"] for e in run.params["events"]] == [{"i": 0}, {"i": 1}]
    assert [e["emitted_at"] for e in run.params["events"]] == [iso_utc(T0), iso_utc(T0 + 0.25)]
    assert run.idempotency_key == f"trigger:{TOPIC}:{ids[0]}"
    assert await take(store, max_size=2, now=T0 + 3) == []
    [last] = await take(store, max_size=2, max_wait=10.0, now=T0 + 1 + 10.0)
    assert await event_ids(store, last) == [ids[4]]


async def test_a_batch_waits_max_wait_from_its_oldest_event(store: Store) -> None:
    first = await emit(store, "a", now=T0)
    second = await emit(store, "b", now=T0 + 3)
    assert await take(store, max_wait=5.0, now=T0 + 4.5) == []
    [run_id] = await take(store, max_wait=5.0, now=T0 + 5.0)
    assert await event_ids(store, run_id) == [first, second]
    assert await take(store, max_wait=5.0, now=T0 + 60) == []


async def test_one_take_starts_several_batches_up_to_its_limit(store: Store) -> None:
    ids = [await emit(store, i) for i in range(7)]
    first = await take(store, max_size=2, limit=2)
    rest = await take(store, max_size=2, max_wait=1.0, now=T0 + 1)
    assert [await event_ids(store, r) for r in first + rest] == [
        ids[0:2], ids[2:4], ids[4:6], ids[6:7]]


async def test_owners_batch_apart_and_own_their_runs(store: Store) -> None:
    a1 = await emit(store, 1, owner="tenant-a")
    b1 = await emit(store, 2, owner="tenant-b")
    a2 = await emit(store, 3, owner="tenant-a")
    [run_a] = await take(store, max_size=2)
    assert (await info(store, run_a)).owner == "tenant-a"
    assert await event_ids(store, run_a) == [a1, a2]
    [run_b] = await take(store, max_size=2, max_wait=1.0, now=T0 + 1)
    assert (await info(store, run_b)).owner == "tenant-b"
    assert await event_ids(store, run_b) == [b1]


async def test_events_wait_for_their_first_subscription(store: Store) -> None:
    early = [await emit(store, i) for i in range(3)]
    [run_id] = await take(store, max_size=3)  # the first workflow triggered by the topic
    assert await event_ids(store, run_id) == early


async def test_each_workflow_triggered_by_a_topic_gets_each_later_event(store: Store) -> None:
    await take(store, name="wf.a")
    await take(store, name="wf.b")
    ids = [await emit(store, i) for i in range(2)]
    [run_a] = await take(store, name="wf.a", max_size=2)
    [run_b] = await take(store, name="wf.b", max_size=2)
    assert await event_ids(store, run_a) == await event_ids(store, run_b) == ids
    assert (await info(store, run_b)).name == "wf.b"


async def test_a_topic_without_a_subscription_keeps_its_events_pending(store: Store) -> None:
    await emit(store, 1, topic="nobody.listens")
    assert await take(store, max_wait=1.0, now=T0 + 10) == []  # another topic
    [run_id] = await take(store, topic="nobody.listens", max_wait=1.0, now=T0 + 10)
    assert (await info(store, run_id)).params["topic"] == "nobody.listens"


async def test_payloads_keep_their_json_exactly(store: Store) -> None:
    payload = {"big": 2**53 + 1, "f": 0.1, "empty": [], "obj": {}, "s": "é\n\"/"}
    event_id = await emit(store, payload)
    [run_id] = await take(store, max_size=1)
    assert (await info(store, run_id)).params["events"][0] == {
        "id": event_id, "key": None, "payload": payload, "emitted_at": iso_utc(T0)}


async def test_concurrent_takers_put_each_event_in_exactly_one_run(store: Store) -> None:
    others = [other_store(store) for _ in range(2)]
    try:
        stores = [store, *others]
        await take(store)  # subscribed before the first event
        emitted: list[str] = []

        async def emitter(k: int) -> None:
            for i in range(30):
                emitted.append(await emit(stores[(k + i) % 3], {"k": k, "i": i},
                                          owner=f"o{i % 2}"))

        async def taker(s: Store) -> list[str]:
            runs: list[str] = []
            for _ in range(20):
                runs += await take(s, max_size=4)
                await asyncio.sleep(0)
            return runs

        results = await asyncio.gather(emitter(0), emitter(1), *(taker(s) for s in stores))
        runs = [r for found in results[2:] for r in found]
        runs += await take(store, max_size=4, max_wait=1.0, now=T0 + 1)
        taken = [e for r in runs for e in await event_ids(store, r)]
        assert sorted(taken) == sorted(emitted)  # every event, each once
        assert len(set(runs)) == len(runs)
    finally:
        for s in others:
            if s is not store:
                await s.aclose()
                s.close()
