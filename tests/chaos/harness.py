"""The chaos suite's load, nemesis and verdict, over real fleets and real stores.

A scenario submits runs of the bench workflow (``pyrula.examples.bench``: ``steps`` steps
of ``x + 1``, each holding ``hold`` seconds and recording itself in the side-effect ledger),
injects its faults while they run (every fault is logged in ``ChaosLoad.faults``, and a
scenario asserts its faults really fired), waits for every run to end and hands journals,
ledger and logs to the invariant checker (:mod:`pyrula.invariants`), whose one line it
prints. Nothing sleeps to synchronise: waits poll with a deadline.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyrula.invariants import Fails, Report, check, collect_journals, count_stale_refusals
from pyrula.invariants.ledger import read_ledger
from pyrula.workflows import RunStatus, StoreUnavailable, SyncWorkflowClient
from pyrula.workflows.stores.base import Store
from tests.fleet.fleetprocs import Fleet, ready

WORKFLOW = "pyrula.bench"
APP = "pyrula.examples.bench"


@dataclass
class Fault:
    kind: str
    target: str
    at: float = field(default_factory=time.time)


class ChaosLoad:
    """Runs of the bench workflow whose every step writes the ledger in ``directory``."""

    def __init__(self, client: SyncWorkflowClient, directory: Path, *, steps: int = 3,
                 hold: float = 0.05, kind: str = "async", seed: int | None = None) -> None:
        self.client = client
        self.ledger = directory / "ledger"
        self.steps = steps
        self.hold = hold
        self.kind = kind
        self.expected: dict[str, Any] = {}
        self.faults: list[Fault] = []
        self.random = random.Random(seed)
        #: every run's journal, as the last verdict read it
        self.journals: dict[str, list[dict[str, Any]] | None] = {}
        self._finished: set[str] = set()

    def params(self, x: int) -> dict[str, Any]:
        return {"x": x, "steps": self.steps, "kind": self.kind, "hold": self.hold,
                "ledger": str(self.ledger)}

    def submit(self, count: int) -> list[str]:
        """Submit ``count`` more runs; each is expected to return ``x + steps``."""
        ids = []
        for _ in range(count):
            x = len(self.expected)
            run_id = self.client.submit(WORKFLOW, self.params(x)).run_id
            self.expected[run_id] = x + self.steps
            ids.append(run_id)
        return ids

    def expect(self, run_id: str, outcome: Any) -> None:
        """Expect ``run_id`` (submitted by the scenario itself) to end with ``outcome``
        (a result, or ``Fails(code)``)."""
        self.expected[run_id] = outcome

    def fault(self, kind: str, target: object) -> None:
        self.faults.append(Fault(kind, str(target)))

    def count(self, kind: str) -> int:
        """How many faults of ``kind`` were injected."""
        return sum(1 for fault in self.faults if fault.kind == kind)

    def done(self) -> int:
        """How many of the runs have ended (one store read per run still open)."""
        return sum(1 for run_id in self.expected if self._ended(run_id))

    def _ended(self, run_id: str) -> bool:
        if run_id in self._finished:
            return True
        try:
            ended = self.client.get(run_id).status.terminal
        except StoreUnavailable:  # the store is down (a fault): ask again at the next poll
            return False
        if ended:
            self._finished.add(run_id)
        return ended

    def wait_all(self, timeout: float, during: Callable[[], bool] | None = None) -> None:
        """Wait until every run has ended and ``during`` (a nemesis step, called between
        polls; it may submit more runs) says it has no more to do by returning False.
        Fails with the runs still open after ``timeout``."""
        deadline = time.monotonic() + timeout
        busy = True
        while True:
            if during is not None and busy:
                busy = during()
            # Up to the first run still open (a store read per poll, not one per open run:
            # runs end in about the order they were submitted).
            first_open = next((r for r in self.expected if not self._ended(r)), None)
            if first_open is None and not (during is not None and busy):
                return
            if time.monotonic() > deadline:
                open_ = [r for r in self.expected if not self._ended(r)]
                states = {r: self.client.get(r).status.value for r in open_[:10]}
                raise AssertionError(f"{len(open_)} runs still open after {timeout} s "
                                     f"(faults: {len(self.faults)}): {states}")
            time.sleep(0.05)  # a poll interval, not a synchronisation

    def verdict(self, store: Store, logs: Iterable[str] = ()) -> Report:
        """Check every run against its journal, the ledger and the workers' logs; print
        the checker's line (and the faults) and return the report."""
        journals = self.journals = asyncio.run(_collect(store, list(self.expected)))
        stale = sum(count_stale_refusals(text) for text in logs)
        report = check(journals, self.expected, read_ledger(self.ledger)
                       if self.ledger.exists() else (), stale_writes_refused=stale)
        kinds: dict[str, int] = {}
        for fault in self.faults:
            kinds[fault.kind] = kinds.get(fault.kind, 0) + 1
        print(report.line(), "faults=" + ",".join(f"{k}:{n}" for k, n in sorted(kinds.items())),
              "attributed=" + ",".join(f"{k}:{n}" for k, n in sorted(report.faults.items())))
        return report

    def requeues(self) -> Counter[str]:
        """The reasons of the ``run:requeued`` events in the journals the verdict read."""
        return Counter(str(event.get("reason")) for journal in self.journals.values()
                       for event in journal or () if event["type"] == "run:requeued")

    def assert_holds(self, report: Report) -> None:
        """Every invariant holds, and the load was real: every run completed."""
        assert report.ok, "\n".join([report.line(), *report.problems])
        assert report.runs == len(self.expected) > 0
        assert report.executions >= sum(
            1 for v in self.expected.values() if not isinstance(v, Fails)) * self.steps


async def _collect(store: Store, run_ids: list[str]) -> dict[str, Any]:
    return await collect_journals(store, run_ids)


def kill_random_child(fleet: Fleet, load: ChaosLoad, *, busy: bool = True) -> int | None:
    """SIGKILL one ready child of ``fleet`` (one with runs in flight when ``busy``) and
    return its pid; None (and no kill) when no child qualifies right now."""
    status = fleet.status()
    if status is None:
        return None
    found = [c for c in ready(status) if not busy or c["in_flight"] > 0]
    if not found:
        return None
    victim = load.random.choice(found)
    os.kill(victim["pid"], signal.SIGKILL)
    load.fault("kill -9", victim["pid"])
    return int(victim["pid"])


def statuses(client: SyncWorkflowClient, run_ids: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for run_id in run_ids:
        status: RunStatus = client.get(run_id).status
        counts[status.value] = counts.get(status.value, 0) + 1
    return counts
