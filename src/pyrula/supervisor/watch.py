"""What to do with a live child, judged on each tick: nothing, kill it, or recycle it. Pure.

A child whose loop sent no heartbeat for ``child_timeout`` is killed (its loop is stuck; a
drain would never finish). A ready child is recycled (a replacement starts first, then it
drains) when it has claimed nothing for ``stall_timeout`` with free slots, when it reached
its run limit, or when its RSS passed ``max_memory_per_child``. A child already retiring or
killed is left alone, and only the serving child of a slot is recycled (not a replacement
still starting).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyrula.config.fleet import FleetOptions
from pyrula.supervisor.children import Child

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Kill:
    """Kill the child now: it has been silent ``silent`` seconds."""

    silent: float


@dataclass(frozen=True, slots=True)
class Recycle:
    """Replace the child. ``stalled_for`` is set for a stall, which goes first in line."""

    reason: str
    stalled_for: float | None = None


def verdict(
    child: Child, serving: bool, options: FleetOptions, now: float
) -> Kill | Recycle | None:
    """``serving``: the child is its slot's current child (not a replacement starting)."""
    if child.killed_for is not None or child.retiring:
        return None
    silent = now - child.last_beat
    if silent > options.child_timeout:
        return Kill(silent)
    beat = child.beat
    if beat is None or not child.ready_seen or not serving:
        return None
    if beat.free > 0 and beat.claim_tick_age > options.stall_timeout:
        return Recycle("stalled", stalled_for=beat.claim_tick_age)
    if child.run_limit is not None and beat.runs_done >= child.run_limit:
        return Recycle(f"{beat.runs_done} runs done")
    if options.max_memory_per_child and child.rss_bytes > options.max_memory_per_child:
        return Recycle(f"RSS {child.rss_bytes} bytes")
    return None
