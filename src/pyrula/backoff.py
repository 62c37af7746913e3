"""Jittered doubling delays, for whatever retries a call the store refused: the worker's
loops, an attempt waiting for the store, the supervisor's recovery of a dead child.

Kept apart from the worker so that the supervisor can use it without importing the worker.
"""

from __future__ import annotations

import random
from collections.abc import Callable

#: A worker loop's restart delays: from half a second, doubling, up to 30 s.
BACKOFF_MIN = 0.5
BACKOFF_MAX = 30.0


def backoff_delays(start: float = BACKOFF_MIN, cap: float = BACKOFF_MAX) -> Callable[[], float]:
    """Successive jittered delays doubling from ``start`` up to ``cap``."""
    current = start / 2

    def next_delay() -> float:
        nonlocal current
        current = min(cap, current * 2)
        return random.uniform(current / 2, current)

    return next_delay
