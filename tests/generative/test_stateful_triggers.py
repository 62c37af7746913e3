"""Emits and batch takes in any order Hypothesis chooses, checked against a small model
after every step, on every store: which events each take puts in which run (their order,
their owner), that an emit key is one event per topic, and that an event lands in exactly
one run of each workflow its topic triggers, whoever takes (the test's store object or
another one on the same store, as another process would open it).

What is drawn: the workflows' triggers (topic, max_size, max_wait), topics (one no
workflow is triggered by), owners, keys (from a small pool, so they repeat), payloads,
take limits and how time passes.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from pyrula.workflows.stores.capabilities import capabilities_of
from pyrula.workflows.triggers import batch_due
from tests.generative.harness import other_store
from tests.generative.strategies import PHASES, json_values

T0 = 1_800_000_000.0
TOPICS = ["t.a", "t.b", "t.none"]
WORKFLOWS = ["wf.one", "wf.two"]


@dataclass
class Event:
    event_id: str
    owner: str | None
    emitted_at: float


@dataclass
class Sub:
    """The model of one workflow's subscription: what it saw of the log, what waits."""

    routed: int
    pending: dict[str | None, deque[Event]] = field(default_factory=dict)


class TriggersMachine(RuleBasedStateMachine):
    new_store: Any = None

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.stores: list[Any] = []
        self.now = T0
        self.logs: dict[str, list[Event]] = {t: [] for t in TOPICS}
        self.keys: dict[tuple[str, str], str] = {}
        self.subs: dict[str, Sub] = {}
        self.triggers: dict[str, tuple[str, int, float]] = {}
        self.taken: dict[str, list[str]] = {w: [] for w in WORKFLOWS}

    def _run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    @initialize(topics=st.lists(st.sampled_from(TOPICS[:2]), min_size=2, max_size=2),
                sizes=st.lists(st.integers(1, 4), min_size=2, max_size=2),
                waits=st.lists(st.sampled_from([1.0, 2.5, 5.0]), min_size=2, max_size=2))
    def start(self, topics: list[str], sizes: list[int], waits: list[float]) -> None:
        store = type(self).new_store(shard_count=4)
        self.stores = [store, other_store(store)]
        for name, topic, size, wait in zip(WORKFLOWS, topics, sizes, waits, strict=True):
            self.triggers[name] = (topic, size, wait)

    @rule(topic=st.sampled_from(TOPICS), owner=st.sampled_from([None, "a", "b"]),
          key=st.none() | st.sampled_from(["k1", "k2", "k3"]), payload=json_values,
          which=st.integers(0, 1))
    def emit(self, topic: str, owner: str | None, key: str | None, payload: Any,
             which: int) -> None:
        triggers = capabilities_of(self.stores[which]).triggers
        event_id, created = self._run(triggers.emit(topic, payload, now=self.now, key=key,
                                                    owner=owner))
        if key is not None and (topic, key) in self.keys:
            assert (event_id, created) == (self.keys[(topic, key)], False)
            return
        assert created
        if key is not None:
            self.keys[(topic, key)] = event_id
        self.logs[topic].append(Event(event_id, owner, self.now))

    @rule(seconds=st.sampled_from([0.0, 0.5, 1.0, 2.5, 5.0]))
    def advance(self, seconds: float) -> None:
        self.now += seconds

    @rule(name=st.sampled_from(WORKFLOWS), limit=st.integers(1, 3), which=st.integers(0, 1))
    def take(self, name: str, limit: int, which: int) -> None:
        topic, size, wait = self.triggers[name]
        expected = self._expected(name, topic, size, wait, limit)
        triggers = capabilities_of(self.stores[which]).triggers
        handles = self._run(triggers.take_batches(name, topic, max_size=size, max_wait=wait,
                                                  now=self.now, limit=limit))
        got = []
        for handle in handles:
            info = self._run(self.stores[0].get_run(handle.run_id))
            assert info is not None and info.name == name
            assert info.params["topic"] == topic
            got.append((info.owner, [e["id"] for e in info.params["events"]]))
        assert got == expected
        self.taken[name] += [e for _, ids in got for e in ids]

    def _expected(self, name: str, topic: str, size: int, wait: float,
                  limit: int) -> list[tuple[str | None, list[str]]]:
        """What the model says this take starts (the model moves on as if it did)."""
        sub = self.subs.get(name)
        log = self.logs[topic]
        if sub is None:
            others = any(self.triggers[n][0] == topic for n in self.subs)
            sub = self.subs[name] = Sub(len(log) if others else 0)
        for event in log[sub.routed:]:
            sub.pending.setdefault(event.owner, deque()).append(event)
        sub.routed = len(log)
        out: list[tuple[str | None, list[str]]] = []
        for owner in sorted(sub.pending, key=lambda o: (sub.pending[o][0].emitted_at, o or "")):
            queue = sub.pending[owner]
            while len(out) < limit and batch_due(len(queue), queue[0].emitted_at if queue
                                                 else None, max_size=size, max_wait=wait,
                                                 now=self.now):
                out.append((owner, [queue.popleft().event_id for _ in
                                    range(min(size, len(queue)))]))
            if not queue:
                del sub.pending[owner]
        return out

    @invariant()
    def each_event_in_at_most_one_run_per_workflow(self) -> None:
        for ids in self.taken.values():
            assert len(ids) == len(set(ids))

    def teardown(self) -> None:
        for store in self.stores[1:]:
            if store is not self.stores[0]:
                self._run(store.aclose())
                store.close()
        if self.stores:
            self._run(self.stores[0].aclose())
        self.loop.close()


def test_triggers_match_the_model(new_store: Any) -> None:
    TriggersMachine.new_store = staticmethod(new_store)
    run_state_machine_as_test(TriggersMachine, settings=settings(
        max_examples=15, stateful_step_count=25, deadline=None, phases=PHASES,
        suppress_health_check=list(HealthCheck),
    ))

