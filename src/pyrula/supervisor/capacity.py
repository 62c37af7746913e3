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
    import psutil

    uid = os.getuid()
    used = 0
    for process in psutil.process_iter(["uids", "num_threads"]):
        uids = process.info.get("uids")
        if uids is not None and uids.real == uid:
            used += int(process.info.get("num_threads") or 1)
    return max(0, soft - used)


def _available_memory(cgroup_limit: int | None) -> int | None:
    available = available_memory()
    if available is None:
        return None
    return available if cgroup_limit is None else min(available, cgroup_limit)


#: Where Linux says what memory the host has, and each process's resident pages.
MEMINFO = "/proc/meminfo"
PROC = "/proc"


def available_memory() -> int | None:
    """The memory the host has available (bytes), or None when it cannot tell."""
    return meminfo("MemAvailable", "available")


def total_memory() -> int | None:
    """The host's physical memory (bytes), or None when it cannot tell."""
    return meminfo("MemTotal", "total")


def meminfo(field: str, psutil_name: str, path: str = MEMINFO) -> int | None:
    """``field`` of Linux's ``/proc/meminfo`` in bytes, else psutil's ``virtual_memory``
    figure ``psutil_name`` (where there is no such file). Read directly: psutil reads the
    same line, but importing it would cost every fleet's start tens of milliseconds."""
    try:
        with open(path) as lines:
            for line in lines:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(getattr(psutil.virtual_memory(), psutil_name))
    except (OSError, RuntimeError, AttributeError):
        return None


def rss_of(pid: int, proc: str = PROC) -> int | None:
    """The resident memory of process ``pid`` (bytes; Linux's ``/proc/PID/statm``, else
    psutil's), None once it has exited."""
    try:
        with open(f"{proc}/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except FileNotFoundError:
        if os.path.isdir(proc):
            return None  # a /proc without this pid: the process is gone
    except (OSError, ValueError, IndexError):
        pass
    import psutil

    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


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
