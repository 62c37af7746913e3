"""Why an attempt stops, and which reason wins when several come.

An attempt runs its workflow code until the code returns or parks, unless something
stops it first: its lock went to another attempt (``LOST``), the store stopped answering
(``STORE_UNAVAILABLE``), the worker stood it down (``STAND_DOWN``: the run goes back to the
queue), a client cancelled the run (``CANCEL``) or the code diverged from its journal
(``NON_DETERMINISM``); ``ENDING`` says the attempt loop has begun to end the attempt
itself (a park, the run's end). These come in any order, from the event loop or, for a
lost lock, from the worker's renewal thread. The attempt keeps one :class:`Stop` and its
loop acts on it at its next turn.

What wins is the reason's strength, not the order of arrival, strongest first: a halt
(``LOST``, ``STORE_UNAVAILABLE``: nothing more can be written, so nothing else can be
acted on), ``STAND_DOWN``, ``CANCEL``, ``NON_DETERMINISM``, ``ENDING``. Of two reasons of
one strength the first stays (the first stand-down's reason, the first divergence),
except that a later halt replaces an earlier one: the store's latest answer is what
became of the lock. A cancel, and the attempt's end, refuse new operations for good,
whatever reason comes after them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from pyrula.workflows.errors import ControlFlow, NonDeterminismError

logger = logging.getLogger(__name__)


class StopReason(Enum):
    LOST = "lost"
    STORE_UNAVAILABLE = "store_unavailable"
    STAND_DOWN = "stand_down"
    CANCEL = "cancel"
    NON_DETERMINISM = "non_determinism"
    ENDING = "ending"

    @property
    def halts(self) -> bool:
        """Nothing more may be written: the attempt unwinds (:class:`Halt`)."""
        return self in (StopReason.LOST, StopReason.STORE_UNAVAILABLE)

    @property
    def strength(self) -> int:
        return _STRENGTH[self]


_STRENGTH = {
    StopReason.LOST: 4,
    StopReason.STORE_UNAVAILABLE: 4,
    StopReason.STAND_DOWN: 3,
    StopReason.CANCEL: 2,
    StopReason.NON_DETERMINISM: 1,
    StopReason.ENDING: 0,
}


@dataclass(frozen=True, slots=True)
class StandDown:
    """Why the worker puts the run back in the queue, and whether that is a crash."""

    reason: str
    crash: bool = False
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Stop:
    reason: StopReason
    #: ``STAND_DOWN``: why, for the requeue.
    stand_down: StandDown | None = None
    #: ``NON_DETERMINISM``: the divergence the run fails with.
    error: NonDeterminismError | None = None
    #: The code may start no new operation (a cancel or the attempt's end came).
    refuses: bool = False
    #: ``STAND_DOWN`` at the next step boundary: the steps running finish and are recorded
    #: first, no new one starts (a hand-back to newer code; never a step cut in half).
    at_boundary: bool = False

    @classmethod
    def lost(cls) -> Stop:
        return cls(StopReason.LOST)

    @classmethod
    def store_unavailable(cls) -> Stop:
        return cls(StopReason.STORE_UNAVAILABLE)

    @classmethod
    def stand(cls, reason: str, *, crash: bool = False, **detail: Any) -> Stop:
        return cls(StopReason.STAND_DOWN, stand_down=StandDown(reason, crash, dict(detail)))

    @classmethod
    def hand_back(cls, reason: str, **detail: Any) -> Stop:
        return cls(StopReason.STAND_DOWN, stand_down=StandDown(reason, False, dict(detail)),
                   refuses=True, at_boundary=True)

    @classmethod
    def cancel(cls) -> Stop:
        return cls(StopReason.CANCEL, refuses=True)

    @classmethod
    def non_determinism(cls, error: NonDeterminismError) -> Stop:
        return cls(StopReason.NON_DETERMINISM, error=error)

    @classmethod
    def ending(cls) -> Stop:
        return cls(StopReason.ENDING, refuses=True)

    def then(self, later: Stop) -> Stop:
        """The stop in force once ``later`` comes after this one."""
        stronger = later.reason.strength > self.reason.strength
        # A stand-down that cuts the steps short (a shutdown past its grace) overrides one
        # that was waiting for them to finish.
        sooner = self.at_boundary and later.reason is self.reason and not later.at_boundary
        kept = later if stronger or sooner or (later.reason.halts and self.reason.halts) \
            else self
        if (self.refuses or later.refuses) and not kept.refuses:
            return replace(kept, refuses=True)
        return kept


class StopState:
    """The one stop of an attempt (None while it runs on). Asked for from the event loop
    or from any thread (a lost lock); read anywhere."""

    __slots__ = ("_lock", "_stop")

    def __init__(self) -> None:
        # Asking combines the stop in force with the new one: two threads asking at once
        # must not each combine with the same old stop.
        self._lock = threading.Lock()
        self._stop: Stop | None = None

    @property
    def current(self) -> Stop | None:
        return self._stop

    def ask(self, stop: Stop) -> None:
        with self._lock:
            self._stop = stop if self._stop is None else self._stop.then(stop)

    @property
    def refuses(self) -> bool:
        """The code may start no new operation."""
        stop = self._stop
        return stop is not None and stop.refuses

    def raise_if_halted(self) -> None:
        stop = self._stop
        if stop is not None and stop.reason.halts:
            raise Halt(stop.reason.value)


class Halt(ControlFlow):
    """Unwinds the attempt once nothing more may be written (its stop is a halt). A
    ``BaseException``, so workflow code's ``except Exception`` does not swallow it."""
