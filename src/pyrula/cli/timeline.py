"""A run's journal read as a timeline for people: its attempts, its steps, its parked spans.

Pure: it takes the events ``read_events`` returns and does no I/O. An *attempt* is one
``run:started`` (the run was claimed); the attempts after the first say why the run was
started again (the ``run:requeued`` reason before them: ``orphaned`` after a worker died,
``shutdown`` after a drain), which is apart from a step's own tries (``step:failed`` with
a retry). A *step* is one call of the workflow, however many tries it took. A *park* is a
span the run spent sleeping or waiting, from ``run:sleeping``/``run:waiting`` to what
ended it. The journal is read by ``pyrula.workflows.history`` (which the trace export
reads it with too); this module only words it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pyrula.workflows.events import Event
from pyrula.workflows.history import read_history

logger = logging.getLogger(__name__)


class EntryKind(StrEnum):
    ATTEMPT = "attempt"
    STEP = "step"
    PARKED = "parked"


class StepOutcome(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    RETRYING = "retrying"  # a try failed and the step is tried again
    FAILED = "failed"  # a try failed and no retry is left


def iso(ts: float | None, *, precise: bool = False) -> str | None:
    """Epoch seconds as ISO-8601 UTC (``2026-12-01T16:40:00Z``); None stays None."""
    if ts is None:
        return None
    moment = datetime.fromtimestamp(ts, UTC)
    text = moment.isoformat(timespec="milliseconds" if precise else "seconds")
    return text.replace("+00:00", "Z")


def timeline(events: Sequence[Event]) -> list[dict[str, Any]]:
    """The entries of the run's timeline in journal order, each a dict with ``kind``:

    * ``attempt``: ``attempt``, ``at``, ``worker``, ``after`` (None for the first, else
      ``requeued: <reason>``);
    * ``step``: ``name``, ``call``, ``attempts`` (tries), ``started``, ``finished``,
      ``outcome`` (``completed``, ``failed``, ``retrying`` or ``running``);
    * ``parked``: ``why``, ``from``, ``until`` (None while still parked), ``seconds``.
    """
    history = read_history(events)
    placed: list[tuple[int, dict[str, Any]]] = []
    for attempt in history.attempts:
        after = None if attempt.after is None else f"requeued: {attempt.after}"
        placed.append((attempt.index, {
            "kind": EntryKind.ATTEMPT, "attempt": attempt.number,
            "at": iso(attempt.start, precise=True), "worker": attempt.worker, "after": after,
        }))
    steps: dict[int, dict[str, Any]] = {}
    for tried in history.tries:
        step = steps.get(tried.call)
        if step is None:
            step = steps[tried.call] = {
                "kind": EntryKind.STEP, "name": tried.name, "call": tried.call, "attempts": 0,
                "started": iso(tried.start, precise=True), "finished": None,
            }
            placed.append((tried.index, step))
        step["attempts"] += 1
        step["outcome"] = StepOutcome(tried.outcome)
        if tried.end is not None:
            step["finished"] = iso(tried.end, precise=True)
    for park in history.parks:
        placed.append((park.index, {
            "kind": EntryKind.PARKED, "why": park.why, "from": iso(park.start, precise=True),
            "until": iso(park.end, precise=True),
            "seconds": None if park.end is None else round(park.end - park.start, 3),
        }))
    return [entry for _, entry in sorted(placed, key=lambda item: item[0])]


def describe(entry: dict[str, Any]) -> str:
    """One line of the timeline for people."""
    if entry["kind"] == EntryKind.ATTEMPT:
        after = f" ({entry['after']})" if entry["after"] else ""
        return f"{entry['at']}  attempt {entry['attempt']}{after} on {entry['worker']}"
    if entry["kind"] == EntryKind.STEP:
        tries = "try" if entry["attempts"] == 1 else "tries"
        ended = f" -> {entry['finished']}" if entry["finished"] else ""
        return (f"{entry['started']}  step {entry['name']} (call {entry['call']}): "
                f"{entry['outcome'].value}, {entry['attempts']} {tries}{ended}")
    held = f"{entry['seconds']} s until {entry['until']}" if entry["until"] else "still parked"
    return f"{entry['from']}  parked, {entry['why']}: {held}"
