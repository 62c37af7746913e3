"""What a run's code waits on, and what the run parks on once nothing else runs.

An operation that must wait for time or a signal (a sleep, a wait, a retry delay too
long to wait out in place) blocks on a :class:`Blocker`; a step in progress means the
code is still running. The attempt loop parks the run only when no step is in progress
and every branch of the code is blocked, on the earliest timer and on every signal
awaited (:meth:`Blockers.plan`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pyrula.workflows.events import INTERRUPT_SIGNAL

logger = logging.getLogger(__name__)


class BlockerKind(Enum):
    SLEEP = "sleep"
    WAIT = "wait"
    RETRY = "retry"
    #: Waiting for children to end: woken by their nudge (the store's ``nudge``; a
    #: ``pyrula.child`` signal in older journals) or a re-check timer.
    CHILD = "child"


@dataclass(slots=True)
class Blocker:
    """An operation waiting for the run to be woken: a timer, a signal, or both."""

    call: int
    future: asyncio.Future[Any]
    wake_at: float | None = None
    signal: str | None = None
    interrupt: Any = None
    kind: BlockerKind = BlockerKind.SLEEP
    #: A child wait: the seq of the last ``pyrula.child`` signal in the journal when it
    #: last looked at its children (older journals; the store's nudge writes none).
    since_seq: int = 0


@dataclass(frozen=True, slots=True)
class ParkPlan:
    """What a parked run waits for: a timer (None: signals alone), signals, and the
    payload of the interrupt it awaits, if it does."""

    wake_at: float | None
    signals: list[str]
    interrupt: Any


#: The blockers that look again at the journal or the store when the run is nudged.
_LOOKS_AGAIN = frozenset({BlockerKind.WAIT, BlockerKind.CHILD})


class Blockers:
    """The blocked operations of one attempt and its count of steps in progress. Each
    change the attempt loop must look at sets ``wake``."""

    def __init__(
        self, wake: asyncio.Event, waiting: Callable[[], contextlib.AbstractContextManager[None]]
    ) -> None:
        self._wake = wake
        self._waiting = waiting
        self._by_call: dict[int, Blocker] = {}
        self.steps_running = 0

    @property
    def any(self) -> bool:
        """Some operation of the code is blocked."""
        return bool(self._by_call)

    async def block(
        self, call: int, *, wake_at: float | None = None, signal: str | None = None,
        interrupt: Any = None, kind: BlockerKind = BlockerKind.SLEEP, since_seq: int = 0,
    ) -> Any:
        """Block operation ``call`` until the loop resolves it (its timer is due, or a
        wait is to look at the journal again)."""
        future = asyncio.get_running_loop().create_future()
        self._by_call[call] = Blocker(
            call, future, wake_at, signal, interrupt, kind, since_seq
        )
        self._wake.set()
        try:
            with self._waiting():
                return await future
        finally:
            self._by_call.pop(call, None)

    @contextlib.contextmanager
    def step_in_progress(self) -> Iterator[None]:
        """Count a step as running (executing, or waiting out a short retry delay).

        The attempt parks only when no step is in progress; when the last one ends, the
        loop looks again.
        """
        self.steps_running += 1
        try:
            yield
        finally:
            self.steps_running -= 1
            if self._by_call:
                self._wake.set()

    def any_resolved(self) -> bool:
        """Some blocked operation was resolved and has yet to go on."""
        return any(b.future.done() for b in self._by_call.values())

    def due(self, now: float) -> list[Blocker]:
        return [b for b in self._by_call.values() if b.wake_at is not None and b.wake_at <= now]

    def wake_due(self, due: list[Blocker]) -> None:
        """Resolve the ``due`` timers (a due wait learns its timeout from the journal, so
        it only looks again, with every other wait)."""
        for blocker in due:
            if blocker.kind is not BlockerKind.WAIT and not blocker.future.done():
                blocker.future.set_result(None)
        self.rewake_waits()

    def rewake_waits(self) -> None:
        """Let every waiting branch re-check the journal (a signal or timeout may be in)."""
        for blocker in list(self._by_call.values()):
            if blocker.kind in _LOOKS_AGAIN and not blocker.future.done():
                blocker.future.set_result(None)

    def children_nudged(self, child_signal_seq: int) -> bool:
        """A child wait looked at its children before the last ``pyrula.child`` signal
        the journal holds (it came in with other events): it must look again rather than
        park. A nudge through the store writes no event: a park it refuses makes the
        waits look again instead (see ``rewake_waits``)."""
        return any(
            b.kind is BlockerKind.CHILD and b.since_seq < child_signal_seq
            for b in self._by_call.values()
        )

    def plan(self, deadline: float | None) -> ParkPlan:
        """What the run parks on: the earliest timer (the run's ``deadline`` included)."""
        blockers = list(self._by_call.values())
        wakes = [b.wake_at for b in blockers if b.wake_at is not None]
        if deadline is not None:
            wakes.append(deadline)
        return ParkPlan(
            wake_at=min(wakes) if wakes else None,
            signals=sorted({b.signal for b in blockers if b.signal is not None}),
            interrupt=next(
                (b.interrupt for b in blockers if b.signal == INTERRUPT_SIGNAL), None
            ),
        )
