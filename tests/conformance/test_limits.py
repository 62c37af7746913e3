"""Store contract: per-key concurrency limits and start rates (KeyedLimits). Runs over
their key's limit stay queued and are never returned by a claim; a run holds its key's
slot while it runs, and frees it when it ends, parks or is requeued; a key's waiting runs
are admitted in FIFO order. Checked against a small model on every store that has the
ability (the others must refuse a limited workflow at worker start: tests/integration)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyrula.workflows.limits import LimitKeys, WorkflowLimits
from pyrula.workflows.records import PoisonPolicy, RunStatus
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.capabilities import capabilities_of
from tests.conformance.support import (
    T0,
    TTL,
    WF,
    WORKER,
    complete,
    drawn,
    info,
    sleep,
    store_loop,
)

KEYS = ("k1", "k2", "k3")
_names = itertools.count()


def _limited(store: Any) -> Any:
    limits = capabilities_of(store).limits
    if limits is None:
        pytest.skip(f"{type(store).__name__} does not enforce per-key limits")
    return limits


async def _submit(store: Any, name: str, key: str, now: float, owner: str = "a") -> str:
    handle, _ = await store.submit(name, {"k": key}, now=now, owner=owner,
                                   limit_keys=LimitKeys(concurrency=key))
    return str(handle.run_id)


@dataclass
class _Model:
    """Per key: the runs running (id -> token) and the runs waiting, in submit order."""

    max: dict[str, int]
    running: dict[str, dict[str, int]] = field(default_factory=dict)
    worker_of: dict[str, str] = field(default_factory=dict)
    waiting: dict[str, list[str]] = field(default_factory=dict)
    key_of: dict[str, str] = field(default_factory=dict)

    def submitted(self, run_id: str, key: str) -> None:
        self.key_of[run_id] = key
        self.waiting.setdefault(key, []).append(run_id)

    def claimed(self, run_id: str, token: int) -> None:
        key = self.key_of[run_id]
        running, waiting = self.running.setdefault(key, {}), self.waiting[key]
        assert run_id in waiting, f"claimed {run_id}, which was not waiting"
        assert len(running) < self.max[key], f"key {key}: claimed past max {self.max[key]}"
        free = self.max[key] - len(running)
        assert waiting.index(run_id) < free, f"key {key}: claimed out of FIFO order"
        waiting.remove(run_id)
        running[run_id] = token

    def some_running(self, index: int) -> tuple[str, int] | None:
        held = sorted((r, t) for runs in self.running.values() for r, t in runs.items())
        return held[index % len(held)] if held else None

    def stopped(self, run_id: str, *, again: bool) -> None:
        """``run_id`` stopped running; ``again``: it waits once more, last in line."""
        key = self.key_of[run_id]
        del self.running[key][run_id]
        if again:
            self.waiting[key].append(run_id)

    def claimable(self) -> int:
        """How many runs a claim of everything must return now."""
        return sum(min(len(w), self.max[k] - len(self.running.get(k, {})))
                   for k, w in self.waiting.items())


step = st.one_of(
    st.tuples(st.just("submit"), st.sampled_from(KEYS)),
    st.tuples(st.just("claim"), st.integers(1, 4)),
    st.tuples(st.sampled_from(["finish", "requeue", "orphan", "park"]), st.integers(0, 50)),
)


async def _stop(store: Store, model: _Model, kind: str, run_id: str, token: int,
                now: float) -> None:
    """End, requeue, orphan (its worker died: every run it held is requeued) or park
    and wake a running run, and tell the model."""
    if kind == "finish":
        await complete(store, run_id, token, now=now)
        model.stopped(run_id, again=False)
    elif kind == "requeue":
        await store.requeue(run_id, token, now=now, reason="test")
        model.stopped(run_id, again=True)
    elif kind == "orphan":
        outcomes = await store.reclaim_worker(model.worker_of[run_id], now=now,
                                              poison=PoisonPolicy(), charge=())
        for outcome in outcomes:
            model.stopped(outcome.run_id, again=True)
    else:
        await sleep(store, run_id, token, now + 0.5, now=now)
        model.stopped(run_id, again=True)
        assert await store.wake_due(now=now + 0.5, limit=100) == 1


async def _play(store: Any, maxes: dict[str, int], steps: Sequence[tuple[str, Any]]) -> None:
    name = f"{WF}.lim{next(_names)}"
    # One max per workflow: each key gets its own workflow name so maxes may differ.
    names = {k: f"{name}.{k}" for k in KEYS}
    _limited(store).use_limits({names[k]: WorkflowLimits(max=maxes[k]) for k in KEYS})
    model, now = _Model(max=maxes), T0
    by_name = {v: k for k, v in names.items()}
    for kind, arg in [*steps, ("claim", 100)]:
        now += 1
        if kind == "submit":
            model.submitted(await _submit(store, names[arg], arg, now), arg)
        elif kind == "claim":
            expect = min(arg, model.claimable())
            worker = f"{name}@{now}"  # of this example only: examples share the store
            batch = await store.claim(worker, list(names.values()), limit=arg, now=now,
                                      lock_ttl=TTL)
            for claimed in batch:
                assert by_name[claimed.name] == model.key_of[claimed.run_id]
                model.claimed(claimed.run_id, claimed.token)
                model.worker_of[claimed.run_id] = worker
            assert len(batch) == expect, f"claimed {len(batch)}, {expect} were claimable"
        elif (held := model.some_running(arg)) is not None:
            await _stop(store, model, kind, *held, now)


def test_limits_hold_under_any_interleaving(store: Any) -> None:
    """Hypothesis draws each key's max, and interleavings of submits, claims, and runs
    finishing, requeued, orphaned (their lock lost) or parking and being woken."""
    _limited(store)
    with store_loop(store) as runner:

        @drawn(40)
        @given(maxes=st.fixed_dictionaries({k: st.integers(1, 3) for k in KEYS}),
               steps=st.lists(step, max_size=40))
        def check(maxes: dict[str, int], steps: list[tuple[str, Any]]) -> None:
            runner.run(_play(store, maxes, steps))

        check()


async def test_a_rate_admits_per_second_starts_per_key(store: Any) -> None:
    """Fake clock: with 2 starts a second for key r1, claims at t, t+0.25, ... start at
    most 2 runs of r1 in any second (the bucket holds one second of starts); r2's runs
    are not held back by r1's rate."""
    limits = _limited(store)
    limits.use_limits({WF: WorkflowLimits(per_second=2.0)})
    r1 = [(await store.submit(WF, {}, now=T0, owner="a",
                              limit_keys=LimitKeys(rate="r1")))[0].run_id for _ in range(10)]
    r2 = [(await store.submit(WF, {}, now=T0, owner="a",
                              limit_keys=LimitKeys(rate="r2")))[0].run_id for _ in range(2)]
    starts: list[float] = []
    for i in range(16):
        now = T0 + i * 0.25
        for claimed in await store.claim(WORKER, [WF], limit=10, now=now, lock_ttl=TTL):
            if claimed.run_id in r1:
                starts.append(now)
            else:
                assert claimed.run_id in r2
    assert starts, "no run of r1 started"
    for t in starts:
        assert sum(1 for s in starts if t <= s < t + 1.0) <= 2, starts
    assert 6 <= len(starts) <= 9, starts


async def test_a_run_claimed_without_keys_gets_them_from_its_worker(store: Any) -> None:
    """A run submitted without keys (by a process without the definition) is claimed
    once; its worker's assign_limit_keys lets it run, or, over the limit, puts it back
    in its key's line, to be claimed when the slot frees."""
    limits = _limited(store)
    limits.use_limits({WF: WorkflowLimits(max=1)})
    first = await _submit(store, WF, "k", T0)
    [running] = await store.claim(WORKER, [WF], limit=5, now=T0 + 1, lock_ttl=TTL)
    assert running.run_id == first and running.limit_keys == LimitKeys(concurrency="k")
    bare, _ = await store.submit(WF, {"k": "k"}, now=T0 + 2, owner="a")
    [claimed] = await store.claim(WORKER, [WF], limit=5, now=T0 + 3, lock_ttl=TTL)
    assert claimed.run_id == bare.run_id and claimed.limit_keys is None
    keys = LimitKeys(concurrency="k")
    assert not await limits.assign_limit_keys(bare.run_id, claimed.token, keys, now=T0 + 4)
    assert (await info(store, bare.run_id)).status is RunStatus.QUEUED
    assert await store.claim(WORKER, [WF], limit=5, now=T0 + 5, lock_ttl=TTL) == []
    await complete(store, first, running.token, now=T0 + 6)
    [again] = await store.claim(WORKER, [WF], limit=5, now=T0 + 7, lock_ttl=TTL)
    assert again.run_id == bare.run_id and again.limit_keys == keys


async def test_a_cancelled_waiting_run_leaves_its_line(store: Any) -> None:
    limits = _limited(store)
    limits.use_limits({WF: WorkflowLimits(max=1)})
    first = await _submit(store, WF, "k", T0)
    second = await _submit(store, WF, "k", T0 + 1)
    third = await _submit(store, WF, "k", T0 + 2)
    [running] = await store.claim(WORKER, [WF], limit=5, now=T0 + 3, lock_ttl=TTL)
    assert running.run_id == first
    assert await store.cancel(second, now=T0 + 4)
    await complete(store, first, running.token, now=T0 + 5)
    [nxt] = await store.claim(WORKER, [WF], limit=5, now=T0 + 6, lock_ttl=TTL)
    assert nxt.run_id == third


async def test_a_claim_by_id_never_takes_a_run_over_its_limit(store: Any) -> None:
    """claim_run of a run waiting in its key's line returns nothing while the key is full,
    and the run once a slot frees; the line keeps its other runs in order."""
    limits = _limited(store)
    limits.use_limits({WF: WorkflowLimits(max=1)})
    first = await _submit(store, WF, "k", T0)
    second = await _submit(store, WF, "k", T0 + 1)
    third = await _submit(store, WF, "k", T0 + 2)
    [running] = await store.claim(WORKER, [WF], limit=5, now=T0 + 3, lock_ttl=TTL)
    assert running.run_id == first
    assert await store.claim_run(third, WORKER, now=T0 + 4, lock_ttl=TTL) is None
    await complete(store, first, running.token, now=T0 + 5)
    taken = await store.claim_run(third, WORKER, now=T0 + 6, lock_ttl=TTL)
    assert taken is not None and taken.limit_keys == LimitKeys(concurrency="k")
    assert await store.claim(WORKER, [WF], limit=5, now=T0 + 7, lock_ttl=TTL) == []
    await complete(store, third, taken.token, now=T0 + 8)
    [nxt] = await store.claim(WORKER, [WF], limit=5, now=T0 + 9, lock_ttl=TTL)
    assert nxt.run_id == second
