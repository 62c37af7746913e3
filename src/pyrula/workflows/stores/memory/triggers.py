"""Events and batch triggers in the memory store: each topic's log, each subscription's
pending events by owner, and the take that turns a due batch into a queued run."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pyrula.workflows.records import RunHandle
from pyrula.workflows.stores.common import NO_OWNER, new_event_id, submitted_event
from pyrula.workflows.stores.memory.state import MemoryState, json_copy
from pyrula.workflows.triggers import (
    batch_due,
    batch_key,
    batch_params,
    batch_run_id,
    event_item,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EventRecord:
    """One emitted event as kept: ``seq`` its place in its topic's log (emit order)."""

    seq: int
    event_id: str
    key: str | None
    owner: str
    payload: Any
    emitted_at: float


@dataclass(slots=True)
class Subscription:
    """A workflow triggered by a topic: the log's events up to ``routed`` are pending for
    it (or predate it); ``pending`` holds those not taken yet, by owner, oldest first."""

    routed: int
    pending: dict[str, deque[EventRecord]] = field(default_factory=dict)


class MemoryTriggers:
    """The topics' logs and their subscriptions (Triggers)."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state
        self._logs: dict[str, list[EventRecord]] = {}
        self._keys: dict[tuple[str, str], str] = {}
        self._subs: dict[tuple[str, str], Subscription] = {}

    async def emit(
        self, topic: str, payload: Any, *, now: float, key: str | None = None,
        owner: str | None = None,
    ) -> tuple[str, bool]:
        with self._state.lock:
            if key is not None and (topic, key) in self._keys:
                return self._keys[(topic, key)], False
            log = self._logs.setdefault(topic, [])
            record = EventRecord(len(log) + 1, new_event_id(now), key, owner or NO_OWNER,
                                 json_copy(payload), now)
            log.append(record)
            if key is not None:
                self._keys[(topic, key)] = record.event_id
            return record.event_id, True

    async def take_batches(
        self, name: str, topic: str, *, max_size: int, max_wait: float, now: float,
        limit: int,
    ) -> list[RunHandle]:
        with self._state.lock:
            sub = self._route(name, topic)
            started: list[RunHandle] = []
            for owner in sorted(sub.pending, key=lambda o: (sub.pending[o][0].emitted_at, o)):
                queue = sub.pending[owner]
                while len(started) < limit and batch_due(
                    len(queue), queue[0].emitted_at if queue else None,
                    max_size=max_size, max_wait=max_wait, now=now,
                ):
                    batch = [queue.popleft() for _ in range(min(max_size, len(queue)))]
                    started.append(self._start(name, topic, owner, batch, now))
                if not queue:
                    del sub.pending[owner]
            return started

    def _route(self, name: str, topic: str) -> Subscription:
        """The subscription of ``name`` to ``topic`` (made if new), with every event of
        the log it has not seen yet pending."""
        log = self._logs.get(topic, [])
        sub = self._subs.get((name, topic))
        if sub is None:
            others = any(t == topic for _, t in self._subs)
            sub = self._subs[(name, topic)] = Subscription(len(log) if others else 0)
        for record in log[sub.routed:]:
            sub.pending.setdefault(record.owner, deque()).append(record)
        sub.routed = len(log)
        return sub

    def _start(self, name: str, topic: str, owner: str, batch: list[EventRecord],
               now: float) -> RunHandle:
        """Queue the run of ``batch`` (or find the one queued already)."""
        state = self._state
        key = batch_key(topic, batch[0].event_id)
        existing = state.idempotency.get((name, key))
        if existing is not None:
            return RunHandle(name, existing)
        params = batch_params(topic, [
            event_item(e.event_id, e.key, e.payload, e.emitted_at) for e in batch
        ])
        run = state.new_run(batch_run_id(name, topic, batch[0].event_id), name, params,
                            owner, now, idempotency_key=key)
        run.append([submitted_event(now, name, params, owner or None, key)], now)
        state.idempotency[(name, key)] = run.run_id
        return RunHandle(name, run.run_id)
