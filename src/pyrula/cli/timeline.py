"""A run's journal read as a timeline for people: its attempts, its steps, its parked spans.

Pure: it takes the events ``read_events`` returns and does no I/O. An *attempt* is one
``run:started`` (the run was claimed); the attempts after the first say why the run was
started again (the ``run:requeued`` reason before them: ``orphaned`` after a worker died,
``shutdown`` after a drain), which is apart from a step's own tries (``step:failed`` with
a retry). A *step* is one call of the workflow, however many tries it took. A *park* is a
span the run spent sleeping or waiting, from ``run:sleeping``/``run:waiting`` to what
ended it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pyrula.workflows.events import Event, EventType

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


#: What ends a park: the run was woken, signalled, started again, or ended.
_PARK_ENDS = frozenset({
    EventType.RUN_WOKEN, EventType.SIGNAL_RECEIVED, EventType.INTERRUPT_RESUMED,
    EventType.RUN_STARTED, EventType.RUN_COMPLETED, EventType.RUN_ERROR,
    EventType.RUN_CANCELLED, EventType.RUN_CONTINUED,
})


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
    entries: list[dict[str, Any]] = []
    steps: dict[int, dict[str, Any]] = {}
    park: dict[str, Any] | None = None
    requeued: str | None = None
    for event in events:
        kind = event.get("type")
        ts = float(event.get("ts", 0.0))
        if park is not None and kind in _PARK_ENDS:
            park["until"] = iso(ts, precise=True)
            park["seconds"] = round(ts - park.pop("_from"), 3)
            park = None
        if kind == EventType.RUN_REQUEUED:
            requeued = str(event.get("reason", "unknown"))
        elif kind == EventType.RUN_STARTED:
            entries.append({"kind": EntryKind.ATTEMPT, "attempt": event.get("attempt"),
                            "at": iso(ts, precise=True), "worker": event.get("worker"),
                            "after": None if requeued is None else f"requeued: {requeued}"})
            requeued = None
        elif kind == EventType.STEP_STARTED:
            call = int(event.get("call", 0))
            step = steps.get(call)
            if step is None:
                step = {"kind": EntryKind.STEP, "name": event.get("step"), "call": call,
                        "attempts": 0, "started": iso(ts, precise=True), "finished": None,
                        "outcome": StepOutcome.RUNNING}
                steps[call] = step
                entries.append(step)
            step["attempts"] += 1
            step["outcome"] = StepOutcome.RUNNING
        elif kind in (EventType.STEP_COMPLETED, EventType.STEP_FAILED):
            step = steps.get(int(event.get("call", 0)))
            if step is None:
                continue
            step["finished"] = iso(ts, precise=True)
            if kind == EventType.STEP_COMPLETED:
                step["outcome"] = StepOutcome.COMPLETED
            else:
                step["outcome"] = (StepOutcome.RETRYING if event.get("will_retry")
                                   else StepOutcome.FAILED)
        elif kind in (EventType.RUN_SLEEPING, EventType.RUN_WAITING):
            park = {"kind": EntryKind.PARKED, "why": _why_parked(event),
                    "from": iso(ts, precise=True), "until": None, "seconds": None, "_from": ts}
            entries.append(park)
    if park is not None:
        park.pop("_from")
    return entries


def _why_parked(event: Event) -> str:
    if event.get("type") == EventType.RUN_WAITING:
        return f"waiting for signal {event.get('signal')!r}"
    if event.get("reason") == "retry":
        return f"retry of step {event.get('step')!r}"
    return "sleeping"


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
