"""Load generation: submit the bench's runs (all first, at a rate, or C at a time) and
wait for each one's result the way a client does, timing submit -> result.

Every run is one ``RunRecord``. A run is *resolved* once the client saw it end (its
``RunInfo``), gave up on it (``lost``: no run ended for ``lost_after`` seconds while it was
still open) or could not submit it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyrula.cli.bench.config import BenchConfig, BenchError
from pyrula.workflows import (
    MemoryStore,
    PayloadTooLarge,
    RunInfo,
    RunStatus,
    StoreUnavailable,
    WorkflowClient,
    WorkflowNotFound,
)

#: Longest a waiter blocks in one ``wait_result`` call before it looks whether the bench
#: gave up (the store still wakes it the moment the run ends).
WAIT_CHUNK = 2.0
#: Runs submitted together in queue mode (one ``gather`` each).
SUBMIT_BATCH = 500


@dataclass(slots=True)
class RunRecord:
    """One run of the bench: ``x`` is its index, the built-in workflow's input (its result
    must be ``x + steps``)."""

    x: int
    run_id: str | None = None
    submitted_at: float | None = None  # perf_counter() when submit was called
    ended_at: float | None = None  # perf_counter() when the client saw it ended
    info: RunInfo | None = None
    lost: bool = False
    submit_error: str | None = None

    @property
    def latency_ms(self) -> float | None:
        if self.ended_at is None or self.submitted_at is None:
            return None
        return (self.ended_at - self.submitted_at) * 1000


class Load:
    """The runs of one bench and the counters the progress line shows."""

    def __init__(self, client: WorkflowClient, config: BenchConfig, waiters: int) -> None:
        self.client = client
        self.store = client.store
        self.config = config
        self.workflow = config.workflow_name
        self.check = config.check
        self.records = [RunRecord(x=i) for i in range(config.runs)]
        self.waiters = waiters
        self.submitted = 0
        self.resolved = 0
        self.open_resolved = 0  # resolved runs that had been submitted
        self.ended = 0  # seen ended, however
        self.completed = 0  # ended completed with the right result
        self.errors = 0  # ended otherwise, or could not be submitted
        self.first_submit: float | None = None
        self.last_submit: float | None = None
        self.last_end: float | None = None
        self.progress_from = time.perf_counter()  # the watch counts idle time from here
        self.busy_since = 0.0  # when the last run was submitted with none other open
        self.done = asyncio.Event()
        self.abandoned = asyncio.Event()
        self.reason: str | None = None  # why the bench gave up waiting
        self.fatal: BenchError | None = None  # stops the bench once the load is wound down
        self._payload = "p" * config.payload_bytes
        #: The side-effect ledger's directory, when the bench verifies the invariants.
        self.ledger: str | None = None

    @property
    def in_flight(self) -> int:
        return self.submitted - self.open_resolved

    def params(self, record: RunRecord) -> Any:
        if self.config.workflow is not None:
            return self.config.params
        params: dict[str, object] = {"x": record.x, "steps": self.config.steps,
                                     "kind": self.config.step_kind}
        if self.config.payload_bytes:
            params["payload"] = self._payload
        if self.ledger is not None:
            params["ledger"] = self.ledger
        return params

    def abandon(self, reason: str, fatal: BenchError | None = None) -> None:
        if not self.abandoned.is_set():
            self.reason = reason
            self.fatal = fatal
            self.abandoned.set()

    async def check_params(self) -> None:
        """Submit the biggest params to a throwaway in-memory store: a payload the client
        refuses (above ``max_payload_bytes``) stops the bench before a fleet starts."""
        try:
            await WorkflowClient(MemoryStore()).submit(self.workflow,
                                                       self.params(self.records[-1]))
        except (PayloadTooLarge, ValueError) as exc:
            raise BenchError(f"cannot submit the bench's runs: {exc}", code=2) from None

    # --- one run ----------------------------------------------------------------------

    async def submit(self, record: RunRecord) -> None:
        started = time.perf_counter()
        try:
            handle = await self.client.submit(self.workflow, self.params(record))
        except (PayloadTooLarge, ValueError) as exc:
            self.abandon(str(exc), BenchError(f"cannot submit the bench's runs: {exc}", code=2))
            record.submit_error = str(exc)
            self._resolve(record, submitted=False)
            return
        except StoreUnavailable as exc:
            record.submit_error = str(exc)
            self._resolve(record, submitted=False)
            return
        record.run_id, record.submitted_at = handle.run_id, started
        self.submitted += 1
        if self.in_flight == 1:
            self.busy_since = started
        if self.first_submit is None:
            self.first_submit = started
        self.last_submit = time.perf_counter()

    async def wait(self, record: RunRecord) -> None:
        assert record.run_id is not None
        while True:
            try:
                info = await self.store.wait_result(record.run_id, WAIT_CHUNK)
            except TimeoutError:
                if self.abandoned.is_set():
                    record.lost = True
                    break
                continue
            except StoreUnavailable:
                if self.abandoned.is_set():
                    record.lost = True
                    break
                await asyncio.sleep(0.1)
                continue
            except WorkflowNotFound:  # the store no longer knows it: it never ended for us
                record.lost = True
                break
            record.ended_at, record.info = time.perf_counter(), info
            break
        self._resolve(record, submitted=True)

    def _resolve(self, record: RunRecord, *, submitted: bool) -> None:
        self.resolved += 1
        if submitted:
            self.open_resolved += 1
        info = record.info
        if info is not None:
            self.ended += 1
            self.last_end = record.ended_at
            if info.status is RunStatus.COMPLETED and self.check(record.x, info.result) is None:
                self.completed += 1
            else:
                self.errors += 1
        else:
            self.errors += 1
        if self.resolved == len(self.records):
            self.done.set()

    def _skip_unsubmitted(self) -> None:
        """After the bench gave up: the runs it never got to submit are resolved too."""
        for record in self.records:
            if record.run_id is None and record.submit_error is None:
                record.submit_error = f"not submitted: {self.reason}"
                self._resolve(record, submitted=False)

    # --- the three ways to load -------------------------------------------------------

    async def submit_all(self) -> None:
        """Queue mode, first half: every run submitted before the fleet starts."""
        for start in range(0, len(self.records), SUBMIT_BATCH):
            if self.abandoned.is_set():
                break
            await asyncio.gather(*(self.submit(r)
                                   for r in self.records[start:start + SUBMIT_BATCH]))
        self._skip_unsubmitted()

    async def wait_all(self) -> None:
        """Queue mode, second half: ``waiters`` tasks wait for the runs in submit order."""
        pending = iter(self.records)

        async def waiter() -> None:
            for record in pending:
                if record.run_id is not None:
                    await self.wait(record)

        await asyncio.gather(*(waiter() for _ in range(self.waiters)))

    async def open_loop(self, rate: float) -> None:
        """Rate mode: submit ``rate`` runs per second, evenly spread, whatever the fleet
        does (a slow fleet makes runs pile up, not the submissions slow down)."""
        queue: asyncio.Queue[RunRecord | None] = asyncio.Queue()

        async def waiter() -> None:
            while (record := await queue.get()) is not None:
                await self.wait(record)

        async def submit_one(record: RunRecord) -> None:
            await self.submit(record)
            if record.run_id is not None:
                queue.put_nowait(record)

        pool = [asyncio.create_task(waiter()) for _ in range(self.waiters)]
        submits: set[asyncio.Task[None]] = set()
        begin = time.perf_counter()
        for index, record in enumerate(self.records):
            if self.abandoned.is_set():
                break
            # Behind schedule, sleep(0) still lets the submits already started go on.
            await asyncio.sleep(max(0.0, begin + index / rate - time.perf_counter()))
            task = asyncio.create_task(submit_one(record))
            submits.add(task)
            task.add_done_callback(submits.discard)
        if submits:
            await asyncio.gather(*submits)
        self._skip_unsubmitted()
        for _ in pool:
            queue.put_nowait(None)
        await asyncio.gather(*pool)

    async def closed_loop(self, concurrency: int) -> None:
        """Concurrency mode: ``concurrency`` lanes, each submits a run, waits for it to
        end, then submits the next."""
        pending = iter(self.records)

        async def lane() -> None:
            for record in pending:
                if self.abandoned.is_set():
                    return
                await self.submit(record)
                if record.run_id is not None:
                    await self.wait(record)

        await asyncio.gather(*(lane() for _ in range(min(concurrency, len(self.records)))))
        self._skip_unsubmitted()

    # --- giving up ----------------------------------------------------------------------

    async def watch(self, check_fleet: Callable[[], None]) -> None:
        """Give up when no run has ended for ``lost_after`` seconds (the open runs are then
        lost), or at once when ``check_fleet`` raises (the fleet exited)."""
        lost_after = self.config.lost_after
        while not self.done.is_set():
            try:
                await asyncio.wait_for(self.done.wait(), 0.25)
                return
            except TimeoutError:
                pass
            try:
                check_fleet()
            except BenchError as exc:
                self.abandon(str(exc).splitlines()[0], exc)
                return
            last = max(self.last_end or 0.0, self.progress_from, self.busy_since)
            if self.in_flight and time.perf_counter() - last > lost_after:
                self.abandon(f"no run ended for {lost_after:g} s")
                return
