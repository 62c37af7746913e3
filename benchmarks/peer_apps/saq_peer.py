"""SAQ in the peer comparison: ``add_one(ctx, *, x)`` on a Redis ``Queue`` (``saq_app``),
served by ``saq benchmarks.peer_apps.saq_app.settings --workers 2``.

SAQ has no synchronous client: the client is one asyncio loop that awaits each
``queue.enqueue("add_one", x=i)`` in turn, and waits for a result with SAQ's own
``await job.refresh(until_complete=...)`` (a pub/sub notification of the job's end).

Two things about that wait, both SAQ's behaviour:

- ``refresh`` reads the job, then subscribes; its pub/sub multiplexer unsubscribes
  whenever no one listens, so sequential waits would re-subscribe each time and could miss
  a job that ends before the subscription is in place. The client therefore keeps one
  listener on the queue for its whole life (``queue.listen`` on a key no job uses), as a
  long-lived client would.
- A wait is re-armed every ``RECHECK_S`` (``refresh`` again): a notification that still
  arrives between the read and the listener's registration is then only late, not lost.
  ``rechecks`` counts such re-armed waits (in the latency scenario each one is a lost
  wake-up: SAQ's own cost, in its p99).

SAQ's sweeper (run by each worker as it starts, then once a minute) aborts a job it finds
in the active list still marked queued: one a worker has just dequeued but not yet marked
active (tobymao/saq#124, #277). Against a backlog at start-up that happens: such a job ends
``aborted`` with the error ``swept`` and never returns a result. It is counted (``swept``
in the figures) and left out of the results checked, instead of failing the workload.

SAQ has no pipeline (chain) concept: a 5-step run is chained by the client, each step
enqueued with the previous step's result once it is read back; the 1,000 chains run
concurrently in the client's loop (one coroutine each).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from saq import Queue
from saq.job import TERMINAL_STATUSES, Job, Status

from benchmarks.peer_apps.harness import (
    RESULT_TIMEOUT,
    URL_ENV,
    BenchError,
    Clock,
    RedisServer,
    Service,
    atimed_round_trips,
    check_value,
    start_python,
)

SETTINGS = "benchmarks.peer_apps.saq_app.settings"
WORKERS = 2
RECHECK_S = 1.0
KEEPALIVE_KEY = "peers-keepalive"
SWEPT: Any = object()  # what ``_result`` returns for a job SAQ's sweeper aborted


class SaqPeer:
    name = "saq"
    scenarios: tuple[str, ...] = ("1-step", "5-step", "latency")

    def __init__(self, server: RedisServer, logs: Path, warmup: int) -> None:
        self.server = server
        self.logs = logs
        self.warmup = warmup
        self.app = _import_app(server.url)
        self.rechecks = self.swept = 0

    def run(self, scenario: str, runs: int) -> dict[str, float]:
        if scenario == "latency":
            return asyncio.run(self.latency(runs))
        return asyncio.run(self.throughput(runs, 5 if scenario == "5-step" else 1))

    def _spawn(self) -> Service:
        return start_python("saq", ["-m", "saq", SETTINGS, "--workers", str(WORKERS)],
                            self.server.url, self.logs)

    @staticmethod
    def _stop(workers: Service) -> None:
        # SAQ's main process does not pass SIGTERM on to the worker processes it forked.
        workers.stop(group=True)

    # --- the client --------------------------------------------------------------------

    async def _open(self) -> tuple[Queue, asyncio.Task[None]]:
        """A client queue with its keep-alive listener, subscribed before it returns."""
        queue = Queue.from_url(self.server.url, name=self.app.QUEUE_NAME)
        await queue.connect()
        heard = asyncio.Event()

        def on_message(_key: str, _status: Status) -> bool:
            heard.set()
            return False  # listen for as long as the client lives

        listener = asyncio.create_task(queue.listen([KEEPALIVE_KEY], on_message, timeout=None))
        deadline = time.monotonic() + 10
        while not heard.is_set():
            # The subscription is made by a task of SAQ's: ping ourselves until it hears.
            await queue.redis.publish(queue.job_id(KEEPALIVE_KEY), "queued")  # type: ignore[attr-defined]
            try:
                await asyncio.wait_for(heard.wait(), 0.05)
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise BenchError("SAQ's pub/sub listener never subscribed") from None
        return queue, listener

    @staticmethod
    async def _close(queue: Queue, listener: asyncio.Task[None]) -> None:
        listener.cancel()
        try:
            await listener
        except asyncio.CancelledError:
            pass
        await queue.disconnect()

    async def _enqueue(self, queue: Queue, x: int) -> Job:
        job = await queue.enqueue("add_one", x=x)
        if job is None:
            raise BenchError("SAQ refused an enqueue (duplicate key)")
        return job

    async def _result(self, job: Job) -> Any:
        deadline = time.monotonic() + RESULT_TIMEOUT
        while job.status not in TERMINAL_STATUSES:
            try:
                await job.refresh(until_complete=RECHECK_S)
            except TimeoutError:
                self.rechecks += 1
                if time.monotonic() > deadline:
                    raise BenchError(f"SAQ job {job.key} not done in {RESULT_TIMEOUT} s") from None
        if job.status == Status.ABORTED and job.error == queue_swept_error(job):
            self.swept += 1
            return SWEPT
        if job.status != Status.COMPLETE:
            raise BenchError(f"SAQ job {job.key} ended {job.status}: {job.error}")
        return job.result

    # --- scenarios ---------------------------------------------------------------------

    async def throughput(self, runs: int, steps: int) -> dict[str, float]:
        queue, listener = await self._open()
        self.server.reset()
        self.rechecks = self.swept = 0
        clock = Clock()
        try:
            clock.submit_start = clock.now()
            jobs = [await self._enqueue(queue, i) for i in range(runs)]
            clock.submit_end = clock.spawn = clock.now()
            workers = self._spawn()
            try:
                if steps == 1:
                    await self._read_in_order(jobs, clock)
                else:
                    await self._chains(queue, jobs, steps, clock)
                usage = self.server.usage()
                workers.check()
            finally:
                self._stop(workers)
        finally:
            await self._close(queue, listener)
        return {**clock.figures(runs, usage), "rechecks": self.rechecks,
                "swept": self.swept}

    async def _read_in_order(self, jobs: list[Job], clock: Clock) -> None:
        for i, job in enumerate(jobs):
            value = await self._result(job)
            if value is not SWEPT:
                check_value(self.name, i, value, i + 1)
            if i == 0:
                clock.first = clock.now()
        clock.last = clock.now()

    async def _chains(self, queue: Queue, jobs: list[Job], steps: int, clock: Clock) -> None:
        async def chain(i: int, job: Job) -> float:
            value = await self._result(job)
            for _ in range(steps - 1):
                if value is SWEPT:
                    return clock.now()  # the chain ends here: nothing to pass on
                value = await self._result(await self._enqueue(queue, value))
            if value is not SWEPT:
                check_value(self.name, i, value, i + steps)
            return clock.now()

        done = await asyncio.gather(*(chain(i, job) for i, job in enumerate(jobs)))
        clock.first, clock.last = min(done), max(done)

    async def latency(self, samples: int) -> dict[str, float]:
        queue, listener = await self._open()
        self.server.reset()
        workers = self._spawn()

        async def round_trip(i: int) -> Any:
            return await self._result(await self._enqueue(queue, i))

        async def timed_round_trip(i: int) -> Any:
            value = await round_trip(i)
            if value is SWEPT:  # the sweeper's next pass is a minute after the start's
                raise BenchError("SAQ's sweeper aborted a job during the latency samples")
            return value

        try:
            for i in range(self.warmup):  # the first waits cover the workers' start-up
                value = await round_trip(i)
                if value is not SWEPT:
                    check_value(self.name, i, value, i + 1)
            self.rechecks = self.swept = 0
            figures = await atimed_round_trips(self.name, samples, 0, timed_round_trip)
            workers.check()
        finally:
            self._stop(workers)
            await self._close(queue, listener)
        return {**figures, "rechecks": self.rechecks, "swept": self.swept}


def queue_swept_error(job: Job) -> str:
    return job.get_queue().swept_error_message


def _import_app(url: str) -> ModuleType:
    os.environ[URL_ENV] = url
    from benchmarks.peer_apps import saq_app

    return saq_app
