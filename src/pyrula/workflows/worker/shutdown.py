"""A worker's shutdown: five ordered steps, each with its own bound, logged as it begins,
then the Cloud connector's drain where there is one.

1. Stop claiming: ``stopping`` is set, so every loop ends after its pass (nothing waits).
2. Wait up to ``shutdown_grace`` for the runs in flight, and for a claim already sent to
   the store (the runs it returns are in flight too, and drained like the others).
3. Within one ``cancel_timeout``: cancel a claim that has not answered and put back the
   runs it may have locked, and stand the runs still in flight down (requeued with reason
   ``shutdown``); what is still going at the bound is cancelled.
4. Wait up to ``cancel_timeout`` (one deadline for all) for what outlives the cancelling:
   store calls of the cancelled attempts, sync steps and sync tools still in a thread, the
   lock-renewal thread (its store call), trace exports. What still runs then is logged
   and left behind, so the store can be closed once ``run()`` returns.
5. Within one ``cancel_timeout``: end the background loops, release the shards (a sharded
   store) and unregister.

Then, within ``PYRULA_CLOUD_DRAIN_DEADLINE_S`` (a Cloud key set), the connector sends what
it holds (the requeues of step 3 included), then spools the critical events left.

So a drain lasts at most ``shutdown_grace + 3 × cancel_timeout`` (plus the connector's
deadline) whatever the store or the collector does (a call that never answers
included): no step waits on a bound of its own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyrula.cloud.connector import CloudConnector
    from pyrula.config.worker import WorkerOptions
    from pyrula.workflows.worker.attempts import AttemptRunner
    from pyrula.workflows.worker.claim import ClaimLoop
    from pyrula.workflows.worker.held import HeldRuns
    from pyrula.workflows.worker.pool import StepPool
    from pyrula.workflows.worker.renewal import LockRenewer
    from pyrula.workflows.worker.traces import TraceExports

logger = logging.getLogger(__name__)


class Deadline:
    """An instant ``seconds`` from now (monotonic), and how long is left until it."""

    def __init__(self, seconds: float) -> None:
        self._at = time.monotonic() + max(seconds, 0.0)

    def left(self) -> float:
        return max(0.0, self._at - time.monotonic())


async def until(deadline: Deadline, tasks: Collection[asyncio.Future[Any]]
                ) -> set[asyncio.Future[Any]]:
    """Wait for ``tasks`` until ``deadline``; those still pending then."""
    if not tasks:
        return set()
    _, pending = await asyncio.wait(set(tasks), timeout=deadline.left())
    return pending


@dataclass(slots=True)
class Draining:
    """What a worker's shutdown stops, in the order it stops it."""

    options: WorkerOptions
    log: Mapping[str, str]
    claim: asyncio.Task[None]
    claim_loop: ClaimLoop | None
    runner: AttemptRunner | None
    runs: HeldRuns
    pool: StepPool | None
    renewer: LockRenewer | None
    traces: TraceExports | None
    background: list[asyncio.Task[None]]
    #: Step 5's store calls: release the shards, unregister (each logs its own failure).
    release: Callable[[], Awaitable[None]]
    #: Whether the store is sharded (step 5 has shards to release).
    sharded: bool
    #: The Cloud connector drained after step 5, or None.
    cloud: CloudConnector | None = None
    #: Cancelled by step 3 and still running: step 4 waits for them.
    cancelled: set[asyncio.Future[Any]] = field(default_factory=set)


async def shut_down(d: Draining) -> None:
    """Run the six steps in order (see the module's docstring)."""
    logger.info("shutdown: 1/5 stop claiming", extra={"event": "shutdown", **d.log})
    await _grace(d)
    await _stand_down(d)
    await _outliving(d)
    await _release(d)
    await _cloud_drain(d)


def _in_flight(d: Draining) -> set[asyncio.Future[Any]]:
    return set(d.runner.tasks) if d.runner is not None else set()


async def _grace(d: Draining) -> None:
    """Step 2: the runs in flight (and those of a claim already sent) may finish."""
    o = d.options
    deadline = Deadline(o.shutdown_grace)
    logger.info("shutdown: 2/5 waiting up to %.1f s for %d in-flight runs",
                o.shutdown_grace, len(_in_flight(d)), extra={"event": "shutdown", **d.log})
    # A claim already sent is let finish rather than cut in half: cancelled mid-call, it
    # would leave runs locked in the store that this worker never learns of (step 3 puts
    # back those of a claim that does not answer within the grace).
    await until(deadline, {d.claim})
    await until(deadline, _in_flight(d))


async def _stand_down(d: Draining) -> None:
    """Step 3: cancel an unanswered claim, stand the rest down, put back lost claims."""
    deadline = Deadline(d.options.cancel_timeout)
    pending = _in_flight(d)
    claiming = not d.claim.done()
    logger.log(logging.WARNING if pending or claiming else logging.INFO,
               "shutdown: 3/5 cancelling %d runs still in flight%s", len(pending),
               " and a claim that has not answered" if claiming else "",
               extra={"event": "shutdown", **d.log})
    if claiming:  # its runs, locked here but never held, are put back below
        d.claim.cancel()
    if pending:
        for attempt in d.runs.stand_down_all("shutdown"):
            attempt.stand_down("shutdown")
    await until(deadline, {d.claim})
    if d.claim_loop is not None and d.claim_loop.lost:
        pending.add(asyncio.ensure_future(_put_back(d.claim_loop, d.log)))
    d.cancelled = await until(deadline, pending)
    for task in d.cancelled:  # stuck in a store call: step 4 gives it one more bound
        task.cancel()


async def _put_back(claim_loop: ClaimLoop, log: Mapping[str, str]) -> None:
    try:
        await claim_loop.requeue_lost_claims()
    except Exception:  # they lapse and are reclaimed as orphans instead
        logger.warning("putting back the runs of an unanswered claim failed",
                       exc_info=True, extra=dict(log))


async def _outliving(d: Draining) -> None:
    """Step 4: one ``cancel_timeout`` for the store calls, threads and exports left."""
    o = d.options
    deadline = Deadline(o.cancel_timeout)
    busy = d.pool.busy if d.pool is not None else 0
    logger.info("shutdown: 4/5 waiting up to %.1f s for %d store calls and %d calls still "
                "in a thread", o.cancel_timeout, len(d.cancelled), busy,
                extra={"event": "shutdown", **d.log})
    if d.pool is not None:
        d.pool.shutdown(wait=False, cancel_futures=True)
    threads = asyncio.get_running_loop().run_in_executor(None, _threads_end, d, deadline)
    exports = set(d.traces.tasks) if d.traces is not None else set()
    calls = await until(deadline, d.cancelled | exports)
    for task in calls:  # a trace export (it can be exported again from the journal)
        task.cancel()
    idle = await threads
    calls -= exports
    if not idle and d.pool is not None and d.pool.busy:
        logger.warning(
            "worker_thread_calls_still_running: %d sync step calls still running "
            "after %.1f s; left on daemon threads (their runs were requeued)",
            d.pool.busy, o.cancel_timeout,
            extra={"event": "worker_thread_calls_still_running", **d.log},
        )
    if calls:
        logger.warning(
            "worker_store_calls_still_running: %d attempts still in a store call after "
            "%.1f s; left behind (their runs are recovered as after a crash)",
            len(calls), o.cancel_timeout,
            extra={"event": "worker_store_calls_still_running", **d.log},
        )


def _threads_end(d: Draining, deadline: Deadline) -> bool:
    """On a thread: wait, until ``deadline``, for the sync-step threads to be idle and for
    the lock-renewal thread to end; whether they did."""
    idle = d.pool.all_idle.wait(deadline.left()) if d.pool is not None else True
    if d.renewer is not None:
        d.renewer.stop(deadline.left())
    return idle


async def _release(d: Draining) -> None:
    """Step 5: end the background loops, then release the shards and unregister."""
    deadline = Deadline(d.options.cancel_timeout)
    logger.info("shutdown: 5/5 %s", "releasing shards" if d.sharded else
                "no shards to release (the store is not sharded)",
                extra={"event": "shutdown", **d.log})
    for task in d.background:
        task.cancel()
    await until(deadline, d.background)
    release = asyncio.ensure_future(d.release())
    if await until(deadline, {release}):
        release.cancel()
        logger.warning("releasing the shards and unregistering did not end within %.1f s; "
                       "the shard leases lapse after shard_lease_ttl, the registration "
                       "by itself",
                       d.options.cancel_timeout, extra={"event": "shutdown", **d.log})


async def _cloud_drain(d: Draining) -> None:
    """After the five steps: the Cloud connector sends what it holds within its own
    deadline (logged only where there is a connector)."""
    if d.cloud is None:
        return
    logger.info("shutdown: then the Cloud connector sends its events (up to %.1f s)",
                d.cloud.config.drain_deadline_s, extra={"event": "shutdown", **d.log})
    await d.cloud.drain()
