"""The worker's Cloud connector: built when ``run()`` starts, drained after the shutdown's
five steps."""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any

from pyrula.cloud.connector import CloudConnector
from pyrula.config.cloud import CloudConfig

if TYPE_CHECKING:
    from pyrula.workflows.worker.worker import WorkflowWorker


def worker_connector(config: CloudConfig, worker: WorkflowWorker) -> CloudConnector:
    """A connector reporting ``worker``'s runs and state, submitting into its store."""
    host, pid = socket.gethostname(), os.getpid()

    def source() -> dict[str, Any]:
        return {
            "kind": "fleet-child" if worker.fleet else "worker",
            "worker_id": worker.worker_id, "fleet": worker.fleet, "host": host,
            "pid": pid, "state": str(worker.state), "in_flight": worker.in_flight,
            "runs_done": worker.runs_done, "workflows": worker.workflow_names,
            "build": worker.build,
        }

    return CloudConnector(config, worker.client, source, lambda: worker.workflow_names,
                          {"worker_id": worker.worker_id})
