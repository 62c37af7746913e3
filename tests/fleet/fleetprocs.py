"""Real ``pyrula-fleet start`` processes for the fleet tests: an app, spawning, probes, reaping.

Every fleet runs ``pyrula.cli.fleet`` from this worktree's ``src``, in its own session (so
its supervisor, fork server and children form one process group the test kills as a whole
at teardown), with its working directory in the test's ``tmp_path``, where the app module
(``APP``) and the shared SQLite file live. Its output goes to a log file there.

The app's steps leave traces next to it, so a test can see from outside which process ran
which step:

* ``effects.log``: one line ``<step> <tag> <pid>`` per execution of a step;
* ``gate-<tag>``: ``gated`` blocks until the test creates it; ``hog`` blocks its child's
  event loop with ``time.sleep`` unless it exists.

Nothing here sleeps for a fixed time: ``Fleet.wait_status`` polls ``/status`` with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import wait_until
from tests.servers import free_port

SRC = Path(__file__).resolve().parents[2] / "src"
APP_MODULE = "fleetapp"
STORE_FILE = "store.db"
STORE_URL = f"sqlite:///{STORE_FILE}"  # relative to the fleet's cwd, the test's tmp_path
FLEET = [sys.executable, "-c", "from pyrula.cli.fleet import main; main()"]
#: Options that make every fleet of the tests quick to drain.
QUICK = ("--shutdown-grace", "10", "--cancel-timeout", "1")

APP = textwrap.dedent(
    '''
    """The workflow app of the fleet tests (written by tests/fleet/fleetprocs.py)."""

    import asyncio
    import os
    import signal
    import time
    from pathlib import Path

    from pyrula.workflows import step, workflow

    HERE = Path(__file__).resolve().parent
    VERSION = "v1"


    def _mark(what: str) -> None:
        with open(HERE / "effects.log", "a") as f:
            f.write(f"{what} {os.getpid()}\\n")


    @step
    def step_a(tag: str) -> str:
        _mark(f"step_a {tag}")
        time.sleep(0.05)
        return "a"


    @step
    def step_b(tag: str) -> str:
        _mark(f"step_b {tag}")
        time.sleep(0.05)
        return "b"


    @workflow(name="fa_load")
    async def load(ctx, params):
        return [await step_a(params["tag"]), await step_b(params["tag"])]


    @step
    def gated(tag: str) -> int:
        _mark(f"gated {tag}")
        while not (HERE / f"gate-{tag}").exists():
            time.sleep(0.01)
        return os.getpid()


    @workflow(name="fa_gated")
    async def gated_run(ctx, params):
        return await gated(params["tag"])


    @workflow(name="fa_version")
    async def version(ctx, params):
        return VERSION


    @step
    def die(tag: str, delay: float) -> None:
        _mark(f"die {tag}")
        time.sleep(delay)
        os.kill(os.getpid(), signal.SIGKILL)


    @workflow(name="fa_poison")
    async def poison(ctx, params):
        await die(params["tag"], params.get("delay", 0.0))
        return "unreachable"


    @step
    async def dwell(tag: str, seconds: float) -> str:
        await asyncio.sleep(seconds)
        return f"{tag} dwelt {seconds:g} s"


    @workflow(name="fa_dwell")
    async def dwelling(ctx, params):
        return await dwell(params["tag"], params["seconds"])


    async def hog(tag: str, seconds: float) -> str:
        _mark(f"hog {tag}")
        if not (HERE / f"gate-{tag}").exists():
            time.sleep(seconds)  # blocks this child's event loop (and releases the GIL)
        return "hogged"


    @workflow(name="fa_hog")
    async def hog_run(ctx, params):
        return await hog(params["tag"], params["seconds"])
    '''
)


def write_app(directory: Path, text: str = APP, module: str = APP_MODULE) -> Path:
    path = directory / f"{module}.py"
    path.write_text(text)
    return path


def child_env(**extra: str) -> dict[str, str]:
    """The test's environment minus settings the fleet reads, with this worktree's code."""
    skip = ("PYRULA_", "PORT", "WEB_CONCURRENCY")
    env = {k: v for k, v in os.environ.items() if not k.startswith(skip)}
    env["PYTHONPATH"] = str(SRC)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    """GET ``url``: (status, body text), 5xx answers included."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


class Fleet:
    """One fleet process (its own session) and its log file."""

    def __init__(self, directory: Path, name: str, command: list[str], env: dict[str, str],
                 port: int | None) -> None:
        self.name = name
        self.port = port
        self.log_path = directory / f"{name}.log"
        self._log_file = open(self.log_path, "wb")  # noqa: SIM115 (closed in reap)
        self.proc = subprocess.Popen(
            command, cwd=directory, env=env, stdin=subprocess.DEVNULL,
            stdout=self._log_file, stderr=subprocess.STDOUT, start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str) -> tuple[int, str]:
        return http_get(self.url + path)

    def status(self) -> dict[str, Any] | None:
        """The /status body, or None while the fleet does not answer."""
        try:
            code, body = self.get("/status")
        except (OSError, urllib.error.URLError):
            return None
        assert code == 200, body
        result: dict[str, Any] = json.loads(body)
        return result

    def wait_status(self, condition: Callable[[dict[str, Any]], Any], timeout: float = 20.0,
                    what: str = "") -> dict[str, Any]:
        """Poll /status until ``condition(status)`` holds; fail at once if the fleet exits."""
        last: list[dict[str, Any] | None] = [None]

        def check() -> dict[str, Any] | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"fleet {self.name} exited with {self.proc.returncode} "
                                     f"while waiting for {what}:\n{self.log()}")
            status = self.status()
            last[0] = status
            return status if status is not None and condition(status) else None

        try:
            result: dict[str, Any] = wait_until(check, timeout, interval=0.05, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nlast /status: {last[0]}\n{self.log()[-6000:]}") from None
        return result

    def wait_ready(self, n: int, timeout: float = 20.0) -> dict[str, Any]:
        return self.wait_status(lambda s: len(ready(s)) == n and s["status"] == "ok", timeout,
                                what=f"{n} ready children")

    def wait_for_log(self, text: str, timeout: float = 20.0) -> str:
        def seen() -> str | None:
            log = self.log()
            return log if text in log else None

        try:
            result: str = wait_until(seen, timeout, what=f"{text!r} in {self.log_path.name}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.log()[-6000:]}") from None
        return result

    def wait_for_log_count(self, text: str, count: int, timeout: float = 20.0) -> str:
        """Wait until ``text`` occurs at least ``count`` times in the log."""
        def seen() -> str | None:
            log = self.log()
            return log if log.count(text) >= count else None

        try:
            result: str = wait_until(seen, timeout, what=f"{count} x {text!r} in "
                                                         f"{self.log_path.name}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.log()[-6000:]}") from None
        return result

    def send(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"fleet {self.pid} still running after {timeout} s:\n{self.log()[-6000:]}"
            ) from None

    def reap(self) -> None:
        """Kill the whole process group (supervisor, fork server, children; stopped ones
        too) and wait until none of it is left."""
        for signum in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.killpg(self.pid, signum)
            except ProcessLookupError:
                break
        try:
            self.proc.wait(10)
        finally:
            self._log_file.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and group_alive(self.pid):
            time.sleep(0.02)


def group_alive(pgid: int) -> bool:
    """True while a live (not zombie) process of the group is left."""
    import psutil

    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return False


def ready(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in status["children"] if c["state"] == "ready"]


def pids(status: dict[str, Any]) -> dict[int, int]:
    """slot -> pid of the children listed in a /status body."""
    return {c["slot"]: c["pid"] for c in status["children"]}


class Fleets:
    """Starts fleets in one directory and reaps every one at the end."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: list[Fleet] = []
        write_app(directory)

    def start(self, *options: str, app: str | None = APP_MODULE, store: str | None = STORE_URL,
              port: int | None = None, health_port: bool = True, name: str | None = None,
              env: dict[str, str] | None = None, command: list[str] | None = None) -> Fleet:
        """``pyrula-fleet start [--app APP] [--store STORE] --health-port PORT *options``."""
        args = ["start"]
        if app is not None:
            args += ["--app", app]
        if store is not None:
            args += ["--store", store]
        if port is None and health_port:
            port = free_port()
        if health_port:
            args += ["--health-port", str(port)]
        fleet = Fleet(self.directory, name or f"fleet-{len(self.started)}",
                      (command or FLEET) + args + list(options),
                      env if env is not None else child_env(), port)
        self.started.append(fleet)
        return fleet

    def effects(self) -> list[list[str]]:
        """``effects.log`` as lines of words: [step, tag, pid]."""
        path = self.directory / "effects.log"
        if not path.exists():
            return []
        return [line.split() for line in path.read_text().splitlines() if line.strip()]

    def ran(self, step: str, tag: str) -> list[int]:
        """The pids of the processes that executed ``step`` for ``tag``, in order."""
        return [int(words[-1]) for words in self.effects() if words[:2] == [step, tag]]

    def open_gate(self, tag: str) -> None:
        (self.directory / f"gate-{tag}").touch()

    def reap(self) -> None:
        for fleet in self.started:
            fleet.reap()

    def __enter__(self) -> Fleets:
        return self

    def __exit__(self, *exc: object) -> None:
        self.reap()


class StatusRecorder:
    """Polls a fleet's /status on a thread of its own and keeps every answer, so a test can
    check a property held *throughout* (e.g. capacity during a rolling replacement)."""

    def __init__(self, fleet: Fleet, interval: float = 0.05) -> None:
        import threading

        self.fleet = fleet
        self.samples: list[dict[str, Any]] = []
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="status-recorder", daemon=True)

    def _main(self) -> None:
        while not self._stop.is_set():
            status = self.fleet.status()
            if status is not None:
                self.samples.append(status)
            self._stop.wait(self._interval)

    def __enter__(self) -> StatusRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def min_ready(self) -> int:
        assert self.samples, "no /status answer was recorded"
        return min(len(ready(s)) for s in self.samples)
