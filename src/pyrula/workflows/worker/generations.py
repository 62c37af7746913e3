"""A worker's part in an upgrade: newer code beside older code, no run failing for it.

During an upgrade a fleet runs two generations of children: the older one on the code the
runs in flight started on, the newer one on the new code. Each worker has a *build* (a
fingerprint of its workflow code, ``pyrula.workflows.build``), recorded in every
``run:started`` it writes.

* An older worker **retires** (``Generation.retire``): it claims nothing new and hands
  back each run it holds at the run's next step boundary (reason ``upgrade``), so the
  newer code takes every run it can replay without a step being cut in half.
* A newer worker, claiming a run that last ran on another build, first checks that its
  code replays the run's journal (``pyrula.workflows.compat``). A run it cannot replay is
  not run (it would fail with ``NonDeterminismError``): while an older generation that can
  run it is alive (``older_builds``), the run is put back (reason ``build_mismatch``) and
  the supervisor is told, which hands it to an older worker by id (``Generation.take``);
  otherwise the run is parked waiting for the signal ``pyrula.build`` and listed by
  ``pyrula runs stuck`` with the reason, rather than failed.
* An older worker runs the runs handed to it to their end (they are *pinned*: not handed
  back again).
* A newer worker *audits* an older build on its supervisor's request (``open_runs_of``):
  the open runs (queued, running, sleeping, waiting) that last ran on that build and that
  its own code cannot replay. While there are any, the fleet keeps a child of the older
  generation alive, so a run of that build that wakes (a timer, a signal) still has code
  that replays it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from typing import Any

from pyrula.workflows.compat import Stop, check_replay
from pyrula.workflows.definition import WorkflowSpec
from pyrula.workflows.events import BUILD_SIGNAL, Event, EventType, make_event
from pyrula.workflows.records import RunStatus

logger = logging.getLogger(__name__)

#: The requeue reason of a run handed back by a retiring worker, and of one a newer
#: worker could not replay.
UPGRADE = "upgrade"
BUILD_MISMATCH = "build_mismatch"


#: The statuses of a run that is not over: it may still need code that replays it.
OPEN = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.SLEEPING, RunStatus.WAITING)
#: How long the replay check of one run may take during an audit (seconds).
AUDIT_CHECK_TIMEOUT_S = 1.0


def last_build(journal: list[Event], *, current: bool = True) -> str | None:
    """The build the run last ran on: that of its latest ``run:started`` before this
    attempt's (``current``: the journal ends with the attempt's own ``run:started``; False
    for a journal read from outside any attempt), passing over attempts that refused the
    run (a ``build_mismatch`` right after their start); None for a run that never ran, or
    ran on a build that recorded none."""
    found: str | None = None
    upto = journal[:-1] if current else journal
    for index, event in enumerate(upto):
        if event.get("type") != EventType.RUN_STARTED:
            continue
        after = journal[index + 1] if index + 1 < len(journal) else {}
        if after.get("reason") == BUILD_MISMATCH:
            continue
        found = str(event["build"]) if event.get("build") else found
    return found


def _ran_on(journal: list[Event], build: str) -> bool:
    """Whether the run last ran on ``build``; also when an attempt on another build has
    just started it (the journal ends with its ``run:started``) and ``build`` ran it before:
    that attempt has not yet decided whether its code replays the run, and may refuse it."""
    if last_build(journal, current=False) == build:
        return True
    deciding = bool(journal) and journal[-1].get("type") == EventType.RUN_STARTED
    return deciding and last_build(journal, current=True) == build


async def open_runs_of(client: Any, specs: Mapping[str, WorkflowSpec], build: str) -> list[str]:
    """The open runs of the names in ``specs`` that last ran on ``build`` and that these
    specs cannot replay (their journal diverges from this code): the runs only a worker of
    ``build`` can carry on. Reads every open run's journal; runs nothing, writes nothing."""
    found: list[str] = []
    for name, spec in specs.items():
        for status in OPEN:
            async for info in client.list_runs(name=name, status=status):
                journal = await client.events(info.run_id)
                if not _ran_on(journal, build):
                    continue
                verdict = await check_replay(spec, journal, run_id=info.run_id,
                                             timeout=AUDIT_CHECK_TIMEOUT_S)
                if verdict.stop is Stop.DIVERGED:
                    found.append(info.run_id)
    return found


async def refuse(store: Any, claimed: Any, journal: list[Event], build: str, why: str,
                 generation: Generation, now: float, log: dict[str, Any]) -> None:
    """Do not run a run this worker's code cannot replay (it last ran on ``build``): put
    it back for an older worker still alive that can, else park it waiting for
    ``BUILD_SIGNAL``, where ``pyrula runs stuck`` shows it with ``why``. Fenced by the
    attempt's token, like any write of the attempt."""
    detail = {"cause": BUILD_MISMATCH, "build": build, "worker_build": generation.build,
              "message": why}
    if build in generation.older_builds:
        await store.requeue(claimed.run_id, claimed.token, now=now, reason=BUILD_MISMATCH,
                            crash_detail=detail)
        logger.info("run_build_mismatch: run %s last ran on build %s, which this worker's "
                    "code (build %s) cannot replay (%s); handed to the older generation",
                    claimed.run_id, build, generation.build, why,
                    extra={"event": "run_build_mismatch", **log})
        generation.refused(claimed.run_id, build)
        return
    waiting = make_event(EventType.RUN_WAITING, now, signal=BUILD_SIGNAL,
                         reason=BUILD_MISMATCH, **detail)
    known = int(journal[-1].get("seq", 0)) if journal else 0
    await store.park(claimed.run_id, claimed.token, [waiting], now=now, wake_at=None,
                     signals=[BUILD_SIGNAL], known_seq=known)
    logger.warning("run_build_mismatch: run %s last ran on build %s, which this worker's "
                   "code (build %s) cannot replay (%s), and no worker of that build is "
                   "alive; parked waiting for signal %r (pyrula runs stuck lists it)",
                   claimed.run_id, build, generation.build, why, BUILD_SIGNAL,
                   extra={"event": "run_build_mismatch", **log})


class Generation:
    """What a worker knows of the upgrade it is part of (one per worker)."""

    def __init__(self, build: str) -> None:
        self.build = build
        #: Builds of older workers still alive that can take a run this one cannot replay.
        self.older_builds: frozenset[str] = frozenset()
        #: True once this worker retires (an older generation during an upgrade).
        self.retiring = False
        #: Runs handed to this worker by id: run to their end, never handed back.
        self.pinned: set[str] = set()
        #: Told of each run put back for an older build: (run id, that build).
        self.on_refused: Callable[[str, str], None] | None = None

    def set_older(self, builds: Collection[str]) -> None:
        self.older_builds = frozenset(b for b in builds if b != self.build)

    def retire(self, attempts: Collection[Any]) -> None:
        """Claim nothing new; hand back each held run at its next step boundary."""
        self.retiring = True
        for attempt in attempts:
            self.hand_back_if_retiring(attempt)

    def hand_back_if_retiring(self, attempt: Any) -> None:
        if self.retiring and attempt.run_id not in self.pinned:
            attempt.hand_back(UPGRADE, build=self.build)

    def refused(self, run_id: str, build: str) -> None:
        if self.on_refused is not None:
            self.on_refused(run_id, build)
