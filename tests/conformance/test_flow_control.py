"""Store contract: per-owner flow control (max_concurrent, max_starts_per_second)."""

from __future__ import annotations

import pytest

from pyrula.workflows.records import FlowControl, RunStatus
from pyrula.workflows.stores.base import Store
from tests.conformance.support import (
    T0,
    TTL,
    WF,
    WORKER,
    complete,
    info,
    require_global_order,
    sleep,
    submit,
)


def test_flow_control_round_trips(store: Store) -> None:
    assert store.flow_control_get("tenant-1") is None

    store.flow_control_set("tenant-1", max_concurrent=3, max_starts_per_second=2.5)
    store.flow_control_set("tenant-2", max_starts_per_second=10.0)

    assert store.flow_control_get("tenant-1") == FlowControl("tenant-1", 3, 2.5)
    assert store.flow_control_get("tenant-2") == FlowControl("tenant-2", None, 10.0)
    # set replaces the owner's whole setting
    store.flow_control_set("tenant-1", max_concurrent=5)
    assert store.flow_control_get("tenant-1") == FlowControl("tenant-1", 5, None)

    assert store.flow_control_delete("tenant-1") is True
    assert store.flow_control_get("tenant-1") is None
    assert store.flow_control_delete("tenant-1") is False
    assert store.flow_control_get("tenant-2") == FlowControl("tenant-2", None, 10.0)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_a_bad_max_concurrent_is_refused(store: Store, bad: object) -> None:
    with pytest.raises(ValueError, match="max_concurrent"):
        store.flow_control_set("tenant-1", max_concurrent=bad)  # type: ignore[arg-type]
    assert store.flow_control_get("tenant-1") is None


@pytest.mark.parametrize("bad", [0, 0.0, -2.0, True, "10", float("nan"), float("inf")])
def test_a_bad_max_starts_per_second_is_refused(store: Store, bad: object) -> None:
    with pytest.raises(ValueError, match="max_starts_per_second"):
        store.flow_control_set("tenant-1", max_starts_per_second=bad)  # type: ignore[arg-type]
    assert store.flow_control_get("tenant-1") is None


def test_a_bad_owner_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="owner"):
        store.flow_control_set(42, max_concurrent=1)  # type: ignore[arg-type]


async def test_max_concurrent_caps_the_running_runs_of_an_owner(store: Store) -> None:
    require_global_order(store)
    store.flow_control_set("capped", max_concurrent=2)
    capped = [await submit(store, owner="capped", now=T0 + i) for i in range(5)]
    free = [await submit(store, owner="free", now=T0 + 10 + i) for i in range(3)]

    batch = await store.claim(WORKER, [WF], limit=10, now=T0 + 20, lock_ttl=TTL)

    ids = {c.run_id for c in batch}
    assert ids == set(capped[:2]) | set(free)
    assert await store.claim("w2", [WF], limit=10, now=T0 + 21, lock_ttl=TTL) == []
    assert (await info(store, capped[2])).status == RunStatus.QUEUED

    # A finished run frees its slot...
    done = next(c for c in batch if c.run_id == capped[0])
    await complete(store, done.run_id, done.token, now=T0 + 22)
    [third] = await store.claim(WORKER, [WF], limit=10, now=T0 + 23, lock_ttl=TTL)
    assert third.run_id == capped[2]
    assert await store.claim(WORKER, [WF], limit=10, now=T0 + 23, lock_ttl=TTL) == []

    # ...and so does a parked one (a sleeping run holds no slot).
    parked = next(c for c in batch if c.run_id == capped[1])
    await sleep(store, parked.run_id, parked.token, T0 + 3600, now=T0 + 24)
    [fourth] = await store.claim(WORKER, [WF], limit=10, now=T0 + 25, lock_ttl=TTL)
    assert fourth.run_id == capped[3]

    # Deleting the setting lifts the cap.
    assert store.flow_control_delete("capped") is True
    [fifth] = await store.claim(WORKER, [WF], limit=10, now=T0 + 26, lock_ttl=TTL)
    assert fifth.run_id == capped[4]


async def test_max_starts_per_second_limits_claims_per_second(store: Store) -> None:
    require_global_order(store)
    rate = 5
    store.flow_control_set("rated", max_starts_per_second=float(rate))
    rated = [await submit(store, owner="rated", now=T0 + i * 0.25) for i in range(60)]
    free = {await submit(store, owner="free", now=T0 + 20 + i) for i in range(10)}

    now = T0 + 100.0
    first = await store.claim(WORKER, [WF], limit=100, now=now, lock_ttl=TTL)
    assert {c.run_id for c in first} >= free  # the other owner is not held back
    per_poll = [len([c for c in first if c.run_id not in free])]
    for _ in range(12):  # 3 s of fake time, a poll every 0.25 s
        now += 0.25
        batch = await store.claim(WORKER, [WF], limit=100, now=now, lock_ttl=TTL)
        per_poll.append(len(batch))

    assert 1 <= per_poll[0] <= rate, per_poll
    assert all(n <= rate for n in per_poll), per_poll
    assert 2 * rate <= sum(per_poll) <= 4 * rate, per_poll

    # A long idle spell does not store up more than about a second of starts.
    burst = await store.claim(WORKER, [WF], limit=100, now=now + 60, lock_ttl=TTL)
    assert 1 <= len(burst) <= rate
    claimed = sum(per_poll) + len(burst)
    # FIFO within the owner still holds under the rate limit.
    ids = [c.run_id for c in first if c.run_id not in free]
    assert ids == rated[: len(ids)]
    assert (await info(store, rated[claimed])).status == RunStatus.QUEUED
    assert (await info(store, rated[claimed - 1])).status == RunStatus.RUNNING
