"""Events and batch triggers: ``emit`` appends to the topic's log (its own slot); a take
copies the log's new events to the workflow's trigger shard, then takes the due batches
and queues their runs there, one script on one slot (lua/trigger.lua has the layout)."""

from __future__ import annotations

import logging
from typing import Any

from pyrula.workflows.events import dumps
from pyrula.workflows.records import RunHandle
from pyrula.workflows.stores.common import NO_OWNER, new_event_id
from pyrula.workflows.stores.valkey.connection import Connection
from pyrula.workflows.stores.valkey.doorbell import Doorbell
from pyrula.workflows.stores.valkey.keys import name_hash
from pyrula.workflows.stores.valkey.registry import Registry
from pyrula.workflows.triggers import event_item

logger = logging.getLogger(__name__)

#: The most events of a topic's log one take copies; a take that copied this many is
#: followed by another at once (the trigger loop goes again).
ROUTE_BATCH = 1000


def element(event_id: str, key: str | None, owner: str, payload: Any, now: float) -> bytes:
    """An event as the topic's log keeps it: a header line, then the event as a batch
    run's params list it (scripts copy that line into the params without decoding it)."""
    header = dumps([now, owner, key, event_id])
    return header + b"\n" + dumps(event_item(event_id, key, payload, now))


def params_prefix(topic: str) -> bytes:
    """What a batch run's params begin with; the script adds the events and ``]}``."""
    return dumps({"topic": topic})[:-1] + b',"events":['


class Triggers:
    """emit and take_batches (Triggers), and the copy marks this store last saw."""

    def __init__(self, connection: Connection, registry: Registry, doorbell: Doorbell) -> None:
        self.connection = connection
        self.registry = registry
        self.doorbell = doorbell
        # (name, topic) -> the workflow's copy mark as the last take answered.
        self._copied: dict[tuple[str, str], str] = {}

    def trigger_shard(self, topic: str) -> int:
        """The shard of a workflow where the events of ``topic`` wait and their runs queue."""
        return int(name_hash(topic), 16) % self.connection.shard_count

    async def emit(
        self, topic: str, payload: Any, *, now: float, key: str | None = None,
        owner: str | None = None,
    ) -> tuple[str, bool]:
        event_id = new_event_id(now)
        found = await self.connection.op(
            self.connection.keys.topic(topic), "emit", event_id, key or "",
            element(event_id, key, owner or NO_OWNER, payload, now),
        )
        return str(found[0]), bool(int(found[1]))

    async def take_batches(
        self, name: str, topic: str, *, max_size: int, max_wait: float, now: float,
        limit: int,
    ) -> list[RunHandle]:
        conn = self.connection
        await self.registry.register(name)
        start, rows = await conn.op(
            conn.keys.topic(topic), "trigger_route", name, self._copied.get((name, topic), ""),
            ROUTE_BATCH, conn.completed_ttl,
        )
        end = int(float(rows[-1])) if rows else int(start)
        shard = self.trigger_shard(topic)
        base = conn.keys.base_of(name, shard)
        args = ("trigger_take", name, name_hash(topic), topic, int(start), end, max_size,
                repr(float(max_wait)), repr(float(now)), limit,
                f"{name_hash(name)}{shard:04x}", params_prefix(topic), *rows)
        clustered = await conn.clustered()
        keys = base if clustered else (base, conn.keys.ready(name), conn.keys.bell)
        found = await conn.op(keys, *args)
        self._copied[(name, topic)] = str(found[0])
        if clustered and int(found[1]):  # the doorbell lives in another slot: ring it now
            await self.doorbell.ring(name, [shard], now)
        return [RunHandle(name, str(run_id)) for run_id in found[2:]]
