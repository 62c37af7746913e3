"""A real ``pyrula cloud serve`` process for the Cloud tests, and its keys and API.

The collector runs from this worktree's ``src`` in the test's directory, on a free port,
with its SQLite file there; ``restart()`` starts it again on the same port and file.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.conftest import wait_until
from tests.integration.workerprocs import child_env, free_port

CLI = [sys.executable, "-m", "pyrula.cli"]


def request(url: str, key: str | None = None, body: Any = None) -> tuple[int, Any]:
    """GET (or POST ``body`` as JSON) with ``key`` as a bearer token: (status, JSON)."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers,
                                 method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None


class Collector:
    def __init__(self, directory: Path, store: str | None = None) -> None:
        """A collector keeping its data in ``directory``'s SQLite file, or in ``store``
        (a ``postgresql://`` DSN)."""
        self.directory = directory
        self.db = directory / "cloud.db"
        self.store = store or f"sqlite:///{self.db}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> Collector:
        self.starts += 1
        log = open(self.directory / f"collector-{self.starts}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*CLI, "cloud", "serve", "--port", str(self.port), "--store", self.store],
            cwd=self.directory, env=child_env(), stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        wait_until(self._up, timeout=20, what="the collector to answer /healthz")
        return self

    def _up(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the collector exited: {self.log()}")
        try:
            return request(f"{self.url}/healthz")[0] == 200
        except OSError:
            return False

    def log(self) -> str:
        return "".join(p.read_text(errors="replace")
                       for p in sorted(self.directory.glob("collector-*.log")))

    def kill(self) -> None:
        """SIGKILL, no goodbye."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def create_key(self, environment: str) -> str:
        done = subprocess.run([*CLI, "cloud", "keys", "create", environment, "--store",
                               self.store], cwd=self.directory, env=child_env(),
                              capture_output=True, text=True, timeout=30, check=True)
        return done.stdout.strip().splitlines()[-1]

    def get(self, path: str, key: str | None) -> tuple[int, Any]:
        return request(self.url + path, key)

    def post(self, path: str, key: str | None, body: Any) -> tuple[int, Any]:
        return request(self.url + path, key, body)

    def terminal_events(self) -> list[tuple[str, str]]:
        """(run_id, type) of every terminal event in the collector's store, read directly."""
        with sqlite3.connect(self.db) as conn:
            return list(conn.execute(
                "SELECT run_id, type FROM cloud_events WHERE type IN "
                "('run:completed', 'run:error', 'run:cancelled', 'run:continued')"))

    def reap(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
