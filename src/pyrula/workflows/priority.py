"""Run priorities: the range ``submit(priority=...)`` accepts, and its check.

Within one tenant (a run's owner) a queued run of a higher priority is claimed before any
of a lower one; runs of one priority keep their FIFO order. Between tenants deficit
round robin decides as it does without priorities, so a tenant's priorities never starve
another tenant.
"""

from __future__ import annotations

from typing import Any

#: The lowest priority, every run's default.
MIN_PRIORITY = 0
#: The highest priority.
MAX_PRIORITY = 9


def check_priority(priority: Any) -> int:
    """``priority`` if it is an int in MIN_PRIORITY..MAX_PRIORITY; raises TypeError for
    anything that is not an int (bool included), ValueError for an int out of range."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(
            f"priority must be an int from {MIN_PRIORITY} to {MAX_PRIORITY}, "
            f"got {priority!r} ({type(priority).__name__})"
        )
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(
            f"priority must be an int from {MIN_PRIORITY} to {MAX_PRIORITY}, got {priority!r}"
        )
    return int(priority)
