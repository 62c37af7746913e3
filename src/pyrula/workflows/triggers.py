"""Batch triggers: ``@workflow(trigger=BatchTrigger(topic, max_size, max_wait))`` starts a
run of the workflow for each batch of events emitted on ``topic`` (``client.emit``).

The definition and the shape of a batch run's params live here (pure: no I/O, no store);
the stores keep the events and take the batches (``stores.capabilities.Triggers``), the
worker's trigger loop asks them to (``worker.triggers``). See docs/triggers.md.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyrula.timestamps import iso_utc
from pyrula.workflows.definition import check_name

#: The longest topic, in characters.
MAX_TOPIC_LENGTH = 200


def check_topic(topic: Any) -> str:
    """``topic`` if it may name a topic (as a workflow name may: a non-empty str of at most
    MAX_TOPIC_LENGTH characters, no control characters), else ValueError saying why."""
    return check_name("topic", topic, MAX_TOPIC_LENGTH)


@dataclass(frozen=True, slots=True)
class BatchTrigger:
    """Start one run per batch of ``topic``'s events: as soon as ``max_size`` events are
    pending, or once the oldest pending one has waited ``max_wait`` seconds (then with
    the events pending, at most ``max_size``). Each event lands in exactly one run."""

    topic: str
    max_size: int = 100
    max_wait: float = 5.0

    def __post_init__(self) -> None:
        check_topic(self.topic)
        size = self.max_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"BatchTrigger max_size must be an int >= 1, got {size!r}")
        wait = self.max_wait
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not (
            0 < wait < math.inf
        ):
            raise ValueError(f"BatchTrigger max_wait must be a number of seconds > 0, "
                             f"got {wait!r}")
        object.__setattr__(self, "max_wait", float(wait))


def event_item(event_id: str, key: str | None, payload: Any, emitted_at: float) -> dict[str, Any]:
    """One event as a batch run's params list it: ``emitted_at`` in ISO-8601 UTC."""
    return {"id": event_id, "key": key, "payload": payload, "emitted_at": iso_utc(emitted_at)}


def batch_params(topic: str, items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A batch run's params: ``{"topic", "events": [...]}``, the events in emit order."""
    return {"topic": topic, "events": list(items)}


def batch_key(topic: str, first_event_id: str) -> str:
    """The idempotency key of the run of the batch that starts with ``first_event_id``:
    a take retried after a lost reply finds the run it made instead of making another."""
    return f"trigger:{topic}:{first_event_id}"


def batch_run_id(name: str, topic: str, first_event_id: str) -> str:
    """The id of the run of that batch (stores whose ids carry no shard): the first
    event's 12-digit time prefix (so ids still sort by time), then 20 hex digits of a hash
    of the workflow, the topic and the event."""
    digest = hashlib.sha1(f"{name}\0{topic}\0{first_event_id}".encode()).hexdigest()
    return f"{first_event_id[:12]}{digest[:20]}"


def batch_due(count: int, oldest_at: float | None, *, max_size: int, max_wait: float,
              now: float) -> bool:
    """Whether pending events make a batch now: ``max_size`` of them, or the oldest has
    waited ``max_wait``."""
    if count <= 0:
        return False
    return count >= max_size or (oldest_at is not None and oldest_at + max_wait <= now)
