"""Exporting the trace of each run a worker ends, off the attempt's path.

When an attempt ends its run (completed, failed, cancelled, continued as new), the run's
journal is read again and its trace handed to the worker's ``span_exporter``
(``pyrula.workflows.tracing``), in a task of its own: the attempt's slot is free already,
and an exporter that is slow or down delays and fails no run. A failing export is logged
once until one works again (``trace_export_failed`` / ``trace_export_recovered``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pyrula.workflows.stores.base import Store
from pyrula.workflows.tracing import export_run

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

logger = logging.getLogger(__name__)


class TraceExports:
    """The trace exports of one worker: started by ``run_ended``; the shutdown waits for
    ``tasks`` (``worker.shutdown``, step 4)."""

    def __init__(self, store: Store, exporter: SpanExporter, log: Mapping[str, str]) -> None:
        self._store = store
        self._exporter = exporter
        self._log = log
        self._failing = False
        self.tasks: set[asyncio.Task[None]] = set()
        self.exported = 0

    def run_ended(self, run_id: str) -> None:
        """Export ``run_id``'s trace in the background (called on the event loop)."""
        task = asyncio.create_task(self._export(run_id), name=f"pyrula-trace:{run_id}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _export(self, run_id: str) -> None:
        try:
            await export_run(self._store, run_id, self._exporter)
        except Exception as exc:
            if not self._failing:
                self._failing = True
                logger.warning(
                    "trace_export_failed: the trace of run %s was not exported (%s: %s); "
                    "further failures are not logged until an export works again",
                    run_id, type(exc).__name__, exc,
                    extra={"event": "trace_export_failed", "run_id": run_id, **self._log},
                )
            return
        self.exported += 1
        if self._failing:
            self._failing = False
            logger.info("trace_export_recovered: traces are exported again",
                        extra={"event": "trace_export_recovered", **self._log})
