"""Children: spawn (through the fork server), watch, terminate, kill. Mechanism only.

The fork server is a process of its own, started from a clean interpreter before the
supervisor opens anything; it imports the app once (``preload``) and forks each child from
that state: copy-on-write sharing of the app, no fork of a process with threads, loops or
sockets, and a respawn in milliseconds. Where fork is unavailable, children are spawned
as fresh interpreters instead.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.util
import os
import signal
import time
from dataclasses import dataclass, field
from enum import StrEnum
from multiprocessing.connection import Connection
from typing import Any

from pyrula.errors import PyrulaError
from pyrula.shared_report import SharedReport
from pyrula.supervisor import forkserver, trampoline
from pyrula.wire import Heartbeat, WorkerState, decode, heartbeat_message, parse_heartbeat


class ChildState(StrEnum):
    """A child as the fleet's ``/status`` reports it (``children[].state``)."""

    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"


@dataclass(eq=False)
class Child:
    """One child process and what the supervisor knows of it."""

    slot: int
    process: Any  # multiprocessing.process.BaseProcess
    conn: Connection
    started_at: float = field(default_factory=time.monotonic)
    last_beat: float = field(default_factory=time.monotonic)
    beat: Heartbeat | None = None
    ready_seen: bool = False
    boot_error: str | None = None
    rss_bytes: int = 0
    retiring: bool = False  # asked to drain on purpose (recycle, scale down, shutdown)
    killed_for: str | None = None
    run_limit: int | None = None
    #: The generation it belongs to (a new one starts with each upgrade).
    generation: int = 1
    #: Which fork server forked it (``Spawner.server``; a reload starts a new one).
    server: int = 0
    #: Its last metrics report (``pyrula.metrics`` families), and the workflows it serves.
    metrics: dict[str, Any] = field(default_factory=dict)
    workflows: list[str] = field(default_factory=list)
    #: Where it reports the runs it holds at each claim (read once it has exited).
    board: SharedReport | None = None

    @property
    def state(self) -> ChildState:
        """Draining once asked to drain or once it says so; ready once its heartbeat says
        so; starting until then."""
        beat = self.beat
        if self.retiring or (beat is not None and beat.state in ("draining", "stopped")):
            return ChildState.DRAINING
        if beat is not None and beat.state == WorkerState.READY:
            return ChildState.READY
        return ChildState.STARTING

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    def take_report(self) -> None:
        """Once it has exited: fold the report it last wrote to its board into its last
        heartbeat when that report is the newer, then let the board go. Its held runs,
        the runs in their code and its suspects are then as it last said."""
        board, self.board = self.board, None
        if board is None:
            return
        try:
            found = board.read()
        finally:
            board.close()
        if found is None or (self.beat is not None and found[0] <= self.beat.seq):
            return
        seq, report = found
        known = decode(heartbeat_message(self.beat)) if self.beat is not None else {
            "worker_id": report.get("worker_id", ""), "pid": self.pid}
        self.beat = parse_heartbeat({**known, **report, "seq": seq})

    @property
    def sentinel(self) -> int:
        return int(self.process.sentinel)

    @property
    def exitcode(self) -> int | None:
        code = self.process.exitcode
        return None if code is None else int(code)

    def terminate(self) -> None:
        """Ask the child to drain (SIGTERM: the worker's shutdown sequence)."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            pass


class Spawner:
    """Starts children from the fork server (or as fresh interpreters without fork)."""

    def __init__(self, preload: list[str], check: dict[str, Any] | None = None) -> None:
        self.preload = preload
        #: What the fork server checks after its preload (``PRELOAD_CHECK_ENV``).
        self.check = check
        self._retired: list[int] = []  # fork servers replaced by reload(), not yet reaped
        #: The fork server children are forked by now (counts reloads).
        self.server = 0
        methods = multiprocessing.get_all_start_methods()
        self.method = "forkserver" if "forkserver" in methods else "spawn"
        self._ctx = multiprocessing.get_context(self.method)
        self._set_preload()

    def _set_preload(self) -> None:
        """Preload the app in the fork server through ``preload`` (which survives an app
        that fails to import), not by name."""
        if self.method == "forkserver":
            forkserver.configure(self.preload, self.check)

    def checked(self, poll: float = 0.01) -> dict[str, Any] | None:
        """Wait for the fork server's app check (started by ``warm``) and return its
        report: ``{"ok": true}``, or ``{"ok": false, "message", "frames"}`` when the app
        cannot load. None where there is no fork server, or no check was asked for."""
        if self.method != "forkserver" or self.check is None:
            return None
        report = str(self.check["report"])
        server: Any = multiprocessing.forkserver._forkserver  # private state, stable since 3.4
        while not os.path.exists(report):
            pid = server._forkserver_pid
            if pid is None or os.waitpid(pid, os.WNOHANG)[0] == pid:
                return {"ok": False, "message": "the fork server exited while it loaded the "
                        "app", "frames": ""}
            time.sleep(poll)
        with open(report) as source:
            outcome: dict[str, Any] = json.load(source)
        return outcome

    def warm(self) -> None:
        """Start the fork server now (it imports the app), before the supervisor opens
        sockets or threads of its own; multiprocessing's resource tracker is left to
        ``start_tracker`` (or the first spawn)."""
        if self.method == "forkserver":
            forkserver.start(tracker_later=True)  # the caller starts it: start_tracker

    def start_tracker(self) -> None:
        """Start multiprocessing's resource tracker (children are handed it at spawn)."""
        if self.method == "forkserver":
            forkserver.start_tracker()

    def reload(self) -> None:
        """Make the next children load the code anew (SIGHUP): start a new fork server."""
        if self.method != "forkserver":
            return
        self.replace_server()
        self.server += 1

    def replace_server(self) -> None:
        """Start a new fork server with this spawner's preload, in place of the running one.

        The old one is left to exit by itself rather than stopped: the children it forked
        (the workers still serving until their replacements are ready) hold its "alive"
        pipe and learn of their exits through it, so it outlives the last of them.
        ``ForkServer._stop`` would wait for that, blocking the supervisor's loop.
        """
        if self.method != "forkserver":
            return
        self._reap_retired()
        server: Any = multiprocessing.forkserver._forkserver  # private state, stable since 3.4
        with server._lock:
            if server._forkserver_pid is not None:
                os.close(server._forkserver_alive_fd)
                self._retired.append(server._forkserver_pid)
                address = server._forkserver_address
                if address and not multiprocessing.util.is_abstract_socket_namespace(address):
                    with contextlib.suppress(OSError):
                        os.unlink(address)
                server._forkserver_alive_fd = None
                server._forkserver_pid = None
                server._forkserver_address = None
        self._set_preload()
        forkserver.start()

    def _reap_retired(self) -> None:
        """Collect the fork servers replaced by ``reload`` that have exited since."""
        for pid in list(self._retired):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self._retired.remove(pid)

    def spawn(self, slot: int, config: dict[str, Any]) -> Child:
        self._reap_retired()
        # Both ways: the child reports; the supervisor tells it to retire or take a run.
        reader, writer = self._ctx.Pipe(duplex=True)
        try:
            board: SharedReport | None = SharedReport()
        except OSError:  # no shared memory here: the child reports over its pipe alone
            board = None
        process = self._ctx.Process(  # type: ignore[attr-defined]
            target=trampoline.run,
            args=(trampoline.CHILD_ENTRY, config, writer, *([board] if board else [])),
            name=f"pyrula-child-{slot}",
            daemon=False,
        )
        try:
            process.start()
        except BaseException:
            if board is not None:
                board.close()
            raise
        finally:
            writer.close()
        return Child(slot=slot, process=process, conn=reader, server=self.server,
                     board=board)

    def close(self) -> None:
        if self.method == "forkserver":
            server = multiprocessing.forkserver._forkserver
            stop = getattr(server, "_stop", None)
            if stop is not None:
                stop()


def describe_exit(code: int | None) -> tuple[str, str | None]:
    """(``"exit code 3"`` or ``"signal SIGKILL"``, the signal's name or None)."""
    if code is None:
        return "still running", None
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"signal {name}", name
    return f"exit code {code}", None


class ForkFailed(PyrulaError):
    """The host refused to start a child process; the fleet has killed the ones it had."""


class Slot:
    """One of the fleet's places for a child: the child in it, a replacement on its way,
    and its restarts."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.child: Child | None = None
        self.incoming: Child | None = None  # a replacement starting (recycle, reload)
        self.restarts = 0
        self.respawn_at: float | None = None
