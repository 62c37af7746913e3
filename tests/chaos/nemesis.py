"""Applies a fault schedule (``tests/chaos/schedule.py``) to a real fleet and store, as the
nemesis of ``ChaosLoad.wait_all``.

Each planned fault becomes a strike (due at its ``at``, counted from ``begin()``: its runs
are submitted then, and it strikes from the next poll on) and, when it is undone, an undo
due ``lasts`` seconds after the strike landed; they run strictly in the schedule's order,
one per poll, so a late strike delays the ones after it but never reorders them. A child
fault waits for its slot's child to be ready (after a crash, for the new fleet) and, for a
while, to hold runs; every strike waits for the whole fleet (and the standalone worker) to
be ready first. Every strike and undo is logged with ``ChaosLoad.fault`` and in
``landed``, with the moment it really happened, for the failure message.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.harness import ChaosLoad, resume
from tests.chaos.schedule import (
    CRASH,
    FAILOVER,
    KILL,
    STOP,
    STORE_KILL,
    STORE_LOCK,
    TERM,
    UNDONE,
    WORKER_KILL,
    Planned,
    Schedule,
)
from tests.conftest import wait_until
from tests.fleet.fleetprocs import Fleet, http_get, ready
from tests.integration.workerprocs import WorkerProcess
from tests.servers import Cluster, Server

#: Holds the write lock of the SQLite file argv[1] until its stdin closes.
_LOCKER = textwrap.dedent(
    """
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    sys.stdin.read()
    conn.execute("ROLLBACK")
    """
)

#: How long a child fault waits for its child to hold runs before it strikes it idle.
BUSY_WAIT = 5.0
#: How long a strike may wait for its target (a ready child in its slot) before the
#: schedule is declared stuck.
TARGET_TIMEOUT = 60.0


@dataclass
class ScheduledNemesis:
    schedule: Schedule
    load: ChaosLoad
    #: starts a fleet over the store (at the beginning and after each crash)
    start_fleet: Callable[[], Fleet]
    server: Server | None = None
    cluster: Cluster | None = None
    #: the SQLite file, for ``STORE_LOCK``
    sqlite_path: str | None = None
    #: starts the standalone worker, and the port of its health server
    start_worker: Callable[[], tuple[WorkerProcess, int]] | None = None
    fleets: list[Fleet] = field(default_factory=list)
    #: every standalone worker started, the one running last
    workers: list[tuple[WorkerProcess, int]] = field(default_factory=list)
    #: what happened, when: "t+1.03 s kill -9 slot 1 (pid 4242)"
    landed: list[str] = field(default_factory=list)
    #: how many of the schedule's faults struck
    struck: int = 0
    _queue: list[tuple[str, Planned]] = field(default_factory=list)
    _due: float = 0.0
    _began: float = 0.0
    _waiting_since: float | None = None
    _whole_since: float | None = None
    _stopped: int = 0
    _locker: subprocess.Popen[str] | None = None

    def __post_init__(self) -> None:
        self.fleets.append(self.start_fleet())
        if self.schedule.workers:
            assert self.start_worker is not None, "a schedule with a worker, none to start"
            self.workers.append(self.start_worker())

    @property
    def fleet(self) -> Fleet:
        """The fleet now running (the last one started)."""
        return self.fleets[-1]

    def begin(self) -> None:
        """The load begins now: the schedule's clock starts."""
        self._began = time.monotonic()
        self._queue = [("strike", planned) for planned in self.schedule.faults]
        self._due = self._queue[0][1].at if self._queue else 0.0

    def __call__(self) -> bool:
        if not self._queue:
            return False
        now = time.monotonic() - self._began
        if now < self._due:
            return True
        action, planned = self._queue[0]
        if action == "strike":
            if self._waiting_since is None:  # due: its runs first, the strike from the next poll
                if not self._whole(planned):
                    return True
                self._waiting_since = time.monotonic()
                self.load.submit(planned.runs)
                return True
            what = self._strike(planned)
            if what is None:
                self._wait_for_target(planned)
                return True
            self._waiting_since = None
            self.struck += 1
            self._queue.pop(0)
            if planned.kind in UNDONE:  # lasts from the moment it landed
                self._queue.insert(0, ("undo", planned))
                self._due = time.monotonic() - self._began + planned.lasts
            else:
                self._next()
        else:
            what = self._undo(planned)
            self._queue.pop(0)
            self._next()
        self.landed.append(f"t+{now:5.2f} s {what}")
        return bool(self._queue)

    def _next(self) -> None:
        if self._queue:  # the next strike: at its time, or now if that is past
            self._due = self._queue[0][1].at

    def _whole(self, planned: Planned) -> bool:
        """Whether every child of the fleet and the standalone worker are ready: a strike
        waits for the processes the faults before it replaced (a worker or a fleet started
        again, a child the supervisor replaced) to have booted, so it meets a whole system
        and no boot meets a store fault (a process that cannot reach its store at boot
        exits, by design)."""
        if self._whole_since is None:
            self._whole_since = time.monotonic()
        status = self.fleet.status()
        whole = (status is not None and len(ready(status)) == self.schedule.children
                 and (not self.workers or self._worker_ready() is not None))
        if whole:
            self._whole_since = None
        elif time.monotonic() - self._whole_since > TARGET_TIMEOUT:
            raise AssertionError(f"{planned.line()}: the fleet or the worker never came "
                                 f"back whole (landed so far: {self.landed})")
        return whole

    def _worker_ready(self) -> int | None:
        """The runs the standalone worker holds, or None while it is not ready."""
        _worker, port = self.workers[-1]
        try:
            code, body = http_get(f"http://127.0.0.1:{port}/readyz")
        except OSError:  # not serving yet (a worker started again)
            return None
        return int(json.loads(body)["in_flight"]) if code == 200 else None

    def _waited(self) -> float:
        return 0.0 if self._waiting_since is None else time.monotonic() - self._waiting_since

    def _wait_for_target(self, planned: Planned) -> None:
        if self._waited() > TARGET_TIMEOUT:
            raise AssertionError(f"{planned.line()}: its target was never there "
                                 f"(landed so far: {self.landed})")

    def _strike(self, planned: Planned) -> str | None:
        """Inject ``planned``; what it did, or None when its target is not there yet."""
        strikes: dict[str, Callable[[Planned], str | None]] = {
            KILL: self._signal_child, STOP: self._signal_child, TERM: self._signal_child,
            CRASH: self._crash, WORKER_KILL: self._kill_worker, STORE_KILL: self._kill_store,
            STORE_LOCK: self._lock, FAILOVER: self._failover}
        return strikes[planned.kind](planned)

    def _undo(self, planned: Planned) -> str:
        undos: dict[str, Callable[[], str]] = {
            STOP: self._continue_child, CRASH: self._restart_fleet,
            WORKER_KILL: self._restart_worker, STORE_KILL: self._restart_store,
            STORE_LOCK: self._unlock}
        return undos[planned.kind]()

    def _signal_child(self, planned: Planned) -> str | None:
        child = self._child(planned.target)
        if child is None:
            return None
        signum = {KILL: signal.SIGKILL, STOP: signal.SIGSTOP, TERM: signal.SIGTERM}
        os.kill(child["pid"], signum[planned.kind])
        self.load.fault(planned.kind, child["pid"])
        if planned.kind == STOP:
            self._stopped = int(child["pid"])
        return (f"{planned.kind} slot {planned.target} (pid {child['pid']}, "
                f"{child['in_flight']} runs in flight)")

    def _continue_child(self) -> str:
        pid, self._stopped = self._stopped, 0
        resume(pid, self.load)
        return f"undo {STOP}: SIGCONT pid {pid}"

    def _crash(self, planned: Planned) -> str:
        self.fleet.reap()  # SIGKILL of its process group, waited for
        self.load.fault(CRASH, self.fleet.pid)
        return f"{CRASH} (pgid {self.fleet.pid})"

    def _restart_fleet(self) -> str:
        self.fleets.append(self.start_fleet())
        return f"undo {CRASH}: {self.fleet.name} started"

    def _kill_store(self, planned: Planned) -> str:
        assert self.server is not None, "a Valkey fault on a schedule without a server"
        pid = self.server.pid
        self.server.kill()
        self.load.fault(STORE_KILL, pid)
        return f"{STORE_KILL} (pid {pid})"

    def _restart_store(self) -> str:
        assert self.server is not None
        self.server.launch(keep_port=True)  # the same port and data directory
        self.server.wait_ready()
        self.load.fault("valkey started", self.server.pid)
        return f"undo {STORE_KILL}: started again (pid {self.server.pid})"

    def _restart_worker(self) -> str:
        assert self.start_worker is not None
        self.workers.append(self.start_worker())
        return f"undo {WORKER_KILL}: {self.workers[-1][0].log_path.stem} started"

    def _unlock(self) -> str:
        locker, self._locker = self._locker, None
        assert locker is not None
        with locker:  # closes its pipes
            assert locker.stdin is not None
            locker.stdin.close()
            assert locker.wait(30) == 0
        self.load.fault("sqlite unlocked", locker.pid)
        return f"undo {STORE_LOCK}: released"

    def close(self) -> None:
        """End what a failed test left struck: a stopped child, a lock held (the workers
        are the test's to reap)."""
        if self._stopped:
            resume(self._stopped, self.load)
        if self._locker is not None:
            with self._locker:
                self._locker.kill()

    def _child(self, slot: int) -> dict[str, Any] | None:
        """The ready child in ``slot`` of the fleet now running, once it holds runs (or
        after ``BUSY_WAIT`` without); None until then."""
        status = self.fleet.status()
        if status is None:
            return None
        child = next((c for c in ready(status) if c["slot"] == slot), None)
        if child is None or (child["in_flight"] == 0 and self._waited() < BUSY_WAIT):
            return None
        return child

    def _kill_worker(self, planned: Planned) -> str | None:
        """SIGKILL the standalone worker once it is ready and holds runs (or is ready after
        ``BUSY_WAIT``); None until then."""
        worker, _port = self.workers[-1]
        in_flight = self._worker_ready()
        if in_flight is None or (in_flight == 0 and self._waited() < BUSY_WAIT):
            return None
        worker.proc.kill()
        worker.proc.wait(10)
        self.load.fault(WORKER_KILL, worker.pid)
        return f"{WORKER_KILL} (pid {worker.pid}, {in_flight} runs in flight)"

    def _lock(self, planned: Planned) -> str:
        assert self.sqlite_path is not None, "a SQLite fault on a schedule without its file"
        self._locker = subprocess.Popen([sys.executable, "-c", _LOCKER, self.sqlite_path],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)
        assert self._locker.stdout is not None
        assert self._locker.stdout.readline().strip() == "locked"  # waits for the lock
        self.load.fault(STORE_LOCK, self._locker.pid)
        return f"{STORE_LOCK} (pid {self._locker.pid})"

    def _failover(self, planned: Planned) -> str:
        assert self.cluster is not None, "a failover on a schedule without a cluster"
        replicas = sorted(self.cluster.replicas(), key=lambda node: node.port)
        target = planned.target % len(replicas)
        replica = replicas[target]
        with replica.client(decode_responses=True) as client:
            client.execute_command("CLUSTER", "FAILOVER")
        self.load.fault(FAILOVER, replica.port)
        wait_until(lambda: _role(replica) == "master", 20, what=f"{replica.url} promoted")
        self.cluster.wait_healthy()
        return f"{FAILOVER} on replica {target} (port {replica.port})"


def _role(node: Server) -> str:
    with node.client(socket_timeout=2, decode_responses=True) as client:
        return str(client.info("replication")["role"])
