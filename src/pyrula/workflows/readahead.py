"""Read-ahead of the results a synchronous client waits for, in the order it submitted.

The common way to use a synchronous client is to submit a batch of runs and then wait
for each result in the order submitted. Each ``result()`` is then a round trip of its own,
one after the other, though most of the runs have ended by the time their turn comes.
Like a file system reading ahead of a sequential reader, the client notices that pattern
and, with the run asked for, reads the outcomes of the next runs it submitted in the same
round trip; those that have ended are kept, and their ``result()`` needs no round trip.

Only an ended run's outcome is kept: it never changes (a run that ended stays ended, with
the same result, error or successor), so an answer from the read-ahead is the answer the
store would give. A run not ended when it was read ahead is read again, the usual way,
when it is asked for. The window starts small, doubles while the pattern holds (each run
asked for is the one submitted after the last) and closes at the first result asked out of
that order, or for a run that had not ended (the reader is then ahead of the workers, and
reading ahead would only read runs still open). The last run submitted is always waited
for the usual way: a client that submits a run and waits for it, one after the other,
reads nothing ahead. What it keeps is bounded: the order of the
last ``SUBMITTED_KEPT`` submissions, ``OUTCOMES_KEPT`` outcomes read ahead.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from pyrula.workflows.records import RunOutcome

#: Submissions whose order the client remembers (~2 MB of run ids at most).
SUBMITTED_KEPT = 16_384
#: Ended runs' outcomes read ahead and not yet asked for, at most.
OUTCOMES_KEPT = 4_096
#: The first window, and the largest: how many runs one read reads ahead.
FIRST_WINDOW = 4
MAX_WINDOW = 64


class ReadAhead:
    """The submission order of one client, its window and the outcomes it read ahead.
    Safe to share between the threads that use one client."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: run id -> the run this client submitted right after it.
        self._next: dict[str, str] = {}
        self._last_submitted: str | None = None
        #: run id -> its outcome, read ahead (ended runs only).
        self._kept: dict[str, RunOutcome] = {}
        #: The run asked for last; how many runs the next read reads ahead.
        self._asked: str | None = None
        self._window = 0
        #: After a run asked for in order had not ended: the next reads in order that go
        #: the usual way before one looks again (doubling up to MAX_WINDOW), so a reader
        #: ahead of the workers costs one more round trip in that many results at most.
        self._skip = 0
        self._backoff = 0

    def submitted(self, run_id: str) -> None:
        with self._lock:
            last = self._last_submitted
            if last is not None and last != run_id:
                if len(self._next) >= SUBMITTED_KEPT:
                    del self._next[next(iter(self._next))]
                self._next[last] = run_id
            self._last_submitted = run_id

    def take(self, run_id: str) -> RunOutcome | None:
        """The outcome read ahead for ``run_id`` (given once), or None."""
        with self._lock:
            outcome = self._kept.pop(run_id, None)
            if outcome is not None:
                self._asked = run_id
            return outcome

    def plan(self, run_id: str) -> list[str] | None:
        """For ``run_id``, which has no outcome kept: None to wait for it the usual way
        (it was not asked for in submission order, or a look ahead is not due); else the
        runs to read with it, the ones submitted after it, as many as the window holds."""
        with self._lock:
            in_order = self._asked is not None and self._next.get(self._asked) == run_id
            self._asked = run_id
            if not in_order:
                self._window = 0
                return None
            if run_id not in self._next:
                # The last run submitted: nothing to read ahead, and it has likely just
                # been submitted (submit, wait, submit, wait...): wait the usual way.
                return None
            if self._skip > 0:
                self._skip -= 1
                return None
            ahead: list[str] = []
            seen = {run_id}  # a run submitted again links back: each is read once
            at = run_id
            while len(ahead) < self._window:
                following = self._next.get(at)
                if following is None or following in seen:
                    break
                seen.add(following)
                if following not in self._kept:
                    ahead.append(following)
                at = following
            return ahead

    def read(self, ended: bool, run_ids: Sequence[str],
             outcomes: Sequence[RunOutcome | None]) -> None:
        """After a read planned by :meth:`plan`: whether the run asked for had ended, and
        the outcomes of the runs read with it (those that have ended are kept)."""
        with self._lock:
            if ended:
                self._window = min(MAX_WINDOW, max(FIRST_WINDOW, 2 * self._window))
                self._backoff = 0
            else:
                self._window = 0
                self._backoff = self._skip = min(MAX_WINDOW, max(1, 2 * self._backoff))
            for run_id, outcome in zip(run_ids, outcomes, strict=True):
                if outcome is not None and outcome.status.terminal:
                    if len(self._kept) >= OUTCOMES_KEPT:
                        del self._kept[next(iter(self._kept))]
                    self._kept[run_id] = outcome
