"""Replay: what a run's journal already says about each operation its code performs.

The workflow function runs from the top on every attempt, and each operation it performs
(a step call, a sleep, a wait, a recorded value) takes the next *call index*. Replay looks
the index up in the journal: the name recorded there must be the one the code uses now
(:class:`NonDeterminismError` otherwise), and what was recorded decides the operation (a
step's result or failure, whether a timer fired, which signal a wait takes). What the
journal does not hold yet comes back as the events the attempt is to write (its
*commands*, built by the functions at the end of this module).

Pure: events and times in, decisions and events out. No asyncio, no store and no clock:
the caller passes ``now``. The state kept is the journal (as given, plus what the attempt
absorbed since), the count of operations taken and the signals already consumed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pyrula.workflows.errors import NonDeterminismError, StepFailed
from pyrula.workflows.events import (
    CHILD_SIGNAL,
    INTERRUPT_SIGNAL,
    PATCH_OP,
    UPDATE_SIGNAL,
    Event,
    EventType,
    make_event,
)
from pyrula.workflows.handlers import UpdateRequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StepHistory:
    """What the journal holds of one step call (or of one recorded value, which is
    journaled as a completed step named after the value's operation)."""

    completed: bool = False
    result: Any = None
    #: The step failed for good: what its call raises again on replay.
    failure: StepFailed | None = None
    #: Tries that failed and were to be retried.
    failures: int = 0
    #: When the next try is due (from the last retried failure).
    retry_at: float | None = None


#: The history of a call the journal does not hold yet.
NOTHING_RECORDED = StepHistory()


@dataclass(frozen=True, slots=True)
class SleepDecision:
    """``wake_at`` None: the sleep is over (or was never one), the code goes on; else it
    blocks until ``wake_at``. ``command`` is the ``run:sleeping`` to write first, for a
    sleep the journal does not hold yet."""

    wake_at: float | None
    command: Event | None = None


class WaitTurn(Enum):
    #: The wait takes a signal and returns its ``payload``.
    SIGNALLED = "signalled"
    #: No signal is buffered: the wait is ``waiting`` (recorded, or new as ``command``).
    OPEN = "open"
    #: The journal decided the timeout first: the wait returns None.
    TIMED_OUT = "timed_out"
    #: The timeout is due and undecided: write ``command`` (a ``run:woken``), look again.
    DECIDE_TIMEOUT = "decide_timeout"
    #: Nothing decides it yet: block until a signal comes or ``wake_at`` (if any) passes.
    BLOCK = "block"


@dataclass(frozen=True, slots=True)
class WaitDecision:
    turn: WaitTurn
    payload: Any = None
    waiting: Event | None = None
    wake_at: float | None = None
    command: Event | None = None


class Replay:
    """The journal of one run, indexed for replay, and the operations taken so far."""

    def __init__(self, events: Sequence[Event], *, workflow: str, run_id: str) -> None:
        self.workflow = workflow
        self.run_id = run_id
        self.journal: list[Event] = []
        self._by_call: dict[int, list[Event]] = {}
        self._signals: list[Event] = []
        self._woken: list[Event] = []
        self._consumed: set[int] = set()
        #: Patch id -> the answer ``patch`` gave it: one answer per id for the whole run.
        self._patches: dict[str, bool] = {}
        #: The seq of the last child-end nudge written as a ``pyrula.child`` signal (by an
        #: older pyrula; the store's ``nudge`` writes no event) in the journal.
        self.child_signal_seq = 0
        #: Updates: the requests in journal order, the applied ones by the call at which
        #: they were applied (until replayed), and the ids applied or being applied.
        self._update_requests: dict[str, UpdateRequest] = {}
        self._updates_at: dict[int, list[Event]] = {}
        self._updates_done: set[str] = set()
        self._index(events)
        # Calls the journal held when the attempt began: the code replays until past them.
        self._known_calls = max(self._by_call, default=0)
        self._known_update_call = max(self._updates_at, default=0)
        self._next_call = 0

    # --- the index ------------------------------------------------------------------

    def _index(self, events: Iterable[Event]) -> None:
        for event in events:
            self.journal.append(event)
            call = event.get("call")
            if call is not None:
                self._by_call.setdefault(int(call), []).append(event)
            type_ = event["type"]
            if type_ == EventType.SIGNAL_RECEIVED and event.get("name") == UPDATE_SIGNAL:
                request = UpdateRequest.of(event)
                if request is not None:
                    self._update_requests.setdefault(request.id, request)
            elif type_ in (EventType.SIGNAL_RECEIVED, EventType.INTERRUPT_RESUMED):
                if event.get("name") == CHILD_SIGNAL:
                    self.child_signal_seq = max(self.child_signal_seq, int(event.get("seq", 0)))
                    continue  # a nudge to look at the children again, never a wait's
                self._signals.append(event)
            elif type_ == EventType.RUN_WOKEN:
                self._woken.append(event)
            elif type_ == EventType.UPDATE_APPLIED:
                self._index_applied(event)

    def _index_applied(self, event: Event) -> None:
        update_id = str(event.get("update"))
        if update_id in self._updates_done:
            return  # this attempt applied it: it is not to be replayed again
        self._updates_done.add(update_id)
        self._updates_at.setdefault(int(event.get("at_call", 0)), []).append(event)

    @property
    def last_seq(self) -> int:
        return int(self.journal[-1]["seq"]) if self.journal else 0

    def has_gap(self, written: int, last_seq: int) -> bool:
        """Whether others wrote events between the journal's end and the ``written``
        events the attempt just wrote, which end at ``last_seq``."""
        return last_seq - written != self.last_seq

    def absorb(self, written: list[Event], last_seq: int, others: Iterable[Event] = ()) -> None:
        """Give the events just written their seqs (they end at ``last_seq``) and add them
        to the journal, after those of ``others`` (events read back from the store) that
        were written before them."""
        first = last_seq - len(written) + 1
        for offset, event in enumerate(written):
            event["seq"] = first + offset
        if not others:  # the common case, on every write: nobody else wrote in between
            self._index(written)
            return
        before = sorted((e for e in others if int(e["seq"]) < first), key=lambda e: int(e["seq"]))
        self._index(before + written)

    def started_at(self) -> float | None:
        """When the run first started (its first ``run:started``), if it has."""
        for event in self.journal:
            if event["type"] == EventType.RUN_STARTED:
                return float(event["ts"])
        return None

    # --- calls ----------------------------------------------------------------------

    @property
    def is_replaying(self) -> bool:
        # Between operations the count is of those already taken, so the code is
        # replaying while the next one is still in the journal.
        return self._next_call < self._known_calls

    @property
    def calls_taken(self) -> int:
        return self._next_call

    def take_call(self) -> int:
        """The call index of the operation the code performs next."""
        self._next_call += 1
        return self._next_call

    def recorded(self, call: int, name: str) -> list[Event]:
        """Events recorded for ``call``, after checking they were written by ``name``."""
        events = self._by_call.get(call, [])
        for event in events:
            recorded = event.get("step") or event.get("op")
            if recorded is not None and recorded != name:
                raise NonDeterminismError(
                    f"workflow {self.workflow!r} run {self.run_id}: the journal has "
                    f"{_divergence(event, recorded)} at call {call}, but the code now "
                    f"calls {name!r} there{_divergence_hint(event)}"
                )
        return events

    def unreplayed(self) -> NonDeterminismError | None:
        """Once the code has returned: a call the journal records that it never made."""
        calls = [c for c in self._by_call if c > self._next_call and self._by_call[c]]
        if not calls:
            return None
        return NonDeterminismError(
            f"workflow {self.workflow!r} run {self.run_id}: the code returned after "
            f"{self._next_call} calls, but the journal records call {min(calls)}"
        )

    # --- steps and values -------------------------------------------------------------

    def step(self, call: int, name: str) -> StepHistory:
        if call not in self._by_call:
            return NOTHING_RECORDED  # a new step: nothing to check, nothing to replay
        failures = 0
        retry_at: float | None = None
        for event in self.recorded(call, name):
            if event["type"] == EventType.STEP_COMPLETED:
                return StepHistory(completed=True, result=event.get("result"))
            if event["type"] == EventType.STEP_FAILED:
                if not event.get("will_retry"):
                    failure = StepFailed(
                        name, str(event.get("error_type")), str(event.get("message")),
                        int(event.get("attempt", failures + 1)),
                    )
                    return StepHistory(failure=failure, failures=failures)
                failures += 1
                retry_at = event.get("retry_at")
        return StepHistory(failures=failures, retry_at=retry_at)

    def value(self, call: int, op: str) -> StepHistory:
        for event in self.recorded(call, op):
            if event["type"] == EventType.STEP_COMPLETED:
                return StepHistory(completed=True, result=event.get("result"))
        return StepHistory()

    def children(self, call: int, op: str) -> list[Event]:
        """What a child call (``op``) at ``call`` recorded: its ``child:started`` and
        ``child:ended`` events, in journal order."""
        return [
            e for e in self.recorded(call, op)
            if e["type"] in (EventType.CHILD_STARTED, EventType.CHILD_ENDED)
        ]

    def retry_recorded(self, call: int, retry_at: float) -> bool:
        """Whether the wait for the retry of step ``call`` due at ``retry_at`` is journaled."""
        return any(
            e["type"] == EventType.RUN_SLEEPING and e.get("wake_at") == retry_at
            for e in self._by_call.get(call, [])
        )

    # --- patches ----------------------------------------------------------------------

    def patch(self, patch_id: str, now: float) -> tuple[bool, Event | None]:
        """Whether the code takes the new branch of patch ``patch_id`` at its next call,
        and the marker to write if that is decided now; the same answer for every call of
        the id in the run.

        The journal holds the patch's marker at the next call: True (the call is taken).
        It holds other events there or later: False, the run was recorded before the
        patch and keeps to the old branch (no call is taken: the journal's next entry is
        the old branch's). It holds nothing from there on: True, with a new marker at a
        new call, so every replay of the run takes the same branch.
        """
        known = self._patches.get(patch_id)
        if known is not None:
            return known, None
        marker: Event | None = None
        if self._marked(self._next_call + 1, patch_id):
            self.take_call()
        elif self.is_replaying:
            self._patches[patch_id] = False
            return False, None
        else:
            marker = patch_applied(now, self.take_call(), patch_id)
        self._patches[patch_id] = True
        return True, marker

    def deprecated_patch(self, patch_id: str) -> None:
        """Skip the marker of ``patch_id`` if the journal holds it at the next call (a run
        that took the patch before it was deprecated); else nothing: no call is taken."""
        if self._marked(self._next_call + 1, patch_id):
            self.take_call()

    def _marked(self, call: int, patch_id: str) -> bool:
        return any(
            e["type"] == EventType.PATCH_APPLIED and e.get("patch") == patch_id
            for e in self._by_call.get(call, ())
        )

    # --- updates ----------------------------------------------------------------------

    def recorded_updates(self, call: int) -> list[tuple[UpdateRequest, Event]]:
        """The updates the journal records as applied at ``call``, in the order applied,
        each with its request; handed out once."""
        applied = self._updates_at.pop(call, [])
        found = []
        for event in applied:
            request = self._update_requests.get(str(event.get("update")))
            if request is not None:
                found.append((request, event))
        return found

    def updates_open(self, call: int) -> bool:
        """Whether new updates may be applied at ``call``: the journal holds no operation
        and no applied update past it (else its replay decides what was applied where)."""
        return not self.is_replaying and call >= self._known_update_call

    def pending_updates(self) -> list[UpdateRequest]:
        """The requests in the journal not applied yet, in the order they arrived."""
        return [r for r in self._update_requests.values() if r.id not in self._updates_done]

    def take_update(self, update_id: str) -> None:
        """The attempt applies update ``update_id`` now: it is pending no more."""
        self._updates_done.add(update_id)

    # --- timers and signals -------------------------------------------------------------

    def timer_fired(self, since_seq: int, wake_at: float) -> Event | None:
        """The first ``run:woken`` after ``since_seq`` that fired at or past ``wake_at``."""
        for event in self._woken:
            if int(event["seq"]) <= since_seq:
                continue
            if event.get("reason") == "manual" or float(event["ts"]) >= wake_at:
                return event
        return None

    def first_unconsumed(self, signal: str) -> Event | None:
        """The oldest ``signal`` in the journal that no wait has taken yet."""
        for event in self._signals:
            if event.get("name") == signal and int(event["seq"]) not in self._consumed:
                return event
        return None

    def sleep(
        self, call: int, *, now: float, seconds: float | None, until: float | None
    ) -> SleepDecision:
        recorded = self.recorded(call, "pyrula.sleep")
        if seconds is not None and seconds <= 0:
            return SleepDecision(None)
        event = next((e for e in recorded if e["type"] == EventType.RUN_SLEEPING), None)
        if event is None:
            wake_at = until if until is not None else now + float(seconds or 0.0)
            if wake_at <= now:
                return SleepDecision(None)
            return SleepDecision(wake_at, sleeping(now, call, wake_at))
        wake_at = float(event["wake_at"])
        if "seq" in event and self.timer_fired(int(event["seq"]), wake_at) is not None:
            return SleepDecision(None)
        if wake_at <= now:
            return SleepDecision(None)
        return SleepDecision(wake_at)

    def open_wait(
        self, call: int, op: str, signal: str, *, now: float, timeout: float | None,
        interrupt: Any,
    ) -> WaitDecision:
        """The first turn of a wait: the wait the journal holds, else a signal already
        buffered, else a new wait to record."""
        waiting = next(
            (e for e in self.recorded(call, op) if e["type"] == EventType.RUN_WAITING), None
        )
        if waiting is not None:
            return WaitDecision(WaitTurn.OPEN, waiting=waiting)
        timeout_at = None if timeout is None else now + timeout
        candidate = self.first_unconsumed(signal)
        if candidate is not None:
            return self._take(candidate)
        # Even a zero timeout is recorded and decided durably (resolve_wait): on replay the
        # journal may hold a signal that arrived later, which this wait must not take.
        event = waiting_for(now, op, call, signal, timeout_at, interrupt)
        return WaitDecision(WaitTurn.OPEN, waiting=event, command=event)

    def resolve_wait(self, call: int, signal: str, waiting: Event, now: float) -> WaitDecision:
        """The next turn of the wait ``waiting``: in journal order, a signal wins only if
        it came before the timeout fired, so the race ends the same way on every replay."""
        timeout_at = waiting.get("timeout_at")
        candidate = self.first_unconsumed(signal)
        fired = None
        if timeout_at is not None and "seq" in waiting:
            fired = self.timer_fired(int(waiting["seq"]), float(timeout_at))
        signal_first = fired is None or (
            candidate is not None and int(candidate["seq"]) < int(fired["seq"])
        )
        if candidate is not None and signal_first:
            return self._take(candidate)
        if fired is not None:
            return WaitDecision(WaitTurn.TIMED_OUT)
        if timeout_at is not None and float(timeout_at) <= now:
            # Decide the timeout durably, so a signal arriving later cannot win on replay.
            return WaitDecision(WaitTurn.DECIDE_TIMEOUT, command=woken_by_timeout(now, call))
        wake_at = None if timeout_at is None else float(timeout_at)
        return WaitDecision(WaitTurn.BLOCK, wake_at=wake_at)

    def _take(self, signal: Event) -> WaitDecision:
        self._consumed.add(int(signal["seq"]))
        return WaitDecision(WaitTurn.SIGNALLED, payload=signal.get("payload"))


def _divergence(event: Event, recorded: str) -> str:
    """What the journal has at a call the code now makes differently, for the message."""
    if event["type"] == EventType.PATCH_APPLIED:
        return f"the marker of patch {event.get('patch')!r}"
    return repr(recorded)


def _divergence_hint(event: Event) -> str:
    if event["type"] == EventType.PATCH_APPLIED:
        return (" (the run took that patch: keep ctx.patched or ctx.deprecate_patch of "
                "its id at this point of the code)")
    return ""


# --- the events the attempt writes ------------------------------------------------------


# The two events of every step are built as literals: they are on every step's path.
def step_started(now: float, step: str, call: int, attempt: int) -> Event:
    return {"type": EventType.STEP_STARTED.value, "ts": now, "step": step, "call": call,
            "attempt": attempt}


def step_completed(now: float, step: str, call: int, result: Any) -> Event:
    return {"type": EventType.STEP_COMPLETED.value, "ts": now, "step": step, "call": call,
            "result": result}


def step_failed(
    now: float, step: str, call: int, attempt: int, error_type: str, message: str,
    *, retry_at: float | None = None,
) -> Event:
    """A try of a step failed; it is retried at ``retry_at`` if that is given."""
    fields: dict[str, Any] = {}
    if retry_at is not None:
        fields["retry_at"] = retry_at
    return make_event(
        EventType.STEP_FAILED, now, step=step, call=call, attempt=attempt,
        error_type=error_type, message=message, will_retry=retry_at is not None, **fields,
    )


def sleeping(now: float, call: int, wake_at: float) -> Event:
    return make_event(EventType.RUN_SLEEPING, now, op="pyrula.sleep", call=call, wake_at=wake_at)


def retry_sleeping(now: float, step: str, call: int, wake_at: float) -> Event:
    """The run parks until the retry of step ``call`` is due."""
    return make_event(
        EventType.RUN_SLEEPING, now, step=step, call=call, wake_at=wake_at, reason="retry"
    )


def waiting_for(
    now: float, op: str, call: int, signal: str, timeout_at: float | None, interrupt: Any
) -> Event:
    fields: dict[str, Any] = {"op": op, "call": call, "signal": signal}
    if timeout_at is not None:
        fields["timeout_at"] = timeout_at
    if signal == INTERRUPT_SIGNAL:
        fields["interrupt"] = interrupt
    return make_event(EventType.RUN_WAITING, now, **fields)


def woken_by_timeout(now: float, call: int) -> Event:
    return make_event(EventType.RUN_WOKEN, now, reason="timeout", call=call)


def patch_applied(now: float, call: int, patch_id: str) -> Event:
    return make_event(EventType.PATCH_APPLIED, now, op=PATCH_OP, call=call, patch=patch_id)


def run_completed(now: float, result: Any) -> Event:
    return make_event(EventType.RUN_COMPLETED, now, result=result)


def run_cancelled(now: float) -> Event:
    return make_event(EventType.RUN_CANCELLED, now)


def run_continued(now: float) -> Event:
    return make_event(EventType.RUN_CONTINUED, now)
