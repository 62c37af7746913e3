"""Store contract: run priorities. Within an owner, a queued run of a higher priority is
claimed before any of a lower one, FIFO within one priority; between owners deficit round
robin decides as without priorities. On a sharded store the order holds per shard (as
deficit round robin and FIFO do), so the model is checked shard by shard there."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyrula.workflows.events import EventType
from pyrula.workflows.records import RunStatus
from pyrula.workflows.stores.base import Store
from tests.conformance.support import (
    T0,
    TTL,
    WF,
    WORKER,
    complete,
    drawn,
    ev,
    info,
    require_global_order,
    sleep,
    store_loop,
    submit,
    take,
    wait_for,
)

OWNERS = ("a", "b", "c")
#: A workflow name per Hypothesis example, so that examples sharing a store never meet.
_names = itertools.count()


@dataclass
class _Model:
    """What waits, per (shard, owner): (priority, submission number, run id)."""

    waiting: dict[tuple[str, str], list[tuple[int, int, str]]] = field(default_factory=dict)
    owner_of: dict[str, tuple[str, str]] = field(default_factory=dict)
    submitted: int = 0

    def add(self, shard: str, owner: str, priority: int, run_id: str) -> None:
        self.submitted += 1
        self.waiting.setdefault((shard, owner), []).append((priority, self.submitted, run_id))
        self.owner_of[run_id] = (shard, owner)

    def claimed(self, run_id: str) -> None:
        """Check ``run_id`` is its owner's next run on its shard (highest priority, then
        first submitted), and take it out."""
        assert run_id in self.owner_of, f"claimed {run_id}, never submitted or claimed twice"
        queue = self.waiting[self.owner_of.pop(run_id)]
        expected = min(queue, key=lambda w: (-w[0], w[1]))
        got = next(w for w in queue if w[2] == run_id)
        assert got == expected, (
            f"claimed priority {got[0]} (submission {got[1]}) while its owner's "
            f"priority {expected[0]} (submission {expected[1]}) waited"
        )
        queue.remove(got)

    def pick(self, index: int) -> str | None:
        """A waiting run (the ``index``-th, modulo how many wait), or None."""
        ids = sorted(self.owner_of)
        return ids[index % len(ids)] if ids else None

    def gone(self, run_id: str) -> None:
        """``run_id`` left its queue otherwise than by a claim (cancelled, taken by id)."""
        queue = self.waiting[self.owner_of.pop(run_id)]
        queue.remove(next(w for w in queue if w[2] == run_id))

    def left(self) -> int:
        return sum(len(q) for q in self.waiting.values())


def _shard(store: Any, run_id: str) -> str:
    """The shard a run is queued on: the four hex digits after the name hash of a Valkey
    run id on a sharded store; one queue elsewhere."""
    return run_id[12:16] if getattr(store, "shard_count", 1) > 1 else ""


submission = st.tuples(st.sampled_from(OWNERS), st.integers(0, 9))
step = st.one_of(
    st.tuples(st.just("submit"), submission),
    st.tuples(st.just("claim"), st.integers(1, 4)),
    st.tuples(st.sampled_from(["cancel", "claim_run"]), st.integers(0, 100)),
)


async def _play(store: Store, steps: Sequence[tuple[str, Any]]) -> None:
    name = f"{WF}.prio{next(_names)}"
    model = _Model()
    now = T0
    for kind, arg in [*steps, ("claim", 1000)]:
        now += 1
        if kind == "submit":
            owner, priority = arg
            run_id = await submit_with(store, name, owner, priority, now)
            model.add(_shard(store, run_id), owner, priority, run_id)
            continue
        if kind == "claim":
            batch = await store.claim(WORKER, [name], limit=arg, now=now, lock_ttl=TTL)
            for claimed in batch:
                model.claimed(claimed.run_id)
            continue
        run_id = model.pick(arg)
        if run_id is not None:  # a run leaves its queue some other way
            if kind == "cancel":
                assert await store.cancel(run_id, now=now)
            else:
                assert await store.claim_run(run_id, WORKER, now=now, lock_ttl=TTL)
            model.gone(run_id)
    if getattr(store, "shard_count", 1) == 1:
        assert model.left() == 0, "a claim of 1000 left runs queued"


async def submit_with(store: Store, name: str, owner: str, priority: int, now: float) -> str:
    handle, created = await store.submit(name, {}, now=now, owner=owner, priority=priority)
    assert created
    return handle.run_id


def test_claims_take_an_owners_highest_priority_first_fifo_within_one(store: Store) -> None:
    """Hypothesis draws owners, priorities and the order of submissions, claims, cancels
    and claims by id of queued runs."""
    with store_loop(store) as runner:

        @drawn(40)
        @given(steps=st.lists(step, max_size=40))
        def check(steps: list[tuple[str, Any]]) -> None:
            runner.run(_play(store, steps))

        check()


async def test_priority_shows_on_the_run_and_defaults_to_zero(store: Store) -> None:
    plain = await submit(store, owner="a")
    high = await submit_with(store, WF, "a", 7, T0)
    assert (await info(store, plain)).priority == 0
    assert (await info(store, high)).priority == 7


@pytest.mark.parametrize("bad", [-1, 10, 1.0, "3", True, None])
async def test_a_bad_priority_is_refused_and_writes_nothing(store: Store, bad: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="priority"):
        await store.submit(WF, {}, now=T0, owner="a", priority=bad)
    assert await store.claim(WORKER, [WF], limit=10, now=T0, lock_ttl=TTL) == []


async def test_an_owners_priorities_do_not_starve_another_owner(store: Store) -> None:
    """Deficit round robin still alternates owners, whatever their runs' priorities."""
    require_global_order(store)
    for i in range(6):
        await submit_with(store, WF, "a", 9, T0 + i)
    b = [await submit_with(store, WF, "b", 0, T0 + 10 + i) for i in range(3)]
    served = []
    for i in range(6):
        [claimed] = await store.claim(WORKER, [WF], limit=1, now=T0 + 20 + i, lock_ttl=TTL)
        served.append("b" if claimed.run_id in b else "a")
    assert sorted(served[:2]) == ["a", "b"] and sorted(served[2:4]) == ["a", "b"], served


async def _claimed_next(store: Store, run_id: str, now: float) -> None:
    """The next claim takes ``run_id`` (and completes it)."""
    claimed = await store.claim(WORKER, [WF], limit=1, now=now, lock_ttl=TTL)
    assert [c.run_id for c in claimed] == [run_id]
    await complete(store, run_id, claimed[0].token, now=now)


async def test_a_run_woken_or_requeued_keeps_its_priority(store: Store) -> None:
    """Queued again (woken by its timer or a signal, requeued) behind priority-0 runs of
    its owner, a priority-5 run is still claimed before them."""
    require_global_order(store)
    sleeper = await submit_with(store, WF, "a", 5, T0)
    waiter = await submit_with(store, WF, "a", 5, T0)
    requeued = await submit_with(store, WF, "a", 5, T0)
    s, w, r = [await take(store, x) for x in (sleeper, waiter, requeued)]
    await sleep(store, sleeper, s.token, T0 + 10, now=T0 + 1)
    await wait_for(store, waiter, w.token, "go", now=T0 + 1)
    for i in range(4):
        await submit_with(store, WF, "a", 0, T0 + 2 + i)

    assert await store.wake_due(now=T0 + 10, limit=10) == 1
    await _claimed_next(store, sleeper, T0 + 11)
    await store.signal(waiter, "go", None, now=T0 + 12)
    await _claimed_next(store, waiter, T0 + 13)
    await store.requeue(requeued, r.token, now=T0 + 14, reason="test")
    await _claimed_next(store, requeued, T0 + 15)
    assert (await info(store, requeued)).priority == 5


async def test_a_continue_as_new_successor_keeps_the_priority(store: Store) -> None:
    require_global_order(store)
    run_id = await submit_with(store, WF, "a", 6, T0)
    claimed = await take(store, run_id)
    plain = await submit_with(store, WF, "a", 0, T0 + 1)
    finished = await store.finish(
        run_id, claimed.token, [ev(EventType.RUN_CONTINUED, T0 + 2)],
        now=T0 + 2, status=RunStatus.CONTINUED, successor_params={},
    )
    successor = finished.successor_id
    assert successor is not None and (await info(store, successor)).priority == 6
    batch = await store.claim(WORKER, [WF], limit=2, now=T0 + 3, lock_ttl=TTL)
    assert [c.run_id for c in batch] == [successor, plain]
