"""What the worker does with a due schedule: the pure part of the schedule loop.

A schedule is due once ``next_run_at <= now``. However many occurrences were missed
(downtime, a paused worker fleet, a name no worker served), it fires once, for the latest
occurrence at or before ``now``, and moves to the first occurrence after ``now``; missed
ones are not backfilled. With a ``catchup_window`` that one fires only if it is at most
that old. The overlap check needs the store (is the last run unfinished?), so the loop
makes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyrula.workflows.schedules.schedule import Schedule, epoch, idempotency_key


@dataclass(frozen=True, slots=True)
class Plan:
    """The decision for one due schedule at one ``now``."""

    #: The occurrence this pass stands for (unix seconds): the latest one <= now.
    occurrence: int
    #: Where ``next_run_at`` moves: the first occurrence after now (unix seconds).
    next_run_at: int
    #: False when ``catchup_window`` says the occurrence is too old to fire.
    in_window: bool
    #: The idempotency key the run of ``occurrence`` is submitted with.
    key: str


def plan(schedule: Schedule, now: float) -> Plan:
    """Decide what a due schedule (``next_run_at <= now``) does at ``now``."""
    due = epoch(schedule.next_run_at)
    latest = schedule.last_at_or_before(now)
    occurrence = due if latest is None else max(due, epoch(latest))
    window = schedule.catchup_window
    in_window = window is None or now - occurrence <= window.total_seconds()
    return Plan(
        occurrence=occurrence,
        next_run_at=epoch(schedule.next_after(now)),
        in_window=in_window,
        key=idempotency_key(schedule.schedule_id, occurrence),
    )
