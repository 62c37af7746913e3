"""What to do with a live child, judged on each tick: nothing, kill it, or recycle it. Pure.

A child whose RSS passed ``memory_hard_limit`` is killed whatever it is doing (draining or
starting included): it may not live through a drain, and the kernel's OOM killer, if it
comes first, may pick any process of the container. A child whose loop sent no heartbeat
for ``child_timeout`` is killed (its loop is stuck; a drain would never finish). A ready
child is recycled (a replacement starts first, then it drains) when it has claimed
nothing for ``stall_timeout`` with free slots, when it reached its run limit, or when its
RSS passed ``max_memory_per_child``. A child already retiring or killed is left alone
otherwise, and only the serving child of a slot is recycled (not a replacement still
starting).
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
class MemoryKill:
    """Kill the child now: its RSS ``rss_bytes`` passed the hard limit ``limit``."""

    rss_bytes: int
    limit: int


@dataclass(frozen=True, slots=True)
class Recycle:
    """Replace the child. ``stalled_for`` is set for a stall, which goes first in line."""

    reason: str
    stalled_for: float | None = None


def over_hard_limit(child: Child, options: FleetOptions) -> MemoryKill | None:
    """The hard limit's verdict alone (also judged while the fleet drains)."""
    limit = options.memory_hard_limit
    if child.killed_for is not None or not limit or child.rss_bytes <= limit:
        return None
    return MemoryKill(child.rss_bytes, limit)


def verdict(
    child: Child, serving: bool, options: FleetOptions, now: float
) -> Kill | MemoryKill | Recycle | None:
    """``serving``: the child is its slot's current child (not a replacement starting)."""
    over = over_hard_limit(child, options)
    if over is not None:
        return over
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
