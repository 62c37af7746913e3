"""An upgrade on one host: a new generation of children on the new code beside the old one.

``kill -USR2 <fleet pid>`` (or ``pyrula-fleet upgrade``) starts one. The fork server loads
the code anew and every slot gets a child of the new generation; once it is ready, the old
child of that slot *retires*: it claims nothing new and hands back each run it holds at the
run's next step boundary (reason ``upgrade``). A new child claiming a run it cannot replay
(it last ran on the old build and the new code diverges from its journal) puts it back
(reason ``build_mismatch``) and says so; the supervisor hands it to a retired child of that
build by id, which runs it to its end. So a compatible change moves the runs in flight to
the new generation at their next step, and an incompatible one leaves each on the code that
can replay it: no run fails with ``NonDeterminismError``.

A run that sleeps or waits across the upgrade is still a run of its build. So a new child
*audits* the old build every few seconds: it counts the open runs (queued, running,
sleeping, waiting) that last ran on it and that the new code cannot replay. While that
count is above zero (or not known yet), the old generation keeps one child alive, holding
nothing, to take each such run when it wakes and is refused by the new code; the other
retired children exit once they hold nothing. The last one exits when two audits in a row
count zero: an audit lists the open runs status by status, and a run moving between two
statuses meanwhile (claimed, or put back) escapes that one audit.

Past ``--drain-deadline`` every retired child is drained (the worker's shutdown: the runs
it holds are requeued); the new generation, told that no older build is left, parks each
run it cannot replay waiting for the signal ``pyrula.build``, which ``pyrula runs stuck``
lists with the reason.

The messages this adds to the child's pipe (``pyrula.wire``): to a child ``retire``,
``take`` (a run id), ``generations`` (the older builds alive) and ``audit`` (a build);
from a child ``refused`` and ``audited`` (the open runs it cannot replay).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pyrula.logs import FLEET_LOGGER
from pyrula.supervisor.children import Child
from pyrula.wire import encode

logger = logging.getLogger(FLEET_LOGGER)

#: How long a handed-over run may take to show in the retired child's heartbeat before
#: the child may exit anyway (the run is then claimed again by the new generation).
TAKE_PENDING_S = 10.0
#: Seconds between two audits of the old build, and how long an audit may go unanswered
#: before another child is asked.
AUDIT_INTERVAL_S = 2.0
AUDIT_PATIENCE_S = 30.0
#: Audits in a row that must count no open run before the last retired child may go.
ZERO_AUDITS_NEEDED = 2


class GenerationState(StrEnum):
    """A generation in ``/status`` during an upgrade."""

    STARTING = "starting"  # its children are not all ready yet
    SERVING = "serving"
    RETIRING = "retiring"  # claims nothing new; exits once it holds nothing


@dataclass(slots=True)
class Retired:
    """A child of the old generation, from the moment it retires until it exits."""

    child: Child
    #: run id -> when it was handed to this child (until its heartbeat holds it)
    takes: dict[str, float] = field(default_factory=dict)
    draining: bool = False


def send(child: Child, message: dict[str, Any]) -> bool:
    """Send one message down a child's pipe; False if the child is gone."""
    try:
        child.conn.send_bytes(encode(message))
    except (OSError, ValueError):
        return False
    return True


class Upgrade:
    """The upgrade in progress (one at a time): generation ``old`` retiring for ``new``."""

    def __init__(self, old: int, new: int, deadline_s: float | None, now: float) -> None:
        self.old = old
        self.new = new
        self.deadline = None if deadline_s is None else now + deadline_s
        self.started_at = now
        self.retired: dict[int, Retired] = {}  # pid -> the retired child
        #: The open runs of the old build the new code cannot replay, by the last audit
        #: (None: no audit has answered yet), and a few of their ids.
        self.open_runs: int | None = None
        self.open_ids: list[str] = []
        #: Audits in a row (the latest included) that counted no open run.
        self.zero_audits = 0
        self._audit_due = now
        self._audit_sent: float | None = None
        self._kept_logged = False
        #: Every slot's child is of the new generation (the old one may still linger).
        self.swapped = False

    def older_builds(self) -> list[str]:
        return sorted({r.child.beat.build for r in self.retired.values()
                       if r.child.beat is not None and r.child.beat.build and not r.draining})

    def retire(self, child: Child, tell_new: Iterable[Child]) -> None:
        """Retire ``child`` (its slot's new child is ready): tell it, then tell the new
        generation which older builds are alive to take what it cannot replay."""
        self.retired[child.pid] = Retired(child)
        send(child, {"type": "retire"})
        logger.info("child_retiring: slot %d pid %d (generation %d) claims nothing new and "
                    "hands back its runs at their next step", child.slot, child.pid, self.old,
                    extra={"event": "child_retiring", "slot": child.slot, "pid": child.pid})
        self.tell(tell_new)

    def tell(self, children: Iterable[Child]) -> None:
        message = {"type": "generations", "older": self.older_builds()}
        for child in children:
            send(child, message)

    def refused(self, run_id: str, build: str) -> bool:
        """A new child put back ``run_id``, which it cannot replay: hand it to the retired
        child of ``build`` holding the fewest runs. False if there is none."""
        candidates = [r for r in self.retired.values() if not r.draining
                      and r.child.beat is not None and r.child.beat.build == build]
        if not candidates:
            return False
        chosen = min(candidates, key=lambda r: (r.child.beat.in_flight if r.child.beat else 0)
                     + len(r.takes))
        chosen.takes[run_id] = time.monotonic()
        return send(chosen.child, {"type": "take", "run_id": run_id})

    def old_build(self) -> str | None:
        """The build of the retiring generation, as its children report it."""
        return next((r.child.beat.build for r in self.retired.values()
                     if r.child.beat is not None and r.child.beat.build), None)

    def audit(self, now: float, new_children: Iterable[Child]) -> None:
        """Ask one ready child of the new generation to audit the old build, when due."""
        build = self.old_build()
        if build is None or now < self._audit_due:
            return
        if self._audit_sent is not None and now - self._audit_sent < AUDIT_PATIENCE_S:
            return
        for child in new_children:
            if child.ready_seen and child.beat is not None and child.beat.build != build \
                    and send(child, {"type": "audit", "build": build}):
                self._audit_sent = now
                return
            if child.beat is not None and child.beat.build == build:
                # The same code: it replays every run, now and at every later audit.
                self.audited(build, 0, [], now, certain=True)
                return

    def audited(self, build: str, count: int, run_ids: list[str], now: float, *,
                certain: bool = False) -> None:
        """An audit's answer: ``count`` open runs of ``build`` the new code cannot replay
        (``certain``: no later audit could find one)."""
        if build != self.old_build():
            return
        self.open_runs, self.open_ids = count, run_ids
        if count:
            self.zero_audits = 0
        else:
            self.zero_audits = ZERO_AUDITS_NEEDED if certain else self.zero_audits + 1
        self._audit_sent = None
        self._audit_due = now + AUDIT_INTERVAL_S

    def _needed(self, late: bool) -> bool:
        """Whether the old generation must keep a child: some open run of its build cannot
        be replayed by the new code (or fewer than ZERO_AUDITS_NEEDED audits in a row have
        said otherwise yet)."""
        return not late and self.zero_audits < ZERO_AUDITS_NEEDED

    def tick(self, now: float, drain: Callable[[Child, str], None]) -> None:
        """Let each retired child that holds nothing exit, but the last one while the old
        build has open runs the new code cannot replay; past the deadline, drain the rest
        (``drain(child, why)``)."""
        late = self.deadline is not None and now >= self.deadline
        alive = [r for r in self.retired.values() if not r.draining]
        # Those holding runs last: if one is to stay, it is one already busy.
        alive.sort(key=lambda r: len(r.child.beat.held) if r.child.beat is not None else 0)
        staying = len(alive)
        for retired in alive:
            beat = retired.child.beat
            held = beat.held if beat is not None else {}
            for run_id, since in list(retired.takes.items()):
                if run_id in held or now - since > TAKE_PENDING_S:
                    del retired.takes[run_id]
            idle = not held and not retired.takes
            if not late and not idle:
                continue
            if idle and staying == 1 and self._needed(late):
                self._log_kept(retired.child)
                continue
            retired.draining = True
            staying -= 1
            drain(retired.child, "past --drain-deadline" if late and held else
                  "holds no run" if self.open_runs is None or staying else
                  "no open run of its build needs it any more")

    def _log_kept(self, child: Child) -> None:
        if self._kept_logged:
            return
        self._kept_logged = True
        count = "an unknown number of" if self.open_runs is None else str(self.open_runs)
        logger.info("child_kept: slot %d pid %d (generation %d) stays for %s open runs of "
                    "its build that the new code cannot replay", child.slot, child.pid,
                    self.old, count,
                    extra={"event": "child_kept", "slot": child.slot, "pid": child.pid,
                           "open_runs": self.open_runs})

    def exited(self, child: Child) -> bool:
        """A child exited; True if it was a retired one."""
        return self.retired.pop(child.pid, None) is not None

    @property
    def done(self) -> bool:
        return not self.retired

    def generations(self, serving: list[Child], new_build: str | None,
                    old_build: str | None, new_ready: bool) -> list[dict[str, Any]]:
        """``/status`` ``generations`` during the upgrade."""
        return [
            {"id": self.old, "build": old_build, "children": len(self.retired),
             "state": GenerationState.RETIRING, "open_runs": self.open_runs},
            {"id": self.new, "build": new_build, "children": len(serving),
             "state": GenerationState.SERVING if new_ready else GenerationState.STARTING},
        ]
