"""A run's journal read as its history: attempts, step tries and parks, in epoch seconds.

Pure: it takes the events ``read_events`` returns and does no I/O. It is the one reader of
a journal's shape that both ``pyrula runs show`` (``pyrula.cli.timeline``, for people) and
the trace export (``pyrula.workflows.tracing``, for OpenTelemetry) build on, so the two
never disagree about what an attempt or a park is.

An *attempt* is one ``run:started`` (the run was claimed) up to the last event it wrote:
its park, its requeue, the run's end, or the last event before the next claim. A
*try* is one ``step:started`` of a step and what ended it (a step's retries are tries, not
attempts). A *park* is the time the run spent sleeping or waiting, from
``run:sleeping``/``run:waiting`` to what ended it. Each item keeps ``index``, the position
of the event that opened it, so items can be put back in journal order and named stably.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pyrula.workflows.events import TERMINAL_EVENTS, Event, EventType

#: What ends a park: the run was woken, signalled, started again, or ended.
PARK_ENDS = frozenset({
    EventType.RUN_WOKEN, EventType.SIGNAL_RECEIVED, EventType.INTERRUPT_RESUMED,
    EventType.RUN_STARTED, *TERMINAL_EVENTS,
})

#: What an attempt's span of the journal closes with when it gives the run up.
_ATTEMPT_ENDS = frozenset({
    EventType.RUN_SLEEPING, EventType.RUN_WAITING, EventType.RUN_REQUEUED, *TERMINAL_EVENTS,
})


@dataclass(slots=True)
class StepTry:
    name: str
    call: int
    number: int  # the try of the step (1 for its first), as the engine counted it
    index: int
    start: float
    attempt: int | None  # position in ``History.attempts`` of the attempt it ran in
    end: float | None = None
    outcome: str = "running"  # completed | retrying | failed | running
    error: dict[str, Any] | None = None


@dataclass(slots=True)
class Park:
    kind: str  # sleeping | waiting
    why: str
    index: int
    start: float
    event: Event
    end: float | None = None
    ended_by: str | None = None


@dataclass(frozen=True, slots=True)
class PatchMark:
    """A ``patch:applied``: the run took the new branch of patch ``patch`` at ``call``."""

    patch: str
    call: int
    index: int
    at: float
    attempt: int | None  # position in ``History.attempts`` of the attempt that recorded it


@dataclass(slots=True)
class Attempt:
    number: int | None
    worker: str | None
    index: int
    start: float
    end: float
    #: The reason of the requeue that ended the attempt before this one (None: the first,
    #: or the one before parked or ended).
    after: str | None = None
    #: The ``run:requeued`` that ended this attempt, if one did.
    requeue: Event | None = None
    #: The events of recovery and supervision that belong to this attempt (its requeue,
    #: a quarantine's ``run:error``), in journal order.
    notes: list[Event] = field(default_factory=list)
    closed: bool = False
    #: A fork's first attempt: the run it was forked from, the call and the step's name
    #: (from its ``run:started``; a fork made before the step was recorded there has
    #: none), else None.
    forked_from: str | None = None
    from_call: int | None = None
    from_step: str | None = None


@dataclass(slots=True)
class History:
    workflow: str | None = None
    submitted: float | None = None
    first: float | None = None
    last: float | None = None
    final: Event | None = None
    attempts: list[Attempt] = field(default_factory=list)
    tries: list[StepTry] = field(default_factory=list)
    parks: list[Park] = field(default_factory=list)
    signals: list[Event] = field(default_factory=list)
    patches: list[PatchMark] = field(default_factory=list)
    #: A fork's ``run:forked`` (the run and step it forks) and its position, if any.
    forked: tuple[int, Event] | None = None

    @property
    def status(self) -> str:
        """completed | failed | cancelled | continued | queued | running | parked."""
        if self.final is not None:
            return {
                EventType.RUN_COMPLETED: "completed", EventType.RUN_ERROR: "failed",
                EventType.RUN_CANCELLED: "cancelled", EventType.RUN_CONTINUED: "continued",
            }[EventType(self.final["type"])]
        if self.parks and self.parks[-1].end is None:
            return "parked"
        if self.attempts and not self.attempts[-1].closed:
            return "running"
        return "queued"


def _attempt(event: Event, index: int, ts: float, requeued: str | None) -> Attempt:
    """The attempt a ``run:started`` begins (``requeued``: why the last one ended)."""
    origin, step = event.get("forked_from"), event.get("from_step")
    return Attempt(event.get("attempt"), event.get("worker"), index, ts, ts, after=requeued,
                   forked_from=None if origin is None else str(origin),
                   from_call=None if origin is None else int(event.get("from_call") or 0),
                   from_step=None if origin is None or step is None else str(step))


def _end_try(step: StepTry | None, event: Event, ts: float) -> None:
    """Close the open try ``step`` (None: none was open) with its outcome ``event``."""
    if step is None:
        return
    step.end = ts
    if event.get("type") == EventType.STEP_COMPLETED:
        step.outcome = "completed"
    else:
        step.outcome = "retrying" if event.get("will_retry") else "failed"
        step.error = {"type": event.get("error_type"), "message": event.get("message")}


def read_history(events: Sequence[Event]) -> History:
    """The history of the run whose journal is ``events`` (a prefix of it reads as the run
    so far: what has not ended yet has ``end`` None, or for an attempt its last event)."""
    h = History()
    park: Park | None = None
    requeued: str | None = None
    open_tries: dict[int, StepTry] = {}
    for index, event in enumerate(events):
        kind = event.get("type")
        ts = float(event.get("ts", 0.0))
        h.first = ts if h.first is None else h.first
        h.last = ts
        attempt = h.attempts[-1] if h.attempts else None
        if attempt is not None and not attempt.closed:
            attempt.end = ts
            attempt.closed = kind in _ATTEMPT_ENDS
        if park is not None and kind in PARK_ENDS:
            park.end, park.ended_by = ts, str(kind)
            park = None
        if kind == EventType.RUN_SUBMITTED:
            h.workflow = event.get("name")
            h.submitted = ts
        elif kind == EventType.RUN_STARTED:
            h.attempts.append(_attempt(event, index, ts, requeued))
            requeued = None
        elif kind == EventType.RUN_REQUEUED:
            requeued = str(event.get("reason", "unknown"))
            if attempt is not None:
                attempt.requeue = event
                attempt.notes.append(event)
        elif kind == EventType.STEP_STARTED:
            call = int(event.get("call", 0))
            started = StepTry(str(event.get("step")), call, int(event.get("attempt") or 1), index,
                              ts, len(h.attempts) - 1 if h.attempts else None)
            h.tries.append(started)
            open_tries[call] = started
        elif kind in (EventType.STEP_COMPLETED, EventType.STEP_FAILED):
            _end_try(open_tries.pop(int(event.get("call", 0)), None), event, ts)
        elif kind in (EventType.RUN_SLEEPING, EventType.RUN_WAITING):
            park = Park("waiting" if kind == EventType.RUN_WAITING else "sleeping",
                        why_parked(event), index, ts, event)
            h.parks.append(park)
        elif kind in (EventType.SIGNAL_RECEIVED, EventType.INTERRUPT_RESUMED):
            h.signals.append(event)
        elif kind == EventType.RUN_FORKED:
            h.forked = (index, event)
        elif kind == EventType.PATCH_APPLIED:
            h.patches.append(PatchMark(str(event.get("patch")), int(event.get("call", 0)), index,
                                       ts, len(h.attempts) - 1 if h.attempts else None))
        if kind in TERMINAL_EVENTS:
            h.final = event
            if attempt is not None and kind == EventType.RUN_ERROR:
                attempt.notes.append(event)
    return h


def why_parked(event: Event) -> str:
    if event.get("type") == EventType.RUN_WAITING:
        return f"waiting for signal {event.get('signal')!r}"
    if event.get("reason") == "retry":
        return f"retry of step {event.get('step')!r}"
    return "sleeping"
