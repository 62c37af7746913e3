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

A retired child exits once it holds nothing. Past ``--drain-deadline`` the retired children
still holding runs are drained (the worker's shutdown: their runs are requeued); the new
generation, told that no older build is left, parks each run it cannot replay waiting for
the signal ``pyrula.build``, which ``pyrula runs stuck`` lists with the reason.

The messages this adds to the child's pipe (``pyrula.wire``): to a child ``retire``,
``take`` (a run id) and ``generations`` (the older builds alive); from a child ``refused``.
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

    def tick(self, now: float, drain: Callable[[Child, str], None]) -> None:
        """Let each retired child that holds nothing exit; past the deadline, drain the
        rest (``drain(child, why)``)."""
        late = self.deadline is not None and now >= self.deadline
        for retired in list(self.retired.values()):
            if retired.draining:
                continue
            beat = retired.child.beat
            held = beat.held if beat is not None else {}
            for run_id, since in list(retired.takes.items()):
                if run_id in held or now - since > TAKE_PENDING_S:
                    del retired.takes[run_id]
            if late or (not held and not retired.takes):
                retired.draining = True
                drain(retired.child, "past --drain-deadline" if late and held
                      else "holds no run")

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
             "state": GenerationState.RETIRING},
            {"id": self.new, "build": new_build, "children": len(serving),
             "state": GenerationState.SERVING if new_ready else GenerationState.STARTING},
        ]
