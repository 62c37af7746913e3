"""Fleet control for the bench: start a fleet of its own or attach to a running one, read
its ``/status``, and SIGKILL a random child of it every few seconds (``--kill-every``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil

from pyrula.cli.bench.config import APP, BenchError
from pyrula.supervisor.children import ChildState

_HEALTH_LINE = re.compile(r"health on (http://\S+)")


def _get_json(url: str, timeout: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return json.loads(reply.read())


async def fetch_json(url: str, timeout: float = 5.0) -> Any:
    """GET ``url`` (off the event loop) and parse its JSON body; 5xx bodies included."""
    def get() -> Any:
        try:
            return _get_json(url, timeout)
        except urllib.error.HTTPError as exc:
            with exc:
                return json.loads(exc.read())

    return await asyncio.to_thread(get)


class Fleet:
    """A fleet the bench loads: its health URL, its ``/status`` and, to kill children
    safely, the pid of its supervisor (every child descends from it)."""

    url: str | None = None
    supervisor_pid: int | None = None

    async def status(self) -> dict[str, Any]:
        if self.url is None:
            raise BenchError("the fleet's health URL is not known yet")
        try:
            body = await fetch_json(self.url + "/status")
        except urllib.error.URLError as exc:
            raise BenchError(f"cannot reach {self.url}/status: {exc.reason}") from None
        except (OSError, ValueError) as exc:
            raise BenchError(f"cannot read {self.url}/status: {exc}") from None
        if not isinstance(body, dict) or not isinstance(body.get("children"), list):
            raise BenchError(f"{self.url}/status is not a pyrula fleet's status: {body!r:.200}")
        return body

    def exit_code(self) -> int | None:
        """The fleet's exit code once it has exited (a fleet of the bench's own only)."""
        return None


class AttachedFleet(Fleet):
    """A fleet somebody else started; the bench never stops it."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def check(self, *, want_kills: bool) -> dict[str, Any]:
        """Reach the fleet (a BenchError, exit 2, when it does not answer) and return its
        status; with ``want_kills``, make sure its children are processes of this host."""
        try:
            status = await self.status()
            livez = await fetch_json(f"{self.url}/livez")
        except BenchError as exc:
            raise BenchError(f"--attach: {exc}", code=2) from None
        if status.get("status") == "draining":
            raise BenchError(f"--attach: the fleet at {self.url} is draining", code=2)
        if want_kills:
            pid = livez.get("pid") if isinstance(livez, dict) else None
            if not isinstance(pid, int) or not _is_local_fleet(pid, status):
                raise BenchError(
                    f"--kill-every with --attach needs the fleet at {self.url} to run on this "
                    "host as this user (its children are signalled by pid)", code=2,
                )
            self.supervisor_pid = pid
        return status


def _is_local_fleet(supervisor_pid: int, status: dict[str, Any]) -> bool:
    """True if every child /status lists is a live descendant of ``supervisor_pid`` here
    (a pid of another host could name an unrelated process of this one)."""
    host = socket.gethostname()
    descendants = _descendants(supervisor_pid)
    for child in status["children"]:
        worker = child.get("worker_id")
        if worker is not None and not str(worker).startswith(f"{host}-"):
            return False
        if child.get("pid") not in descendants:
            return False
    return bool(descendants)


def _descendants(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


class OwnFleet(Fleet):
    """``pyrula-fleet start -n N --workflow pyrula.examples.bench:bench`` (that workflow
    only: the example app next to it is not served) in a child process of the bench, its
    output in ``log_path``, its health port picked by the fleet (port 0)."""

    def __init__(self, children: int, store_url: str, namespace: str | None,
                 log_path: Path, bounds: tuple[int, int] | None = None) -> None:
        self.children = children
        self.bounds = bounds
        self.store_url = store_url
        self.namespace = namespace
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYRULA_STORE_URL": self.store_url}
        for name in ("PYRULA_HEALTH_PORT", "PORT", "PYRULA_CHILDREN", "WEB_CONCURRENCY"):
            env.pop(name, None)
        if self.namespace:
            env["PYRULA_VALKEY_NAMESPACE"] = self.namespace
        elastic = [] if self.bounds is None else ["--min", str(self.bounds[0]),
                                                  "--max", str(self.bounds[1])]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "from pyrula.cli.fleet import main; main()", "start",
                 "-n", str(self.children), *elastic, "--workflow", f"{APP}:bench",
                 "--health-port", "0", "--health-host", "127.0.0.1", "--log-level", "WARNING"],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        self.supervisor_pid = self.proc.pid

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def _exited(self, what: str) -> BenchError:
        code = self.exit_code()
        tail = self.log_tail()
        return BenchError(f"the fleet exited with code {code} {what}"
                          + (f"; its last output:\n{tail}" if tail else ""),
                          code=2 if code == 2 else 1)

    async def wait_url(self, timeout: float = 60.0) -> str:
        """The health URL the fleet prints once its probes listen."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                found = _HEALTH_LINE.search(self.log_path.read_text(errors="replace"))
            except OSError:
                found = None
            if found:
                self.url = found.group(1)
                return self.url
            if self.exit_code() is not None:
                raise self._exited("before it served its health port")
            if time.monotonic() > deadline:
                raise BenchError(f"the fleet printed no health URL within {timeout:.0f} s")
            await asyncio.sleep(0.02)

    async def wait_ready(self, timeout: float = 60.0) -> dict[str, Any]:
        """Poll ``/status`` until every child is ready."""
        await self.wait_url(timeout)
        deadline = time.monotonic() + timeout
        while True:
            if self.exit_code() is not None:
                raise self._exited("while starting")
            status = await self.status()
            if status.get("status") == "ok":
                return status
            if time.monotonic() > deadline:
                raise BenchError(f"the fleet's children were not all ready within "
                                 f"{timeout:.0f} s: {status!r:.300}")
            await asyncio.sleep(0.05)

    def check_alive(self) -> None:
        if self.exit_code() is not None:
            raise self._exited("during the bench")

    async def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (the fleet drains), then SIGKILL if it takes longer than ``timeout``."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.to_thread(proc.wait, timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return await asyncio.to_thread(proc.wait)


class Killer:
    """Every ``every`` seconds, SIGKILL one random ready child of ``fleet`` (a pid from
    ``/status`` that really is a descendant of the fleet's supervisor)."""

    def __init__(self, fleet: Fleet, every: float, started: float,
                 rng: random.Random | None = None) -> None:
        self.fleet = fleet
        self.every = every
        self.started = started
        self.kills: list[dict[str, Any]] = []
        self.skipped = 0
        self._rng = rng or random.Random()

    async def run(self, stop: asyncio.Event) -> None:
        async def tick() -> None:
            try:
                await self.kill_one()
            except BenchError as exc:
                if exc.code == 2:  # not allowed to signal it: stop the bench
                    raise
                self.skipped += 1  # the fleet did not answer this time; try at the next tick

        await every(self.every, stop, tick)

    async def kill_one(self) -> dict[str, Any] | None:
        status = await self.fleet.status()
        ready = [c for c in status["children"]
                 if c.get("state") == ChildState.READY and isinstance(c.get("pid"), int)]
        root = self.fleet.supervisor_pid
        if root is not None:
            descendants = _descendants(root)
            ready = [c for c in ready if c["pid"] in descendants]
        if not ready:
            self.skipped += 1
            return None
        victim = self._rng.choice(ready)
        try:
            os.kill(victim["pid"], signal.SIGKILL)
        except ProcessLookupError:
            self.skipped += 1
            return None
        except PermissionError as exc:
            raise BenchError(f"cannot kill child {victim['pid']}: {exc}", code=2) from None
        kill = {"at_s": round(time.perf_counter() - self.started, 3), "pid": victim["pid"],
                "worker_id": victim.get("worker_id"), "slot": victim.get("slot"),
                "in_flight": victim.get("in_flight")}
        self.kills.append(kill)
        return kill


class Upgrader:
    """Every ``every`` seconds, SIGUSR2 the fleet's supervisor: a new generation of children
    under the load (``pyrula-fleet upgrade``); one still retiring makes the fleet ignore
    the signal, which it logs."""

    def __init__(self, fleet: Fleet, every: float, started: float) -> None:
        self.fleet = fleet
        self.every = every
        self.started = started
        self.sent: list[float] = []

    async def run(self, stop: asyncio.Event) -> None:
        await every(self.every, stop, self.upgrade_once)

    async def upgrade_once(self) -> None:
        pid = self.fleet.supervisor_pid
        if pid is None:
            raise BenchError("--upgrade-every needs the fleet's pid (a fleet of this host)",
                             code=2)
        try:
            os.kill(pid, signal.SIGUSR2)
        except ProcessLookupError:
            return  # the fleet is gone: the load notices
        except PermissionError as exc:
            raise BenchError(f"cannot signal the fleet ({pid}): {exc}", code=2) from None
        self.sent.append(round(time.perf_counter() - self.started, 3))


async def every(seconds: float, stop: asyncio.Event, action: Callable[[], Awaitable[None]]
                ) -> None:
    """Run ``action`` every ``seconds`` until ``stop`` is set."""
    while True:
        try:
            await asyncio.wait_for(stop.wait(), seconds)
            return
        except TimeoutError:
            pass
        await action()
