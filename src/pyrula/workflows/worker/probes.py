"""A worker's probes: /livez (its loops turn), /readyz (it serves), /metrics.

/livez fails (503 ``loop_failed``) once a loop has failed for ``LIVENESS_FAILURE_S``
without a completed tick (``loops.failing_loop``), or a loop died and stopped the worker;
otherwise it answers 200, also while the worker drains and after ``run()`` returned
(``stopped``), for as long as the server is kept (``WorkflowWorker.aclose``). /readyz says
why the worker does not serve: a loop died, it drains or has stopped, a loop failed, the
store is bound to another project, it is still starting, or the store does not answer a
ping within ``PING_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from pyrula.errors import ConfigurationError
from pyrula.health_http import ProbeServer, bind_failure
from pyrula.metrics import Metrics, record_queues
from pyrula.wire import WorkerState
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.capabilities import QueueStats
from pyrula.workflows.worker.loops import failing_loop
from pyrula.workflows.worker.runtime import Runtime

logger = logging.getLogger(__name__)

PING_TIMEOUT_S = 2.0
#: A claim completed this recently shows the store answers (``store_reachable``); an idle
#: claim loop completes one about every second.
STORE_SEEN_S = 2.0


class HealthPortUnavailable(ConfigurationError, OSError):
    """The probes cannot listen where they were told (the port is taken, or not allowed).

    A ConfigurationError, so the commands print it in one line and exit 2; still the
    OSError (with its ``errno``) that code catching the bind failure expects."""


class Probed(Protocol):
    """What the probes report of a worker."""

    @property
    def worker_id(self) -> str: ...

    @property
    def store(self) -> Store: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def in_flight(self) -> int: ...

    @property
    def step_threads_busy(self) -> int: ...

    @property
    def workflow_names(self) -> list[str]: ...

    def now(self) -> float:
        """The worker's clock (the store's where it has one)."""
        ...

    def shards(self) -> dict[str, int]: ...


class Probes:
    def __init__(self, worker: Probed, runtime: Runtime,
                 queue_stats: QueueStats | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._w = worker
        self._rt = runtime
        self._queue_stats = queue_stats
        self._monotonic = monotonic

    async def start(self, host: str, port: int) -> tuple[ProbeServer, tuple[str, int]]:
        """Serve the probes on ``host``:``port``; the server and the address it listens on."""
        server = ProbeServer(
            {"/livez": self.livez, "/readyz": self.readyz, "/metrics": self.metrics},
            host, port,
        )
        try:
            address = await server.start()
        except OSError as exc:  # the user's port or host: one line, not a traceback
            refused = HealthPortUnavailable(bind_failure(host, port, exc))
            refused.errno = exc.errno
            raise refused from None
        logger.info("health probes on http://%s:%d", *address,
                    extra={"worker_id": self._w.worker_id})
        return server, address

    async def store_reachable(self) -> bool:
        """Whether the store answers now: a claim that completed within the last
        ``STORE_SEEN_S`` says so at no cost; otherwise a ``ping()`` within 2 s."""
        claim = self._rt.loops.get("claim")
        if claim is not None and claim.failing_since is None and claim.last_ok is not None \
                and time.monotonic() - claim.last_ok < STORE_SEEN_S:
            return True
        try:
            await asyncio.wait_for(self._w.store.aping(), PING_TIMEOUT_S)
        except Exception:  # any failure to answer in time: not reachable
            return False
        return True

    def _failed_loop(self) -> str | None:
        """A loop failing past the liveness window, while the loops run (they end at
        ``stop()``: a failure they left behind is no longer a failing loop)."""
        if self._rt.stop_requested:
            return None
        return failing_loop(self._rt.loops.values(), self._monotonic())

    def _died(self) -> tuple[int, Any] | None:
        rt = self._rt
        if rt.fatal is None:
            return None
        return 503, {"status": "loop_failed", "loop": rt.died, "worker_id": self._w.worker_id}

    async def livez(self) -> tuple[int, Any]:
        worker_id = self._w.worker_id
        died = self._died()
        if died is not None:
            return died
        if self._rt.state is WorkerState.STOPPED:
            return 200, {"status": "stopped", "worker_id": worker_id}
        failed = self._failed_loop()
        if failed is not None:
            return 503, {"status": "loop_failed", "loop": failed, "worker_id": worker_id}
        return 200, {"status": "ok", "worker_id": worker_id}

    async def readyz(self) -> tuple[int, Any]:
        body: dict[str, Any] = {"worker_id": self._w.worker_id}
        rt = self._rt
        died = self._died()
        if died is not None:
            return died
        if rt.state is WorkerState.STOPPED:
            return 503, {"status": "stopped", **body}
        if rt.stop_requested or rt.state is WorkerState.DRAINING:
            return 503, {"status": "draining", **body}
        if self._failed_loop() is not None:
            return 503, {"status": "loop_failed", **body}
        if not rt.binding_ok:
            return 503, {"status": "store_binding_mismatch", **body}
        if rt.state is WorkerState.STARTING:
            return 503, {"status": "store_unreachable" if rt.store_waiting else "starting",
                         **body}
        try:
            await asyncio.wait_for(self._w.store.aping(), PING_TIMEOUT_S)
        except Exception:  # any failure to answer in time means not ready
            return 503, {"status": "store_unreachable", **body}
        return 200, {"status": "ready", "shards": self._w.shards(),
                     "in_flight": self._w.in_flight, **body}

    async def metrics(self) -> tuple[int, Any]:
        metrics = self._w.metrics
        metrics.set("pyrula.workflows.runs.in_flight", float(self._w.in_flight))
        metrics.set("pyrula.workflows.step_threads.busy", float(self._w.step_threads_busy))
        if self._queue_stats is not None:
            await record_queues(metrics, self._queue_stats, self._w.workflow_names,
                                self._w.now())
        return 200, metrics.prometheus()
