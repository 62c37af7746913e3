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
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from pyrula.invariants import Fails, Report, check, collect_journals, count_stale_refusals
from pyrula.invariants.ledger import read_ledger
from pyrula.workflows import RunStatus, StoreUnavailable, SyncWorkflowClient
from pyrula.workflows.stores.base import Store
from tests.fleet.fleetprocs import Fleet, ready
from tests.servers import Server

WORKFLOW = "pyrula.bench"
APP = "pyrula.examples.bench"

#: The module name of ``CHAOS_APP`` once ``write_chaos_app`` put it in a fleet's directory.
CHAOS_MODULE = "chaosapp"

#: Workflows of scenarios that need more than the bench workflow; each step records itself
#: in the ledger directory its params name (``pyrula.invariants.Ledger``).
CHAOS_APP = textwrap.dedent(
    '''
    """Workflows of the chaos scenarios (written by tests/chaos/harness.py)."""

    import asyncio
    import os
    import time

    from pyrula.invariants import Ledger
    from pyrula.workflows import step, workflow

    _ledgers = {}


    def _record(ledger, result, started):
        book = _ledgers.get(ledger)
        if book is None:
            book = _ledgers[ledger] = Ledger(ledger)
        book.record(result, started=started)
        return result


    @step(name="chaos.block_loop")
    async def block_loop(seconds, ledger):
        started = time.time()
        time.sleep(seconds)  # blocks the event loop: what the worker must find and stand down
        return _record(ledger, "unblocked", started)


    @workflow(name="chaos.blocker")
    async def blocker(ctx, params):
        return await block_loop(params["seconds"], params["ledger"])


    @step(name="chaos.hold_past")
    async def hold_past(gate, seconds, ledger):
        """Holds until the file ``gate`` exists, then ``seconds`` more."""
        started = time.time()
        while not os.path.exists(gate):
            await asyncio.sleep(0.02)
        await asyncio.sleep(seconds)
        return _record(ledger, seconds, started)


    @workflow(name="chaos.drain")
    async def drain(ctx, params):
        return await hold_past(params["gate"], params["seconds"], params["ledger"])


    @step(name="chaos.nap")
    async def nap(x, seconds, ledger):
        started = time.time()
        await asyncio.sleep(seconds)
        return _record(ledger, x + 1, started)


    @workflow(name="chaos.sleeper")
    async def sleeper(ctx, params):
        """A step, a durable sleep of params["sleep"] seconds, a step: x + 2."""
        x = await nap(params["x"], params.get("hold", 0.0), params["ledger"])
        await ctx.sleep(params["sleep"])
        return await nap(x, params.get("hold", 0.0), params["ledger"])
    '''
)


def write_chaos_app(directory: Path) -> str:
    """Write ``CHAOS_APP`` into ``directory`` (a fleet's working directory) and return the
    module name to pass to ``--app``."""
    (directory / f"{CHAOS_MODULE}.py").write_text(CHAOS_APP)
    return CHAOS_MODULE


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
        self._steps: dict[str, int] = {}  # the ledgered steps of a run, when not ``steps``

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

    def expect(self, run_id: str, outcome: Any, steps: int = 0) -> None:
        """Expect ``run_id`` (submitted by the scenario itself) to end with ``outcome``
        (a result, or ``Fails(code)``) after ``steps`` steps that record themselves in
        the ledger."""
        self.expected[run_id] = outcome
        self._steps[run_id] = steps

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
            self._steps.get(run_id, self.steps) for run_id, outcome in self.expected.items()
            if not isinstance(outcome, Fails))


async def _collect(store: Store, run_ids: list[str]) -> dict[str, Any]:
    return await collect_journals(store, run_ids)


def periodic(load: ChaosLoad, kind: str, times: int, every: float,
             strike: Callable[[], bool], *, after: int = 100, missed: int = 50,
             first_after: float = 0.0) -> Callable[[], bool]:
    """A nemesis for ``ChaosLoad.wait_all``: at most every ``every`` seconds (the first
    ``first_after`` seconds from now), ``strike()`` injects one fault of ``kind`` and logs
    it with ``load.fault``; it returns False (and logs nothing) when there is nothing to
    hit right now. ``after`` more runs follow each fault and ``missed`` each miss, so the
    load outlasts the faults. Done once ``times`` faults of ``kind`` were injected."""
    last = [time.monotonic() - every + first_after]

    def nemesis() -> bool:
        if load.count(kind) < times and time.monotonic() - last[0] >= every:
            if strike():
                last[0] = time.monotonic()
                load.submit(after)
            else:
                load.submit(missed)
        return load.count(kind) < times

    return nemesis


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
    if not kill_and_reap(fleet, victim["pid"]):
        return None
    load.fault("kill -9", victim["pid"])
    return int(victim["pid"])


def kill_and_reap(fleet: Fleet, pid: int) -> bool:
    """SIGKILL ``fleet``'s child ``pid`` and return once the supervisor has reaped it:
    until then /status still lists it, and a next kill could land on the same dead
    process (a zombie takes a signal without complaint), one kill short. False (and no
    kill) if it had died already."""
    try:
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return False  # it died by itself, unreaped yet: a kill would not count
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, psutil.NoSuchProcess):
        return False
    fleet.wait_status(lambda s: all(c["pid"] != pid for c in s["children"]),
                      what=f"the supervisor reaped pid {pid}")
    return True


def statuses(client: SyncWorkflowClient, run_ids: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for run_id in run_ids:
        status: RunStatus = client.get(run_id).status
        counts[status.value] = counts.get(status.value, 0) + 1
    return counts


def busy_child(fleet: Fleet, load: ChaosLoad) -> dict[str, Any] | None:
    """A random ready child of ``fleet`` with runs in flight, or None right now."""
    status = fleet.status()
    if status is None:
        return None
    found = [c for c in ready(status) if c["in_flight"] > 0]
    return load.random.choice(found) if found else None


def stop_child(fleet: Fleet, load: ChaosLoad) -> dict[str, Any] | None:
    """SIGSTOP a ready child of ``fleet`` with runs in flight (its event loop, renewal
    thread and sync steps all freeze) and return its /status entry; None (and no stop)
    when no child qualifies right now. ``resume`` sends the SIGCONT."""
    victim = busy_child(fleet, load)
    if victim is not None:
        os.kill(victim["pid"], signal.SIGSTOP)
        load.fault("SIGSTOP", victim["pid"])
    return victim


def resume(pid: int, load: ChaosLoad) -> None:
    """SIGCONT ``pid`` (a stopped child; a child killed meanwhile is no error)."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        return
    load.fault("SIGCONT", pid)


def count_in_log(fleet: Fleet, text: str) -> int:
    return fleet.log().count(text)


def held_by(load: ChaosLoad, worker_id: str) -> list[str]:
    """The runs of ``load`` still running on an attempt ``worker_id`` started: the runs a
    frozen worker holds until the rest of the fleet takes them back (a reclaimed run is
    requeued, then started again by another worker, or has ended)."""
    held = []
    for run_id in load.expected:
        if load._ended(run_id) or load.client.get(run_id).status.value != "running":
            continue
        starts = [e for e in load.client.events(run_id) if e["type"] == "run:started"]
        if starts and starts[-1].get("worker") == worker_id:
            held.append(run_id)
    return held


# --- a worker's clock moved at run time (libfaketime) -----------------------------------

#: Puts back a working ``time.sleep`` in a process under libfaketime with
#: ``FAKETIME_DONT_FAKE_MONOTONIC``: libfaketime 0.9.10's ``clock_nanosleep`` fails there with
#: EINVAL (``time.sleep`` uses it); a condition wait on the monotonic clock is unaffected.
_FAKETIME_SITECUSTOMIZE = textwrap.dedent(
    '''
    import threading
    import time


    def _sleep(seconds):
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        threading.Event().wait(seconds)


    time.sleep = _sleep
    '''
)


def libfaketime() -> Path | None:
    """The libfaketime preload library (Debian's ``faketime`` package), or None."""
    for path in sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1")):
        return path
    return None


class FakeClock:
    """The wall clock of the processes started with ``env`` (a fleet: supervisor, fork
    server, children), moved by ``shift`` while they run. Only ``CLOCK_REALTIME`` moves, as
    an NTP step or an operator's ``date -s`` moves it; the monotonic clock runs on."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        library = libfaketime()
        assert library is not None, "libfaketime is not installed (apt-get install faketime)"
        self.offset_file = directory / "faketime-offset"
        self.shift(0)
        shim = directory / "faketime-shim"
        shim.mkdir(exist_ok=True)
        (shim / "sitecustomize.py").write_text(_FAKETIME_SITECUSTOMIZE)
        self.env = dict(env)
        self.env.update({
            "LD_PRELOAD": str(library),
            "FAKETIME_TIMESTAMP_FILE": str(self.offset_file),
            "FAKETIME_NO_CACHE": "1",  # read the offset on every call: it moves at run time
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "PYTHONPATH": os.pathsep.join([str(shim), env.get("PYTHONPATH", "")]),
        })

    def shift(self, seconds: float) -> None:
        """From now on the processes' wall clock reads real time + ``seconds``."""
        tmp = self.offset_file.with_suffix(".tmp")
        tmp.write_text(f"{seconds:+.0f}\n")
        tmp.replace(self.offset_file)  # never a half-written offset


def kill_a_ready_child(fleet: Fleet, rng: random.Random) -> bool:
    """SIGKILL one of ``fleet``'s ready children, chosen by ``rng``, while at least two are
    ready (the fleet still serves); False (and no kill) otherwise, also when the child
    chosen exited between the status read and the kill (``kill_and_reap``)."""
    status = fleet.status()
    found = ready(status) if status else []
    if len(found) < 2:
        return False
    return kill_and_reap(fleet, rng.choice(found)["pid"])


def restart_valkey(valkey: Server) -> None:
    """kill -9 the server, then start it again on the same port and data directory."""
    valkey.kill()
    valkey.launch(keep_port=True)
    valkey.wait_ready()


def submit_some(client: SyncWorkflowClient, workflow: str, submitted: dict[str, str],
                count: int, total: int) -> None:
    """Submit up to ``count`` more runs of ``workflow`` (params ``{"n": i}``, idempotency
    key ``r<i>``), ``total`` at most in all, into ``submitted`` (key -> run id). A submit
    that meets an outage is not acknowledged: the same key goes again next time, as a
    producer would send it."""
    for _ in range(count):
        if len(submitted) >= total:
            return
        key = f"r{len(submitted)}"
        try:
            submitted[key] = client.submit(workflow, {"n": len(submitted)},
                                           idempotency_key=key).run_id
        except (StoreUnavailable, OSError):
            return


def stop_after_kills(fleet: Fleet, kills: int, children: int = 2) -> None:
    """The fleet serves again with every child ready, restarted exactly ``kills`` times
    (every kill landed, and only the kills), then drains cleanly on SIGTERM."""
    status = fleet.wait_ready(children, timeout=60)
    exits = [line for line in fleet.log().splitlines() if "child_exited" in line]
    assert status["restarts"] == kills, exits
    fleet.send(signal.SIGTERM)
    assert fleet.wait(60) == 0
