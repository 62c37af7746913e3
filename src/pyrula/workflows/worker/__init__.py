"""WorkflowWorker: the production runtime (loops, lock renewal, probes, shutdown)."""

from pyrula.config.worker import WorkerOptions
from pyrula.workflows.worker.worker import WorkflowWorker

__all__ = ["WorkerOptions", "WorkflowWorker"]
