"""Dramatiq in the peer comparison: ``add_one`` on a ``RedisBroker`` with results in a
``RedisBackend`` (``dramatiq_app``); ``dramatiq --processes 2 --threads 8`` as workers.

1 step is one ``add_one.send(i)``; 5 steps are a ``dramatiq.pipeline`` of five ``add_one``
messages (each one after the first receives the previous result as its argument), read
with ``pipe.get_result(block=True)``. Dramatiq journals nothing: a step is a message.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks.peer_apps.harness import (
    RESULT_TIMEOUT,
    URL_ENV,
    RedisServer,
    Service,
    start_python,
    sync_throughput,
    timed_round_trips,
)

APP = "benchmarks.peer_apps.dramatiq_app"
PROCESSES = 2
THREADS = 8
TIMEOUT_MS = int(RESULT_TIMEOUT * 1000)  # Dramatiq's result timeouts are in ms


class DramatiqPeer:
    name = "dramatiq"
    scenarios: tuple[str, ...] = ("1-step", "5-step", "latency")

    def __init__(self, server: RedisServer, logs: Path, warmup: int) -> None:
        self.server = server
        self.logs = logs
        self.warmup = warmup
        self.app = _import_app(server.url)

    def run(self, scenario: str, runs: int) -> dict[str, float]:
        if scenario == "latency":
            return self.latency(runs)
        return self.throughput(runs, 5 if scenario == "5-step" else 1)

    def _spawn(self) -> Service:
        return start_python("dramatiq", [
            "-m", "dramatiq", APP, "--processes", str(PROCESSES), "--threads", str(THREADS),
        ], self.server.url, self.logs)

    @staticmethod
    def _stop(workers: Service) -> None:
        workers.stop()  # SIGTERM to the master: it stops its worker processes

    def _submit(self, i: int, steps: int) -> Any:
        import dramatiq

        add_one: Any = self.app.add_one
        if steps == 1:
            return add_one.send(i)
        messages = [add_one.message(i)] + [add_one.message() for _ in range(steps - 1)]
        pipe: Any = dramatiq.pipeline(messages)
        return pipe.run()

    def throughput(self, runs: int, steps: int) -> dict[str, float]:
        return sync_throughput(
            self.server, self.name, runs, steps,
            submit=lambda i: self._submit(i, steps),
            spawn=self._spawn,
            wait=lambda sent: sent.get_result(block=True, timeout=TIMEOUT_MS),
            stop=self._stop,
        )

    def latency(self, samples: int) -> dict[str, float]:
        self.server.reset()
        workers = self._spawn()
        try:
            add_one: Any = self.app.add_one
            figures = timed_round_trips(
                self.name, samples, self.warmup,
                lambda i: add_one.send(i).get_result(block=True, timeout=TIMEOUT_MS))
            workers.check()
        finally:
            self._stop(workers)
        return figures


def _import_app(url: str) -> ModuleType:
    """The app module reads the server's URL when it is imported (as the workers' does)."""
    os.environ[URL_ENV] = url
    from benchmarks.peer_apps import dramatiq_app

    return dramatiq_app
