"""The writes of one attempt: its events on their way to the store.

The attempt's operations add their events to a write-behind buffer. They are written in
order by one writer at a time (each write takes the whole buffer, so events get their
seqs in the order they were made): appended as the code goes on, or with the write that
parks the run, ends it or puts it back in the queue. Every write is fenced by the
attempt's token inside the store; a refused write (the lock went to another attempt, the
store is gone) becomes the attempt's stop and unwinds it with
:class:`~pyrula.workflows.stop.Halt`, and no write is tried after that. When a step's
events are written is the step boundary rule of :meth:`Writes.boundary`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from pyrula.workflows.children import MAX_SUCCESSOR_HOPS
from pyrula.workflows.clock import Clock
from pyrula.workflows.errors import StaleToken, StoreUnavailable, WorkflowNotFound
from pyrula.workflows.events import Event, stamp_successor
from pyrula.workflows.records import RequeueOutcome, RunHandle, RunInfo, RunStatus
from pyrula.workflows.replay import Replay
from pyrula.workflows.stop import Halt, StandDown, Stop, StopState
from pyrula.workflows.stores.base import AttemptStore

logger = logging.getLogger(__name__)

T = TypeVar("T")


class EngineStore(AttemptStore, Protocol):
    """What an attempt asks of the store: its own writes, its journal, and for child
    workflows the submit, read, signal, nudge and cancel of other runs."""

    async def read_events(self, run_id: str, after_seq: int = 0) -> list[Event]: ...

    async def submit(
        self, name: str, params: Any, *, now: float, owner: str | None = None,
        idempotency_key: str | None = None,
    ) -> tuple[RunHandle, bool]: ...

    async def get_run(self, run_id: str) -> RunInfo | None: ...

    async def signal(self, run_id: str, name: str, payload: Any, *, now: float) -> None: ...

    async def nudge(self, run_id: str, *, now: float) -> None: ...

    async def cancel(self, run_id: str, *, now: float) -> bool: ...


class Writes:
    """The buffer and the writer of one attempt (of ``run_id``, fenced by ``token``)."""

    def __init__(
        self,
        store: EngineStore,
        run_id: str,
        token: int,
        replay: Replay,
        stops: StopState,
        clock: Clock,
        *,
        lock_ttl: float,
        buffer_size: int,
        boundary_durability: bool,
        wake: asyncio.Event,
        waiting: Callable[[], contextlib.AbstractContextManager[None]],
    ) -> None:
        self._store = store
        self._run_id = run_id
        self._token = token
        self._replay = replay
        self._stops = stops
        self._clock = clock
        self._lock_ttl = lock_ttl
        self._buffer_size = buffer_size
        self._boundary_durability = boundary_durability
        self._wake = wake
        self._waiting = waiting
        self._pending: list[Event] = []
        # A step's completion is pending in the buffer and must be written before anything
        # else starts (see boundary).
        self._boundary_due = False
        # One write of the attempt at a time: each takes the buffer, and events get their
        # seqs in the order written.
        self._writing = asyncio.Lock()

    @property
    def boundary_due(self) -> bool:
        return self._boundary_due

    def add(self, event: Event) -> Event:
        self._pending.append(event)
        return event

    async def write(self, call: Callable[[], Awaitable[T]]) -> T:
        """One fenced store call; a refusal stops the attempt and raises :class:`Halt`."""
        self._stops.raise_if_halted()
        try:
            return await call()
        except StaleToken:
            logger.warning(
                "run %s attempt %d lost its lock; standing down", self._run_id, self._token
            )
            stop = Stop.lost()
        except WorkflowNotFound:
            # The store no longer has the run (a failover lost it, or it was deleted):
            # nothing of this attempt can be written, as with a lock lost.
            logger.warning(
                "run %s attempt %d: the store has no such run; standing down", self._run_id,
                self._token,
            )
            stop = Stop.lost()
        except StoreUnavailable:
            stop = Stop.store_unavailable()
        self._stops.ask(stop)
        raise Halt(stop.reason.value)

    async def absorb(self, written: list[Event], last_seq: int) -> None:
        """Give the events just written their seqs; fetch any written by others between."""
        gap: list[Event] = []
        if self._replay.has_gap(len(written), last_seq):
            after = self._replay.last_seq
            gap = await self.write(lambda: self._store.read_events(self._run_id, after))
        self._replay.absorb(written, last_seq, gap)

    def _take(self) -> list[Event]:
        """The whole buffer, taken by the writer whose turn it is (``_writing`` held). Not
        an async context manager of its own: this is on every step's path, and an async
        generator per write costs more than the write's own bookkeeping."""
        self._boundary_due = False
        batch, self._pending = self._pending, []
        return batch

    # --- other runs (child workflows) -----------------------------------------------

    async def submit_child(self, name: str, params: Any, *, owner: str | None,
                           key: str) -> str:
        """Submit a child run (idempotent on ``key``); its run id."""
        with self._waiting():
            handle, _ = await self.write(lambda: self._store.submit(
                name, params, now=self._clock.now(), owner=owner, idempotency_key=key
            ))
        return handle.run_id

    async def child_info(self, run_id: str) -> RunInfo | None:
        """Child ``run_id`` as the store holds it now: the last run of its
        ``continue_as_new`` chain (None if the store has no such run)."""
        with self._waiting():
            info = await self._read_run(run_id)
            for _ in range(MAX_SUCCESSOR_HOPS):
                if info is None or info.status is not RunStatus.CONTINUED:
                    break
                if not info.successor_id:
                    break
                info = await self._read_run(info.successor_id)
        return info

    async def _read_run(self, run_id: str) -> RunInfo | None:
        return await self.write(lambda: self._store.get_run(run_id))

    async def flush(self) -> None:
        if not self._pending and not self._writing.locked():
            self._boundary_due = False  # nothing to write nor to wait for
            return
        with self._waiting():
            async with self._writing:
                batch = self._take()
                if not batch:
                    return
                result = await self.write(
                    lambda: self._store.append(
                        self._run_id, self._token, batch,
                        now=self._clock.now(), lock_ttl=self._lock_ttl,
                    )
                )
                await self.absorb(batch, result.last_seq)
        if result.cancel_requested:
            self.cancel_requested()

    def cancel_requested(self) -> None:
        """A client asked to cancel the run (a write's reply said so): end it as cancelled
        at the attempt's next turn. Said through the stop state and the wake-up the attempt
        shares, not a call back into the attempt: nothing here refers back to it, so an
        ended attempt's objects are freed at once, without the cyclic collector (a busy
        worker's collector passes cost ~15 % of its time when every attempt was a cycle)."""
        self._stops.ask(Stop.cancel())
        self._wake.set()

    async def boundary(self) -> None:
        """A step boundary: the step's events become durable before anything follows it.

        With ``boundary_durability`` they are written before the next step starts, with
        the run's park or end if one of those comes first, or at the attempt loop's next
        turn, whichever is first: so a run that returns right after its last step records
        the step and its end in one write, and a step's completion never waits behind a
        sibling still running. Otherwise they are written behind, when the buffer is full
        (or at the park or the end).
        """
        if len(self._pending) >= self._buffer_size:
            await self.flush()
        elif self._boundary_durability:
            self._boundary_due = True
            self._wake.set()

    async def settle(self) -> None:
        """Before anything starts: the completions it follows are durable."""
        if self._boundary_due:
            await self.flush()

    # --- the writes that end the attempt ------------------------------------------------

    async def park(
        self, *, now: float, wake_at: float | None, signals: Sequence[str], interrupt: Any
    ) -> bool:
        """Park the run with the buffer's events. False if it keeps its lock instead (a
        signal it waits for had already arrived, a child ended while it ran, or a cancel
        came): the journal then holds what came (nothing, for a child), and the cancel is
        passed on."""
        async with self._writing:
            batch = self._take()
            known = self._replay.last_seq
            result = await self.write(
                lambda: self._store.park(
                    self._run_id, self._token, batch, now=now, wake_at=wake_at,
                    signals=signals, known_seq=known, interrupt=interrupt,
                )
            )
            if result.parked:
                await self.absorb(batch, result.last_seq)
                return True
        self._replay.absorb(batch, result.last_seq, result.events)
        if result.cancel_requested:
            self.cancel_requested()
        return False

    async def finish(
        self,
        status: RunStatus,
        *,
        result: Any = None,
        error: dict[str, Any] | None = None,
        successor_params: Any = None,
    ) -> None:
        """End the run with the buffer's events (its terminal event last)."""
        async with self._writing:
            batch = self._take()
            finished = await self.write(
                lambda: self._store.finish(
                    self._run_id, self._token, batch, now=self._clock.now(), status=status,
                    result=result, error=error, successor_params=successor_params,
                )
            )
            if finished.successor_id is not None:
                stamp_successor(batch, finished.successor_id)
            await self.absorb(batch, finished.last_seq)

    async def requeue(self, stand: StandDown) -> RequeueOutcome:
        """Put the run back in the queue with the buffer's events."""
        async with self._writing:
            batch = self._take()
            return await self.write(
                lambda: self._store.requeue(
                    self._run_id, self._token, now=self._clock.now(), reason=stand.reason,
                    events=batch, crash=stand.crash, crash_detail=stand.detail or None,
                )
            )
