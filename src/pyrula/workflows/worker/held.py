"""The runs a worker holds: one registry, shared by the event loop and the renewal thread.

A run is held from the claim that returned it until its attempt ends. Each attempt is
keyed by run id *and* token: a stood-down attempt may still be ending on the loop when
the same worker claims the run's next attempt, and ending the old one must not drop the
new one. Per run id the newest claim is the one reported (``held``), renewed
(``renewing``) and cancelled (``request_cancel``).

Everything here is read and written under one ``threading.Lock``: the renewal thread
stands attempts down while the loop claims, attaches and releases them. An attempt is
told it was stood down (``Attempt.abandon``, safe from any thread) outside the lock.

The journal cache stays apart (``worker.cache``): it keeps the journals of runs this
worker *parked*, which it no longer holds. Releasing a stood-down attempt drops the run's
cached journal, since the stand-down wrote to the journal behind the attempt's back.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyrula.workflows.engine import Attempt
    from pyrula.workflows.worker.cache import JournalCache

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Held:
    """One attempt's lock as the renewal thread renews it."""

    token: int
    liveness_bound_s: float


@dataclass(slots=True)
class _Entry:
    token: int
    #: None until the attempt is built (its journal is being read).
    attempt: Attempt | None = None
    #: None until renewal starts; then how long the loop may be blocked before the
    #: attempt is stood down.
    liveness_bound_s: float | None = None
    stood_down: bool = False


class HeldRuns:
    """Run id -> token, attempt, liveness bound and stood-down flag of each held attempt."""

    def __init__(self, cache: JournalCache | None = None) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, int], _Entry] = {}
        #: run id -> token of its newest claim
        self._newest: dict[str, int] = {}
        self._cache = cache
        #: Why every held run is being stood down (a shutdown past its grace), or None.
        self._standing_down: str | None = None

    # --- the event loop's side -------------------------------------------------------

    def claimed(self, run_id: str, token: int) -> None:
        """A claim returned this attempt: held from now on, before any of its code runs."""
        with self._lock:
            self._entries[(run_id, token)] = _Entry(token)
            self._newest[run_id] = token

    def renew(self, run_id: str, token: int, liveness_bound_s: float) -> None:
        """Have the renewal thread renew this attempt's lock from now on."""
        with self._lock:
            entry = self._entries.get((run_id, token))
            if entry is not None:
                entry.liveness_bound_s = liveness_bound_s

    def attach(self, attempt: Attempt) -> bool:
        """Record the attempt built for a held claim; True if it was stood down already
        (while its journal was being read): the caller abandons it."""
        with self._lock:
            entry = self._entries.get((attempt.run_id, attempt.token))
            if entry is None:
                return False
            entry.attempt = attempt
            return entry.stood_down

    def release(self, run_id: str, token: int) -> bool:
        """Forget this attempt of the run (it ended); True if the renewal thread had stood
        it down, in which case the run's cached journal is dropped too."""
        with self._lock:
            entry = self._entries.pop((run_id, token), None)
            if self._newest.get(run_id) == token:
                del self._newest[run_id]
        stood_down = entry is not None and entry.stood_down
        if stood_down and self._cache is not None:
            self._cache.drop(run_id)
        return stood_down

    def held(self) -> dict[str, int]:
        """Run id -> token of every held run (its newest claim)."""
        with self._lock:
            return dict(self._newest)

    def attempts(self) -> list[Attempt]:
        """The attempt of each held run's newest claim that has one."""
        with self._lock:
            return list(self._newest_attempts().values())

    def in_flight(self) -> int:
        """How many held runs have an attempt running."""
        with self._lock:
            return len(self._newest_attempts())

    def stand_down_all(self, reason: str) -> list[Attempt]:
        """Every held run is to be stood down with ``reason``: the attempts to tell now. A
        claim whose attempt is still being built (its journal read, a replay check) is
        told when it attaches, by ``standing_down``; else it would run on unwatched, and
        leave the run held when the worker exits."""
        with self._lock:
            self._standing_down = reason
            return list(self._newest_attempts().values())

    @property
    def standing_down(self) -> str | None:
        """The reason given to ``stand_down_all``, once it was called."""
        return self._standing_down

    def request_cancel(self, run_id: str) -> None:
        """A client asked to cancel the run: tell its newest attempt (on the event loop)."""
        with self._lock:
            attempt = self._newest_attempts().get(run_id)
        if attempt is not None:
            attempt.request_cancel()

    def _newest_attempts(self) -> dict[str, Attempt]:
        newest: dict[str, tuple[int, Attempt]] = {}
        for (run_id, token), entry in self._entries.items():
            if entry.attempt is not None and (run_id not in newest or token > newest[run_id][0]):
                newest[run_id] = (token, entry.attempt)
        return {run_id: attempt for run_id, (_, attempt) in newest.items()}

    # --- the renewal thread's side ---------------------------------------------------

    def renewing(self) -> dict[str, Held]:
        """Run id -> the lock to renew: each run's newest attempt under renewal that was
        not stood down."""
        with self._lock:
            renew: dict[str, Held] = {}
            for (run_id, token), entry in self._entries.items():
                bound = entry.liveness_bound_s
                if bound is None or entry.stood_down:
                    continue
                if run_id not in renew or token > renew[run_id].token:
                    renew[run_id] = Held(token, bound)
            return renew

    def stand_down(self, run_id: str, token: int) -> None:
        """The renewal thread put this attempt's run back: stop renewing its lock, and
        have the attempt write nothing more (now, or as soon as it is attached)."""
        with self._lock:
            entry = self._entries.get((run_id, token))
            if entry is None:
                return
            entry.stood_down = True
            attempt = entry.attempt
        if attempt is not None:
            attempt.abandon()

    def lost(self, run_id: str, token: int) -> None:
        """The attempt's lock is gone (another attempt owns the run): have it start no
        further step now rather than at its next write."""
        with self._lock:
            entry = self._entries.get((run_id, token))
            attempt = entry.attempt if entry is not None else None
        if attempt is not None:
            attempt.abandon()

    def was_stood_down(self, run_id: str, token: int) -> bool:
        with self._lock:
            entry = self._entries.get((run_id, token))
            return entry is not None and entry.stood_down
