"""The children's memory limits: the container's own limit (its cgroup), the per-child soft
and hard limits the fleet derives from it when none is given, and the kill above the hard
limit.

The kernel's OOM killer, when a container reaches its limit, kills whichever process it
picks (the supervisor too) and leaves nothing but ``SIGKILL`` behind. The fleet's limits
act first: above the soft limit a child is replaced (warm, then drained); above the hard
limit it is killed at once, by the fleet, which records why in the evidence its runs are
requeued with. Everything here is pure but the reader of the cgroup files and the kill.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pyrula.config.fleet import FleetOptions, check_memory_limits
from pyrula.config.parse import MIB
from pyrula.logs import FLEET_LOGGER
from pyrula.supervisor.capacity import total_memory
from pyrula.supervisor.children import Child
from pyrula.supervisor.watch import over_hard_limit

logger = logging.getLogger(FLEET_LOGGER)

#: Where the container's cgroup files are mounted (a test points it elsewhere).
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_V2_FILE = "memory.max"
CGROUP_V1_FILE = "memory/memory.limit_in_bytes"
#: cgroup v1 says "no limit" with the largest page-aligned signed 64-bit count
#: (9223372036854771712); any count this large is no limit either.
UNLIMITED_FROM = 1 << 60
#: Shares of the container's limit per process (the children plus one replacement).
SOFT_SHARE = 0.8
HARD_SHARE = 0.9
#: Below this per child, derived limits would recycle or kill children that just started
#: (a fresh child's RSS is 30-40 MB): none is derived and the fleet says so.
MIN_DERIVED_LIMIT = 64 * MIB


def cgroup_memory_limit(v2: str | None, v1: str | None,
                        physical: int | None = None) -> int | None:
    """The container's memory limit in bytes from the texts of its cgroup files (None for
    a file that is absent): cgroup v2's ``memory.max`` if present, else v1's
    ``memory.limit_in_bytes``. None when there is no limit: ``max``, a count of at least
    ``UNLIMITED_FROM``, one at or above the host's ``physical`` memory (a limit the host
    cannot reach limits nothing), 0, or a text that is not a count."""
    text = v2 if v2 is not None else v1
    if text is None:
        return None
    text = text.strip()
    if not text.isdigit():  # "max", or nothing a kernel writes
        return None
    limit = int(text)
    if limit <= 0 or limit >= UNLIMITED_FROM or (physical is not None and limit >= physical):
        return None
    return limit


def read_cgroup_memory_limit(root: Path | None = None) -> int | None:
    """``cgroup_memory_limit`` of this process's container, read from ``root``."""
    base = CGROUP_ROOT if root is None else root

    def text(name: str) -> str | None:
        try:
            return (base / name).read_text()
        except OSError:
            return None

    return cgroup_memory_limit(text(CGROUP_V2_FILE), text(CGROUP_V1_FILE),
                               total_memory())


@dataclass(frozen=True, slots=True)
class MemoryLimits:
    """The limits the fleet runs with, and where they came from."""

    soft: int | None
    hard: int | None
    #: The container's limit, where one was found.
    container: int | None = None
    #: Which of ``soft`` and ``hard`` were derived from ``container`` (not given).
    derived: tuple[str, ...] = ()
    #: Why a limit that could have been derived was not.
    note: str | None = None


def resolve_limits(soft: int | None, hard: int | None, container: int | None,
                   children: int) -> MemoryLimits:
    """The limits given, and for each one not given, its default from the container's
    limit: ``container / (children + 1)`` is one process's share (the children, plus the
    replacement a recycle starts before the old child leaves), of which the soft limit is
    ``SOFT_SHARE`` and the hard one ``HARD_SHARE``, rounded down to a MiB; the rest is the
    supervisor's, the fork server's and the page cache's. A derived limit that would be
    below ``MIN_DERIVED_LIMIT``, or on the wrong side of the limit given, is left out."""
    check_memory_limits(soft, hard)
    if container is None:
        return MemoryLimits(soft, hard)
    share = container / (children + 1)
    soft_default = int(share * SOFT_SHARE) // MIB * MIB
    hard_default = int(share * HARD_SHARE) // MIB * MIB
    if soft is None and hard is None and soft_default < MIN_DERIVED_LIMIT:
        return MemoryLimits(None, None, container, note=(
            f"{_mb(container)} MB for {children} children is under {_mb(MIN_DERIVED_LIMIT)} "
            "MB per child: no limit derived (give fewer children, or the limits)"))
    derived = []
    note = None
    if soft is None:
        if hard is None or soft_default < hard:
            soft, derived = soft_default, ["soft"]
        else:
            note = (f"the derived --max-memory-per-child {_mb(soft_default)} MB is not under "
                    "the --memory-hard-limit given: left off")
    if hard is None:
        if soft is None or hard_default > soft:
            hard = hard_default
            derived.append("hard")
        else:
            note = (f"the derived --memory-hard-limit {_mb(hard_default)} MB is not above "
                    "the --max-memory-per-child given: left off")
    return MemoryLimits(soft, hard, container, tuple(derived), note)


def log_limits(limits: MemoryLimits, children: int) -> None:
    """``fleet_memory_limits``, once at start, when a container limit was found or a limit
    is set: what the children run with and why."""
    if limits.container is None and limits.soft is None and limits.hard is None:
        return

    def shown(value: int | None, which: str) -> str:
        if value is None:
            return "off"
        return f"{_mb(value)} MB" + (" (from the container's limit)"
                                     if which in limits.derived else "")

    container = ("no container limit" if limits.container is None
                 else f"container limit {_mb(limits.container)} MB")
    logger.info("fleet_memory_limits: %s, %d children: recycle above %s, kill above %s%s",
                container, children, shown(limits.soft, "soft"), shown(limits.hard, "hard"),
                f"; {limits.note}" if limits.note else "",
                extra={"event": "fleet_memory_limits", "container_bytes": limits.container,
                       "soft_bytes": limits.soft, "hard_bytes": limits.hard,
                       "derived": list(limits.derived)})


def kill_over_hard_limit(child: Child, rss: int, limit: int) -> None:
    """Kill ``child`` at once (SIGKILL, no drain: it may not live through one) and leave
    the reason where its death's evidence is read (``killed_for``): its runs are requeued
    with it, and ``pyrula runs show`` says it was the fleet's limit, not the kernel's."""
    child.killed_for = f"RSS {_mb(rss)} MB over --memory-hard-limit {_mb(limit)} MB"
    logger.error("child_memory_killed: slot %d pid %d RSS %d MB over --memory-hard-limit "
                 "%d MB; killing it", child.slot, child.pid, _mb(rss), _mb(limit),
                 extra={"event": "child_memory_killed", "slot": child.slot, "pid": child.pid,
                        "rss_bytes": rss, "limit_bytes": limit})
    child.kill()


def enforce_hard_limit(children: Iterable[Child], options: FleetOptions) -> None:
    """Kill each of ``children`` over the hard limit (while the fleet drains, when the
    rest of the watch verdict no longer applies)."""
    for child in children:
        over = over_hard_limit(child, options)
        if over is not None:
            kill_over_hard_limit(child, over.rss_bytes, over.limit)


def _mb(count: int) -> int:
    """MiB, as ``--max-memory-per-child 512MB`` counts them."""
    return round(count / MIB)
