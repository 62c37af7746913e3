"""Real ``pyrula worker`` processes for the process tests: an app, spawning, logs, probes.

Every child runs ``python -m pyrula.cli`` from this worktree's ``src`` with its working
directory in the test's ``tmp_path``, where the app module (``APP``) and the shared SQLite
file live. Its stdout and stderr go to a log file there, read while it runs.

The app's steps leave traces in files next to it, so a test can see from outside which
process ran which step and when a step is blocked:

* ``effects.log``: one line ``<step> <tag> <pid>`` per execution of a step;
* ``gate-<tag>``: ``two`` (and ``conc``) block until the test creates it;
* ``active-<tag>``: exists while ``conc`` runs; ``conc`` logs how many it saw on entry;
* ``hog`` blocks the worker's event loop with ``time.sleep``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.conftest import wait_until

SRC = Path(__file__).resolve().parents[2] / "src"
APP_MODULE = "procapp"
STORE_FILE = "store.db"
STORE_URL = f"sqlite:///{STORE_FILE}"  # relative to the child's cwd, the test's tmp_path

APP = textwrap.dedent(
    '''
    """The workflow app of the process tests (written by tests/integration/workerprocs.py)."""

    import logging
    import os
    import time
    from pathlib import Path

    from pyrula.workflows import step, workflow

    HERE = Path(__file__).resolve().parent


    def _mark(what: str) -> None:
        with open(HERE / "effects.log", "a") as f:
            f.write(f"{what} {os.getpid()}\\n")


    def _wait_for(path: Path) -> None:
        while not path.exists():
            time.sleep(0.01)


    @step
    def one(tag: str) -> str:
        _mark(f"one {tag}")
        return "one"


    @step
    def two(tag: str) -> str:
        _mark(f"two {tag}")
        _wait_for(HERE / f"gate-{tag}")
        return f"two-{os.getpid()}"


    @workflow(name="pp_two_steps")
    async def two_steps(ctx, params):
        first = await one(params["tag"])
        second = await two(params["tag"])
        return {"one": first, "two": second}


    @step
    def conc(tag: str) -> int:
        active = HERE / f"active-{tag}"
        active.touch()
        seen = len(list(HERE.glob("active-*")))
        _mark(f"conc {tag} seen={seen}")
        _wait_for(HERE / f"gate-{tag}")
        active.unlink()
        return seen


    @workflow(name="pp_concurrent")
    async def concurrent(ctx, params):
        return await conc(params["tag"])


    @step
    async def hog(tag: str, seconds: float) -> str:
        _mark(f"hog {tag}")
        time.sleep(seconds)  # blocks the worker's event loop (and releases the GIL)
        return "hogged"


    @workflow(name="pp_hog")
    async def hog_run(ctx, params):
        return await hog(params["tag"], params["seconds"])


    @step
    def chatty(tag: str) -> str:
        logging.getLogger("procapp").info("charging %s", tag)
        return tag


    @workflow(name="pp_logs")
    async def logs_run(ctx, params):
        logging.getLogger("procapp").warning("starting %s", params["tag"])
        return await chatty(params["tag"])
    '''
)


def write_app(directory: Path) -> Path:
    path = directory / f"{APP_MODULE}.py"
    path.write_text(APP)
    return path


def free_port() -> int:
    """A TCP port free right now (the child binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env(**extra: str) -> dict[str, str]:
    """The test's environment minus any PYRULA_* setting, with this worktree's code."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYRULA_")}
    env["PYTHONPATH"] = str(SRC)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


class WorkerProcess:
    """One ``python -m pyrula.cli <command>`` child and its log file."""

    def __init__(self, directory: Path, name: str, args: list[str], env: dict[str, str]) -> None:
        self.log_path = directory / f"{name}.log"
        self._log_file = open(self.log_path, "wb")  # noqa: SIM115 (closed in reap)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pyrula.cli", *args],
            cwd=directory, env=env, stdin=subprocess.DEVNULL,
            stdout=self._log_file, stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def json_events(self) -> list[dict[str, Any]]:
        """The log lines of a ``--log-format json`` child that parse as JSON."""
        events = []
        for line in self.log().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        return events

    def wait_for_log(self, text: str, timeout: float = 15.0, count: int = 1) -> str:
        """Wait until ``count`` lines of the log contain ``text``; fail if the child exits."""

        def seen() -> str | None:
            log = self.log()
            if sum(text in line for line in log.splitlines()) >= count:
                return log
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"worker exited with {self.proc.returncode} before logging {text!r}:\n{log}"
                )
            return None

        result: str = wait_until(seen, timeout, what=f"{text!r} in {self.log_path.name}")
        return result

    def send(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 20.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"worker {self.pid} still running after {timeout} s:\n{self.log()}"
            ) from None

    def running(self) -> bool:
        return self.proc.poll() is None

    def reap(self) -> None:
        """Make sure the child is gone (it may be stopped: continue it first)."""
        if self.proc.poll() is None:
            for signum in (signal.SIGCONT, signal.SIGKILL):
                try:
                    self.proc.send_signal(signum)
                except ProcessLookupError:
                    break
            self.proc.wait(10)
        self._log_file.close()


class Workers:
    """Starts worker processes in one directory and reaps every one at the end."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: list[WorkerProcess] = []
        write_app(directory)

    def start(
        self,
        *options: str,
        command: str = "worker",
        name: str | None = None,
        env: dict[str, str] | None = None,
    ) -> WorkerProcess:
        args = [command, "--app", APP_MODULE, "--store", STORE_URL, *options]
        worker = WorkerProcess(
            self.directory, name or f"worker-{len(self.started)}", args,
            env if env is not None else child_env(),
        )
        self.started.append(worker)
        return worker

    def effects(self) -> list[list[str]]:
        """``effects.log`` as lines of words: [step, tag, ..., pid]."""
        path = self.directory / "effects.log"
        if not path.exists():
            return []
        return [line.split() for line in path.read_text().splitlines() if line.strip()]

    def ran(self, step: str, tag: str) -> list[int]:
        """The pids of the processes that executed ``step`` for ``tag``, in order."""
        return [int(words[-1]) for words in self.effects() if words[:2] == [step, tag]]

    def wait_ran(self, step: str, tag: str, pid: int, timeout: float = 15.0) -> None:
        wait_until(lambda: pid in self.ran(step, tag), timeout,
                   what=f"step {step} of {tag} running in process {pid}")

    def open_gate(self, tag: str) -> None:
        (self.directory / f"gate-{tag}").touch()

    def reap(self) -> None:
        for worker in self.started:
            worker.reap()

    def __iter__(self) -> Iterator[WorkerProcess]:
        return iter(self.started)


def http_get(url: str, timeout: float = 2.0) -> tuple[int, dict[str, Any]]:
    """GET ``url``: (status, JSON body), 5xx answers included."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())
