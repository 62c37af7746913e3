"""The memory store: the reference Store, one component per concern over shared state.

- ``state``: the run records, queues and timers, the lock, and the shared transitions;
- ``queue``: submit, claim (deficit round robin, flow control), claim_run, wake_due;
- ``attempts``: an attempt's fenced writes, renewals, and the reclaims of dead attempts;
- ``control``: signal, cancel, wake_run; ``reads``: runs, journals, results;
- ``membership``, ``flow``, ``schedules``: workers, owners' limits, schedules;
- ``store``: :class:`MemoryStore`, the facade that joins them.
"""

from __future__ import annotations

import logging

from pyrula.workflows.stores.memory.store import MemoryStore

logger = logging.getLogger(__name__)

__all__ = ["MemoryStore"]
