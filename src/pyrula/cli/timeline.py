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

from pyrula.timestamps import iso_utc
from pyrula.workflows.events import Event
from pyrula.workflows.history import History, read_history

logger = logging.getLogger(__name__)


class EntryKind(StrEnum):
    ATTEMPT = "attempt"
    STEP = "step"
    PARKED = "parked"
    PATCH = "patch"
    FORKED = "forked"


class StepOutcome(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    RETRYING = "retrying"  # a try failed and the step is tried again
    FAILED = "failed"  # a try failed and no retry is left


def iso(ts: float | None, *, precise: bool = False) -> str | None:
    """Epoch seconds as ISO-8601 UTC; None stays None. ``precise`` (what JSON carries) is
    ``pyrula.timestamps.iso_utc``'s form (``2026-12-01T16:40:00.123Z``); without it, the
    whole second a table shows (``2026-12-01T16:40:00Z``)."""
    if ts is None:
        return None
    if precise:
        return iso_utc(ts)
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def death(evidence: dict[str, Any]) -> str:
    """How the process of an attempt that crashed ended, as the fleet recorded it:
    ``vm-12-ab died: SIGKILL, pid 12, RSS 23 MB``; empty without a process's evidence."""
    facts = [str(evidence[key]) for key in ("exit_signal",) if evidence.get(key)]
    if evidence.get("exit_signal") is None and evidence.get("exit"):
        facts.append(str(evidence["exit"]))
    if evidence.get("pid"):
        facts.append(f"pid {evidence['pid']}")
    if evidence.get("rss_bytes"):
        facts.append(f"RSS {int(evidence['rss_bytes']) / 1e6:.0f} MB")
    if evidence.get("killed_for"):
        facts.append(f"killed: {evidence['killed_for']}")
    if not facts:
        return ""
    worker = evidence.get("worker")
    return f"{worker + ' ' if worker else 'its worker '}died: {', '.join(facts)}"


def _attempt_entries(history: History) -> list[tuple[int, dict[str, Any]]]:
    """An ``attempt`` entry per attempt, at its ``run:started``."""
    placed: list[tuple[int, dict[str, Any]]] = []
    previous = None
    for attempt in history.attempts:
        after = None if attempt.after is None else f"requeued: {attempt.after}"
        found: Any = previous.requeue.get("detail") if previous and previous.requeue else None
        evidence: dict[str, Any] | None = dict(found) if isinstance(found, dict) else None
        if after is not None and evidence:
            after += f"; {death(evidence)}" if death(evidence) else ""
        placed.append((attempt.index, {
            "kind": EntryKind.ATTEMPT, "attempt": attempt.number,
            "at": iso(attempt.start, precise=True), "worker": attempt.worker, "after": after,
            "evidence": evidence, "forked_from": attempt.forked_from,
            "from_call": attempt.from_call, "from_step": attempt.from_step,
        }))
        previous = attempt
    return placed


def _step_entries(history: History) -> list[tuple[int, dict[str, Any]]]:
    """A ``step`` entry per step call (its tries counted), at its first try."""
    placed: list[tuple[int, dict[str, Any]]] = []
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
    return placed


def timeline(events: Sequence[Event]) -> list[dict[str, Any]]:
    """The entries of the run's timeline in journal order, each a dict with ``kind``:

    * ``attempt``: ``attempt``, ``at``, ``worker``, ``after`` (None for the first, else
      ``requeued: <reason>``, with how the process died where the fleet recorded it),
      ``evidence`` (that record: pid, exit signal, RSS...; None without one),
      ``forked_from``, ``from_call`` and ``from_step`` (a fork's first attempt: the run,
      call and step it was forked from; else None);
    * ``step``: ``name``, ``call``, ``attempts`` (tries), ``started``, ``finished``,
      ``outcome`` (``completed``, ``failed``, ``retrying`` or ``running``);
    * ``parked``: ``why``, ``from``, ``until`` (None while still parked), ``seconds``;
    * ``patch``: ``patch`` (its id), ``call``, ``at``: the run took the new branch of a
      ``ctx.patched`` there;
    * ``forked``: ``from_run``, ``from_step``, ``from_call``, ``reused`` (step calls),
      ``at``: the run is a fork, seeded with what that run recorded before that step.
    """
    history = read_history(events)
    placed = _attempt_entries(history) + _step_entries(history)
    for park in history.parks:
        placed.append((park.index, {
            "kind": EntryKind.PARKED, "why": park.why, "from": iso(park.start, precise=True),
            "until": iso(park.end, precise=True),
            "seconds": None if park.end is None else round(park.end - park.start, 3),
        }))
    for mark in history.patches:
        placed.append((mark.index, {
            "kind": EntryKind.PATCH, "patch": mark.patch, "call": mark.call,
            "at": iso(mark.at, precise=True),
        }))
    if history.forked is not None:
        index, event = history.forked
        placed.append((index, {
            "kind": EntryKind.FORKED, "from_run": event.get("from_run"),
            "from_step": event.get("from_step"), "from_call": event.get("from_call"),
            "reused": event.get("reused"), "at": iso(float(event["ts"]), precise=True),
        }))
    return [entry for _, entry in sorted(placed, key=lambda item: item[0])]


def describe(entry: dict[str, Any]) -> str:
    """One line of the timeline for people."""
    if entry["kind"] == EntryKind.ATTEMPT:
        after = f" ({entry['after']})" if entry["after"] else ""
        line = f"{entry['at']}  attempt {entry['attempt']}{after} on {entry['worker']}"
        if entry.get("forked_from") is not None:
            step = entry.get("from_step")
            at = f"step {step} (call {entry['from_call']})" if step else \
                f"call {entry['from_call']}"
            line += f", forked from {entry['forked_from']} at {at}"
        return line
    if entry["kind"] == EntryKind.STEP:
        tries = "try" if entry["attempts"] == 1 else "tries"
        ended = f" -> {entry['finished']}" if entry["finished"] else ""
        return (f"{entry['started']}  step {entry['name']} (call {entry['call']}): "
                f"{entry['outcome'].value}, {entry['attempts']} {tries}{ended}")
    if entry["kind"] == EntryKind.FORKED:
        return (f"{entry['at']}  forked from run {entry['from_run']} at step "
                f"{entry['from_step']} (call {entry['from_call']}), reusing "
                f"{entry['reused']} step call(s)")
    if entry["kind"] == EntryKind.PATCH:
        return f"{entry['at']}  patch {entry['patch']} applied (call {entry['call']})"
    held = f"{entry['seconds']} s until {entry['until']}" if entry["until"] else "still parked"
    return f"{entry['from']}  parked, {entry['why']}: {held}"
