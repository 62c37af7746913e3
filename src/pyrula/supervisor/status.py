"""What the fleet's ``/status`` says: each child's state and the fleet's as a whole. Pure."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pyrula.supervisor.children import Child, ChildState

logger = logging.getLogger(__name__)


class FleetStatus(StrEnum):
    """The fleet as a whole, as ``/status`` reports it (``status``)."""

    OK = "ok"
    STARTING = "starting"
    DEGRADED = "degraded"
    DRAINING = "draining"


@dataclass(frozen=True, slots=True)
class SlotView:
    """One slot as ``/status`` reads it: its serving child (if any) and its restarts."""

    index: int
    child: Child | None
    restarts: int


def child_entry(child: Child, slot: int, restarts: int) -> dict[str, Any]:
    """One child as ``/status`` lists it."""
    beat = child.beat
    return {
        "slot": slot,
        "pid": child.pid,
        "worker_id": beat.worker_id if beat else None,
        "state": child.state,
        "shards": dict(beat.shards) if beat else {},
        "workflows": sorted(child.workflows),
        "in_flight": beat.in_flight if beat else 0,
        "runs_done": beat.runs_done if beat else 0,
        "restarts": restarts,
        "rss_bytes": child.rss_bytes,
    }


def fleet_status(slots: Iterable[SlotView], desired: int, draining: bool,
                 bounds: tuple[Any, Any] | None = None) -> dict[str, Any]:
    """The ``/status`` body: ok once ``desired`` children are ready, reach their store
    and, on a sharded store, hold shards of every name they serve; starting while none is
    ready and none has restarted yet, or while the ready children hold no shard of a name
    (``unleased`` lists those names: after an upgrade, until the new children lease the
    shards the old ones release); degraded otherwise; draining once the fleet drains. With
    elastic sizing (``bounds``: ``--min``, ``--max``) it also says ``min``, ``max`` and the
    size the fleet wants now, ``desired``."""
    slots = sorted(slots, key=lambda s: s.index)
    children = []
    shards: dict[str, int] = {}
    ready = 0
    cut_off = 0  # ready children that cannot reach their store
    leased: dict[str, int] = {}  # a sharded store: each served name's shards, ready children
    for slot in slots:
        child = slot.child
        if child is None:
            continue
        beat = child.beat
        state = child.state
        if state is ChildState.READY:
            assert beat is not None
            ready += 1
            cut_off += not beat.store_ok
            for name, count in beat.shards.items():
                leased[name] = leased.get(name, 0) + count
        for name, count in (beat.shards if beat else {}).items():
            shards[name] = shards.get(name, 0) + count
        children.append(child_entry(child, slot.index, slot.restarts))
    unleased = sorted(name for name, count in leased.items() if count == 0)
    if draining:
        overall = FleetStatus.DRAINING
    elif ready >= desired and not cut_off:
        overall = FleetStatus.STARTING if unleased else FleetStatus.OK
    elif ready == 0 and all(s.restarts == 0 for s in slots):
        overall = FleetStatus.STARTING
    else:
        overall = FleetStatus.DEGRADED
    body: dict[str, Any] = {
        "status": overall,
        "children": children,
        "shards": shards,
        "restarts": sum(s.restarts for s in slots),
    }
    if unleased:
        body["unleased"] = unleased
    if bounds is not None:
        body.update(min=bounds[0], max=bounds[1], desired=desired)
    return body
