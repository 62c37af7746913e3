"""How many children an elastic fleet wants now (``--min``/``--max``). Pure.

:func:`decide` reads one :class:`ScalingInputs` (what the fleet measured on one tick) and
answers a :class:`Decision`: the size it wants, why, and the figures behind it. The
mechanism (``autoscale``) measures, calls it and sets the supervisor's ``desired``.

The rules, in the order they are applied:

* **Grow** by one child when runs wait: the oldest claimable run of the served workflows
  has waited longer than ``scale_up_after``, or every ready child is at
  ``max_concurrent_runs`` while something is queued (no free slot anywhere: runs are about
  to wait, so the fleet does not wait ``scale_up_after`` to see it). One child per
  decision, and not before the last child added is ready and ``up_cooldown`` has passed
  since the last change: a backlog grows the fleet a child every second or so, and the
  headroom is looked at again before each one, with the new child's load in it.
* Never grow past ``maximum``, and never without headroom: a free share of a CPU core
  (``min_cpu_free`` cores, on the host and in the container's ``cpu.max`` quota), memory
  for another child (``memory_per_child_factor`` times the largest child's RSS, at least
  ``min_child_memory``, on the host and under the cgroup's ``memory.max``), a supervisor
  loop that keeps time (lag under ``max_loop_lag``: a host too busy to run the supervisor
  has no room for a child), and children whose claim loops turn (a child with free slots
  that has claimed nothing for ``claim_stall`` s is held back by its store, not by its
  capacity: another child would wait the same way). A refusal says which, in the reason.
* **Shrink** by one child toward ``minimum`` once nothing is queued and every child has
  been idle (no run in flight) for ``scale_down_after``, and the last change is at least
  ``scale_down_after`` old. One child at a time: the next waits as long again.

Growing needs runs that wait and shrinking needs the whole fleet idle for a long while,
so a steady load never makes the size flap.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import StrEnum

logger = logging.getLogger(__name__)

MIB = 1024 * 1024
#: The free CPU (cores) a new child needs, unless ``PYRULA_SCALE_MIN_CPU_FREE`` says otherwise.
DEFAULT_MIN_CPU_FREE = 0.25


class Direction(StrEnum):
    """Which way a decision moves the fleet (the ``direction`` label of
    ``pyrula_fleet_scaled_total``)."""

    UP = "up"
    DOWN = "down"
    HOLD = "hold"


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """The thresholds of :func:`decide` (``--scale-up-after``, ``--scale-down-after`` and
    the fixed guards documented in docs/deployment.md, "Elastic sizing")."""

    minimum: int
    maximum: int
    scale_up_after: float = 2.0
    scale_down_after: float = 60.0
    up_cooldown: float = 1.0
    min_cpu_free: float = DEFAULT_MIN_CPU_FREE
    min_child_memory: int = 64 * MIB
    memory_per_child_factor: float = 1.5
    max_loop_lag: float = 0.5
    claim_stall: float = 5.0


@dataclass(frozen=True, slots=True)
class ScalingInputs:
    """What the fleet measured on one tick (monotonic seconds for times)."""

    now: float
    #: The size the fleet wants now (``supervisor.desired``).
    size: int
    #: Ready children serving a slot, and children still starting (spawned, not ready).
    ready: int = 0
    starting: int = 0
    #: Runs queued and claimable for the served workflows (None: the store cannot tell).
    queued: int | None = 0
    #: How long the oldest of them has waited (0 when none waits; None: unknown).
    oldest_age: float | None = 0.0
    #: Runs in flight and slots in all (in flight + free) over the ready children.
    busy_slots: int = 0
    total_slots: int = 0
    #: How long every ready child has been without a run in flight (0: one is busy now).
    idle_for: float = 0.0
    #: The supervisor's own loop lag (how late its last tick was), seconds.
    loop_lag: float = 0.0
    #: The freshest claim-loop progress among ready children with free slots (seconds
    #: since it last turned; None when no ready child has a free slot).
    claim_tick_age: float | None = None
    #: Free CPU, in cores (the host's and the container quota's, the smaller); None: unknown.
    cpu_free: float | None = None
    #: Memory another child could use (the host's available and the cgroup's room under
    #: ``memory.max``, the smaller), and the largest child's RSS; None: unknown.
    memory_free: int | None = None
    child_rss: int = 0
    #: When the size last changed (or the fleet started).
    last_change: float = 0.0


@dataclass(frozen=True, slots=True)
class Decision:
    desired: int
    reason: str
    figures: dict[str, float | int | None] = field(default_factory=dict)
    #: Growth was wanted but refused (no headroom, stuck claim loops): ``reason`` says why.
    refused: bool = False

    def direction(self, size: int) -> Direction:
        if self.desired > size:
            return Direction.UP
        if self.desired < size:
            return Direction.DOWN
        return Direction.HOLD


def figures_of(i: ScalingInputs) -> dict[str, float | int | None]:
    """The inputs a decision is logged with (rounded for a log line)."""
    def r(value: float | None, digits: int = 2) -> float | None:
        return None if value is None else round(value, digits)

    return {
        "size": i.size, "ready": i.ready, "starting": i.starting, "queued": i.queued,
        "oldest_age_s": r(i.oldest_age), "busy_slots": i.busy_slots,
        "total_slots": i.total_slots, "idle_for_s": r(i.idle_for),
        "loop_lag_s": r(i.loop_lag, 3), "claim_tick_age_s": r(i.claim_tick_age),
        "cpu_free_cores": r(i.cpu_free), "memory_free_bytes": i.memory_free,
        "child_rss_bytes": i.child_rss, "since_change_s": r(i.now - i.last_change),
    }


def decide(policy: ScalingPolicy, i: ScalingInputs) -> Decision:
    """The size the fleet should have after this tick, and why."""
    figures = figures_of(i)
    size = min(max(i.size, policy.minimum), policy.maximum)
    if size != i.size:  # out of bounds (the bounds are checked at start; kept safe here)
        return Decision(size, f"size {i.size} outside --min {policy.minimum} .. --max "
                        f"{policy.maximum}", figures)
    since_change = i.now - i.last_change
    wants = _growth_wanted(policy, i)
    if wants is not None:
        if size >= policy.maximum:
            return Decision(size, f"{wants}; already at --max {policy.maximum}", figures)
        if i.starting:
            return Decision(size, f"{wants}; waiting for {i.starting} starting children",
                            figures)
        if since_change < policy.up_cooldown:
            return Decision(size, f"{wants}; last change {since_change:.1f} s ago "
                            f"(cooldown {policy.up_cooldown:g} s)", figures)
        refusal = _no_headroom(policy, i)
        if refusal is not None:
            return Decision(size, f"{wants}; not growing: {refusal}", figures, refused=True)
        return Decision(size + 1, wants, figures)
    if size <= policy.minimum:
        return Decision(size, "at --min", figures)
    if i.queued:
        return Decision(size, f"{i.queued} runs queued", figures)
    if i.idle_for < policy.scale_down_after:
        return Decision(size, f"idle {i.idle_for:.1f} s < --scale-down-after "
                        f"{policy.scale_down_after:g} s", figures)
    if since_change < policy.scale_down_after:
        return Decision(size, f"last change {since_change:.1f} s ago < --scale-down-after "
                        f"{policy.scale_down_after:g} s", figures)
    return Decision(size - 1, f"every child idle for {i.idle_for:.1f} s >= "
                    f"--scale-down-after {policy.scale_down_after:g} s, nothing queued",
                    figures)


def _growth_wanted(policy: ScalingPolicy, i: ScalingInputs) -> str | None:
    """Why runs wait (the reason to grow), or None when they do not."""
    if i.oldest_age is not None and i.oldest_age > policy.scale_up_after:
        return (f"oldest queued run waited {i.oldest_age:.1f} s > --scale-up-after "
                f"{policy.scale_up_after:g} s ({i.queued} queued)")
    # Slots are counted over the ready children: none ready, no slots.
    saturated = i.total_slots > 0 and i.busy_slots >= i.total_slots
    if saturated and (i.queued is None or i.queued > 0):
        queued = "queue unknown" if i.queued is None else f"{i.queued} queued"
        return f"every child at max_concurrent_runs ({i.busy_slots}/{i.total_slots} busy, " \
               f"{queued})"
    return None


def _no_headroom(policy: ScalingPolicy, i: ScalingInputs) -> str | None:
    """Why the host cannot take another child now, or None when it can."""
    if i.cpu_free is not None and i.cpu_free < policy.min_cpu_free:
        return f"no CPU headroom ({i.cpu_free:.2f} cores free < {policy.min_cpu_free:g})"
    need = max(policy.min_child_memory, int(i.child_rss * policy.memory_per_child_factor))
    if i.memory_free is not None and i.memory_free < need:
        return (f"no memory headroom ({i.memory_free / MIB:.0f} MiB free < "
                f"{need / MIB:.0f} MiB for a child)")
    if i.loop_lag > policy.max_loop_lag:
        return (f"the supervisor's loop lags {i.loop_lag:.2f} s > {policy.max_loop_lag:g} s "
                "(host overloaded)")
    if i.claim_tick_age is not None and i.claim_tick_age > policy.claim_stall:
        return (f"children with free slots claimed nothing for {i.claim_tick_age:.1f} s "
                "(the store holds the queue back, not the fleet's capacity)")
    return None
