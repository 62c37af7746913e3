"""Steps 2 to 4 of a worker's shutdown: the runs in flight, then the sync-step threads.

The worker runs the sequence (``WorkflowWorker._shutdown``): stop claiming → wait up to
``shutdown_grace`` for the runs in flight → stand the rest down (requeued with reason
``shutdown``) → wait up to ``cancel_timeout`` for sync step calls still in a thread →
release the shards. Every step is logged, with or without work, so the sequence reads the
same in every drain.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from pyrula.config.worker import WorkerOptions
from pyrula.workflows.worker.attempts import AttemptRunner
from pyrula.workflows.worker.held import HeldRuns
from pyrula.workflows.worker.pool import StepPool

logger = logging.getLogger(__name__)


async def drain_runs(runner: AttemptRunner | None, runs: HeldRuns, o: WorkerOptions,
                     log: Mapping[str, str]) -> None:
    """Steps 2 and 3: let the runs in flight finish within the grace, then stand the rest
    down; an attempt stuck in a store call past ``cancel_timeout`` is left to orphan
    recovery."""
    pending = set(runner.tasks) if runner is not None else set()
    logger.info("shutdown: 2/5 waiting up to %.1f s for %d in-flight runs",
                o.shutdown_grace, len(pending), extra={"event": "shutdown", **log})
    if pending:
        _, pending = await asyncio.wait(pending, timeout=o.shutdown_grace)

    logger.log(logging.WARNING if pending else logging.INFO,
               "shutdown: 3/5 cancelling %d runs still in flight", len(pending),
               extra={"event": "shutdown", **log})
    if pending:
        for attempt in runs.stand_down_all("shutdown"):
            attempt.stand_down("shutdown")
        _, pending = await asyncio.wait(pending, timeout=max(o.cancel_timeout, 0.01))
        for task in pending:  # stuck in a store call: leave it to orphan recovery
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=1.0)


async def drain_threads(pool: StepPool | None, o: WorkerOptions,
                        log: Mapping[str, str]) -> None:
    """Step 4: wait up to ``cancel_timeout`` for sync step calls still in a thread; those
    that outlive it are logged and left on their daemon threads."""
    busy = pool.busy if pool is not None else 0
    logger.info("shutdown: 4/5 waiting up to %.1f s for %d calls still in a thread",
                o.cancel_timeout, busy, extra={"event": "shutdown", **log})
    if pool is None:
        return
    pool.shutdown(wait=False, cancel_futures=True)
    idle = await asyncio.get_running_loop().run_in_executor(
        None, pool.all_idle.wait, o.cancel_timeout
    )
    if not idle:
        logger.warning(
            "worker_thread_calls_still_running: %d sync step calls still running "
            "after %.1f s; left on daemon threads (their runs were requeued)",
            pool.busy, o.cancel_timeout,
            extra={"event": "worker_thread_calls_still_running", **log},
        )
