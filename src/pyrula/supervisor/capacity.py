"""How many children this host can hold, checked before the fleet forks any.

A fleet asked for more children than the host can start fails late and badly: forks fail
part way (``RLIMIT_NPROC``), or the memory runs out once they have all imported the app.
So ``-n`` (or ``--max``) is refused at start when it is above either bound:

- processes: the soft ``RLIMIT_NPROC`` less the tasks (threads count) this user runs now,
  at ``TASKS_PER_CHILD`` a child (the kernel does not apply the limit to root);
- memory: the memory available (the container's limit when it is lower) over
  ``BYTES_PER_CHILD``, a child's own memory beside what it shares with the fork server.

The bounds are estimates, on the generous side: a refusal means the fleet certainly does
not fit, not that it fits when accepted. ``host_room`` reads the host; ``refusal`` is pure.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

import psutil

from pyrula.config.parse import MIB

#: A child's own memory, beside the pages it shares with the fork server (bytes).
BYTES_PER_CHILD = 30 * MIB
#: The tasks (process and threads) a child holds at least: its main thread, the SQLite or
#: sync-step thread, the store's.
TASKS_PER_CHILD = 2
#: What the fleet itself needs besides its children: the supervisor and the fork server.
FLEET_TASKS = 2


@dataclass(frozen=True)
class HostRoom:
    """What the host has left: tasks under RLIMIT_NPROC (None: no limit applies) and
    available memory (None: unknown)."""

    tasks: int | None
    memory: int | None


def host_room(cgroup_limit: int | None = None) -> HostRoom:
    """Read the host: the process limit less what this user runs, the available memory."""
    return HostRoom(tasks=_free_tasks(), memory=_available_memory(cgroup_limit))


def _free_tasks() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft == resource.RLIM_INFINITY or os.geteuid() == 0:
        return None
    uid = os.getuid()
    used = 0
    for process in psutil.process_iter(["uids", "num_threads"]):
        uids = process.info.get("uids")
        if uids is not None and uids.real == uid:
            used += int(process.info.get("num_threads") or 1)
    return max(0, soft - used)


def _available_memory(cgroup_limit: int | None) -> int | None:
    try:
        available = int(psutil.virtual_memory().available)
    except (OSError, RuntimeError):
        return None
    return available if cgroup_limit is None else min(available, cgroup_limit)


def refusal(flag: str, children: int, room: HostRoom) -> str | None:
    """Why ``children`` do not fit in ``room`` (one line naming ``flag``), or None."""
    if room.tasks is not None:
        most = max(0, (room.tasks - FLEET_TASKS) // TASKS_PER_CHILD)
        if children > most:
            return (f"{flag} {children}: this host can start about {most} children (the "
                    f"process limit, ulimit -u, leaves {room.tasks} tasks for this user, "
                    f"{TASKS_PER_CHILD} a child); ask for fewer or raise the limit")
    if room.memory is not None:
        most = room.memory // BYTES_PER_CHILD
        if children > most:
            return (f"{flag} {children}: this host can hold about {most} children "
                    f"({room.memory // MIB} MiB of memory available, about "
                    f"{BYTES_PER_CHILD // MIB} MiB a child); ask for fewer")
    return None
