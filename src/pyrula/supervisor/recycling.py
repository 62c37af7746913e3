"""The recycle queue's fairness: a replacement that cannot become ready gives up its turn.

Slots are recycled one at a time, in the order they were queued: a replacement starts,
and once it is ready the old child drains. A replacement that never becomes ready (its
store does not answer, its boot hangs) would keep every other slot waiting behind it, its
own old child included: that one serves on, but any other child over its limits would be
left to grow. So a replacement not ready within ``--child-timeout`` is killed on purpose
(not counted as a boot failure) and its slot goes to the back of the line.
"""

from __future__ import annotations

import logging

from pyrula.logs import FLEET_LOGGER
from pyrula.supervisor.children import Child

logger = logging.getLogger(FLEET_LOGGER)


def replacement_overdue(child: Child, timeout: float, now: float) -> bool:
    """``child``, a replacement not ready yet, has had ``timeout`` to become ready."""
    return not child.ready_seen and child.killed_for is None \
        and now - child.started_at > timeout


def abandon_replacement(child: Child, now: float) -> None:
    """Kill the overdue replacement ``child`` on purpose: ``retiring`` so that its exit is
    not judged a boot failure, ``killed_for`` so that its death says why."""
    waited = now - child.started_at
    child.retiring = True
    child.killed_for = f"not ready {waited:.1f} s after it started (--child-timeout)"
    logger.warning("child_replacement_failed: slot %d pid %d not ready after %.1f s; killing "
                   "it, the child it was to replace serves on", child.slot, child.pid, waited,
                   extra={"event": "child_replacement_failed", "slot": child.slot,
                          "pid": child.pid})
    child.kill()


def next_in_line(queue: list[int], index: int) -> None:
    """Send ``index`` from the head of the recycle ``queue`` to its end (in place), so the
    others have their turn before it is tried again."""
    if len(queue) > 1 and queue[0] == index:
        queue.append(queue.pop(0))
