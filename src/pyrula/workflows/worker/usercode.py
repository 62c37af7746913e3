"""Which of a worker's runs are inside their own code: what a fleet child tells its
supervisor, so that a crash is charged only to the runs that could have caused it.

A run is in user code while its workflow body or one of its steps is in progress (see
``engine.UserCodeMonitor``); not while it waits for its journal, or (its body) on the
store or a durable sleep or wait. The supervisor reads the child's last
report when the child dies. That report must never miss a run that is in user code; it may
name a run that has just left it. The rules that keep it so, cheaply:

- a run entering user code that the last report does not name is reported before its
  code runs (``enter`` returns once the report is sent);
- a heartbeat names exactly the runs in user code at that moment; between heartbeats a
  report also names the runs named since the last one, so a run that keeps running steps
  costs at most one extra report per heartbeat interval, however many steps it runs;
- a claim's report names the runs just claimed (their code is about to start), which
  saves a report per run;
- suspects (runs with a crash counted) are named only while in user code, and one that
  leaves it is reported at once: a crash with a suspect in user code is charged to that
  suspect alone, so a stale name would charge an innocent run a second time. A suspect
  costs a report each time it enters or leaves its code.

Everything here runs on the worker's event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


class UserCodeTracker:
    """Counts each run's open user-code sections and remembers what was last reported.

    ``report`` (set by a process that reports to a supervisor) must send a report built
    by ``snapshot`` before it returns; without one nothing is reported.
    """

    def __init__(self, report: Callable[[], None] | None = None) -> None:
        self._report = report
        self._open: dict[str, int] = {}
        self._suspects: dict[str, int] = {}  # run id -> the token of its suspect attempt
        self._reported: set[str] = set()
        self._claimed: set[str] = set()  # claimed since the last report, not suspects

    # --- the engine's monitor -------------------------------------------------------

    def enter(self, run_id: str) -> None:
        self._open[run_id] = self._open.get(run_id, 0) + 1
        if self._report is not None and run_id not in self._reported:
            self._report()

    def leave(self, run_id: str) -> None:
        count = self._open.get(run_id, 0) - 1
        if count > 0:
            self._open[run_id] = count
            return
        self._open.pop(run_id, None)
        if self._report is not None and run_id in self._suspects and run_id in self._reported:
            self._report()

    # --- the worker's bookkeeping ---------------------------------------------------

    def in_user_code(self, run_id: str) -> bool:
        return run_id in self._open

    def suspect(self, run_id: str, token: int) -> None:
        """This attempt of the run is a suspect's (from its claim until it ends)."""
        self._suspects[run_id] = token
        # Named earlier as an ordinary run: its code is reported afresh when it enters.
        self._reported.discard(run_id)

    def attempt_ended(self, run_id: str, token: int) -> None:
        if self._suspects.get(run_id) == token:
            del self._suspects[run_id]

    def claimed(self, run_ids: Iterable[str]) -> None:
        """Runs just claimed, about to be reported (a claim's report covers their start)."""
        if self._report is not None:
            self._claimed.update(r for r in run_ids if r not in self._suspects)

    def snapshot(self, *, heartbeat: bool) -> tuple[list[str], list[str]]:
        """(runs to report as in user code, the suspects held), recorded as reported: call
        it only for a report that is sent. A heartbeat names exactly the runs in user code
        now; any other report also those named since the last heartbeat (never a suspect
        that has left its code) and the runs claimed since the last report."""
        now = set(self._open)
        if not heartbeat:
            now |= {r for r in self._reported if r not in self._suspects}
            now |= self._claimed
        self._claimed.clear()
        self._reported = now
        return sorted(now), sorted(self._suspects)
