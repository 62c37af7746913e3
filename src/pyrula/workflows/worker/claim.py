"""The claim loop: claim up to the free capacity, in one store call across workflow names.

A full batch means there is more: it claims again at once, and under a backlog in
batches (one claim per quarter of the slots freed, or after a short moment). Otherwise a
store with a doorbell (``Doorbell``) wakes it as soon as work arrives; without one it
polls every ``claim_poll_interval``.

Suspects (runs with a crash counted that have not completed an attempt since) run alone,
so that a poison run among them takes no other run down with it: a claim never returns
one, but says where suspects wait. The loop then claims nothing more until the runs it
holds have ended or parked, claims one suspect (``claim_suspect``), and claims nothing
else until that attempt ends; then it claims as before, and its next claim says whether
more suspects wait. So a worker runs the suspects it finds one at a time, each after its
held runs; runs queued meanwhile wait for it (or go to other workers).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pyrula.config.worker import WorkerOptions
from pyrula.errors import StoreUnavailable
from pyrula.metrics import Metrics
from pyrula.workflows.clock import Clock
from pyrula.workflows.records import Claimed, ClaimedRun, SuspectsAt
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.capabilities import Doorbell
from pyrula.workflows.worker.held import HeldRuns
from pyrula.workflows.worker.loops import first
from pyrula.workflows.worker.runtime import Runtime
from pyrula.workflows.worker.usercode import UserCodeTracker

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How long a worker that saw suspects waiting stops claiming for its held runs to end,
#: and how long it then passes suspects over if they did not: a worker busy with long runs
#: must not idle its free slots for them (another worker, or a quieter moment, takes the
#: suspects).
SUSPECT_DRAIN_S = 10.0
SUSPECT_PASS_S = 30.0


@dataclass(frozen=True, slots=True)
class ClaimParts:
    """What the claim loop claims with, and whom it hands the claimed runs to."""

    store: Store
    doorbell: Doorbell | None
    clock: Clock
    options: WorkerOptions
    worker_id: str
    names: Sequence[str]
    #: The build the worker serves, recorded in the run:started of every run it claims.
    build: str
    runs: HeldRuns
    user_code: UserCodeTracker
    #: Starts a claimed run's attempt (``AttemptRunner.start``).
    start: Callable[[ClaimedRun], None]
    #: Told of the held runs right after a claim returned runs, before any of them starts.
    on_claimed: Callable[[dict[str, int]], None] | None
    metrics: Metrics
    log: dict[str, str]


class ClaimLoop:
    name = "claim"

    def __init__(self, parts: ClaimParts, runtime: Runtime) -> None:
        self.interval = parts.options.claim_poll_interval
        self._p = parts
        self._rt = runtime
        #: When the loop last made progress (a fleet's stall watchdog reads its age).
        self.progress = time.monotonic()
        self._lost = False
        self._backlog = False
        #: Where the last claim saw suspects waiting: claim one once nothing is held.
        self._suspects: tuple[SuspectsAt, ...] = ()
        #: A suspect is held: claim nothing until its attempt has ended.
        self._alone = False
        #: Until then (monotonic) suspects are not waited for: the last suspect claim found
        #: none to take (other workers took them, or flow control holds their owners back),
        #: and draining again at once would idle this worker for nothing.
        self._passed_until = 0.0
        #: When this worker began waiting for its runs to end to take a suspect.
        self._draining_since: float | None = None

    def _free(self) -> int:
        return self._p.options.max_concurrent_runs - self._p.runs.in_flight()

    async def tick(self, now: float) -> float | None:
        p, o = self._p, self._p.options
        self.progress = time.monotonic()
        if self._rt.paused:
            return o.claim_poll_interval
        if self._alone or self._suspects:
            if p.runs.in_flight() and self._may_wait():
                await self._await_idle()
                return 0.0
            if not p.runs.in_flight():
                self._alone = False
                self._draining_since = None
                if self._suspects and await self._claim_suspect():
                    self._alone = True
                    return 0.0
        free = self._free()
        if free <= 0:
            self._rt.capacity.clear()
            await first(self._rt.capacity.wait(), self._rt.stopping.wait())
            return 0.0
        low_water = max(1, o.max_concurrent_runs // 4)
        if self._backlog and free < low_water:
            # Under a backlog, claim in batches: one claim per quarter of the slots freed
            # (or after a short moment), not one store round trip per finished run.
            await self._await_capacity(low_water, o.claim_poll_interval / 4)
            free = self._free()
        claimed = await self._claim(free)
        if time.monotonic() >= self._passed_until:
            self._suspects = claimed.suspects
        if self._suspects:
            return 0.0  # the next pass waits for these runs, then claims a suspect
        # A full batch means there is more: claim again at once.
        self._backlog = bool(claimed) and len(claimed) >= free
        if self._backlog:
            return 0.0
        if p.doorbell is not None:
            await self._wait_for_work(p.doorbell)
            return 0.0
        return None

    def _may_wait(self) -> bool:
        """Whether to keep waiting for the held runs to end: always while a suspect runs
        alone; for a suspect to take, SUSPECT_DRAIN_S at most, then suspects are passed
        over for SUSPECT_PASS_S and this worker claims as usual."""
        if self._alone:
            return True
        now = time.monotonic()
        if self._draining_since is None:
            self._draining_since = now
        if now - self._draining_since < SUSPECT_DRAIN_S:
            return True
        self._suspects, self._draining_since = (), None
        self._passed_until = now + SUSPECT_PASS_S
        return False

    async def _claim(self, free: int) -> Claimed:
        p, o = self._p, self._p.options
        claimed = await self._guarded(lambda: p.store.claim(
            p.worker_id, p.names, limit=free, now=p.clock.now(), lock_ttl=o.lock_ttl,
            build=p.build,
        ))
        self._started(claimed)
        return claimed

    async def _claim_suspect(self) -> bool:
        """Claim one of the suspects the last claim saw, and start it (alone)."""
        p, o = self._p, self._p.options
        at, self._suspects = self._suspects, ()
        run = await self._guarded(lambda: p.store.claim_suspect(
            p.worker_id, at, now=p.clock.now(), lock_ttl=o.lock_ttl, build=p.build,
        ))
        if run is None:
            self._passed_until = time.monotonic() + max(1.0, o.claim_poll_interval)
            return False
        self._started([run])
        return True

    async def _guarded(self, call: Callable[[], Awaitable[T]]) -> T:
        """A claim call, after the runs of an earlier claim whose reply was lost are back."""
        if self._lost:
            await self.requeue_lost_claims()
        try:
            result = await call()
        except (StoreUnavailable, asyncio.CancelledError):
            # The claim may have run with its reply lost (the connection went, or the call
            # was cancelled, after the request was sent): its runs are locked by this
            # worker, which does not know them. They are put back before the next claim,
            # or by the shutdown, once the store answers.
            self._lost = True
            raise
        self.progress = time.monotonic()
        return result

    def _started(self, claimed: Sequence[ClaimedRun]) -> None:
        p = self._p
        for run in claimed:
            p.start(run)
        if claimed and p.on_claimed is not None:
            # Before any claimed run starts: whoever watches this process (a fleet's
            # supervisor) then knows every run to requeue should it die from here on, and
            # that the runs other than suspects are about to enter their code.
            p.user_code.claimed(run.run_id for run in claimed)
            p.on_claimed(p.runs.held())

    async def _await_idle(self) -> None:
        """Until the worker holds no run, stops, or may wait no more (``_may_wait``). The
        wait is deliberate, however long a suspect's attempt lasts: the loop stamps its
        progress meanwhile, so a fleet's stall watchdog (free slots, no claim) does not
        take it for a stuck claim loop."""
        while self._p.runs.in_flight() and not self._rt.stopping.is_set() \
                and self._may_wait():
            self.progress = time.monotonic()
            self._rt.capacity.clear()
            await first(self._rt.capacity.wait(), self._rt.stopping.wait(),
                        asyncio.sleep(self._p.options.claim_poll_interval))

    async def _wait_for_work(self, doorbell: Doorbell) -> None:
        # A store with a doorbell wakes us as soon as work arrives, instead of a poll: each
        # wait lasts claim_poll_interval, and without a ring the claim looks anyway once a
        # second or so (a ring is lost with a client that dies between its submit and its
        # ring on a cluster), not after every wait.
        p, stopping = self._p, self._rt.stopping
        poll = p.options.claim_poll_interval
        look_by = time.monotonic() + max(1.0, poll)
        while not stopping.is_set():
            waiting = asyncio.ensure_future(doorbell.wait_for_work(p.names, poll))
            await first(waiting, stopping.wait())
            self.progress = time.monotonic()
            if not waiting.done() or waiting.cancelled():  # stopping: ``first`` cancelled it
                await asyncio.gather(waiting, return_exceptions=True)
                break
            if waiting.result() or time.monotonic() >= look_by:  # raises its error
                break

    @property
    def lost(self) -> bool:
        """Whether a claim's reply may have been lost (runs locked here, not held)."""
        return self._lost

    async def requeue_lost_claims(self) -> None:
        """Put back (reason store_unavailable, no crash counted) the runs locked by this
        worker that it does not hold: those of a claim whose reply was lost. Without this
        they would wait out their lock and be reclaimed as orphans, each charged a crash."""
        p = self._p
        outcomes = await p.store.requeue_unheld(p.worker_id, set(p.runs.held()),
                                                now=p.clock.now())
        self._lost = False
        if outcomes:
            p.metrics.inc("pyrula.workflows.runs.requeued", len(outcomes),
                          reason="store_unavailable")
        for outcome in outcomes:
            logger.warning(
                "run %s requeued: claimed by this worker when the store went away, but the "
                "claim's reply was lost", outcome.run_id,
                extra={"event": "run_requeued", "run_id": outcome.run_id, **p.log},
            )

    async def _await_capacity(self, free: int, timeout: float) -> None:
        """Until ``free`` slots are free, the worker stops, or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while self._free() < free:
            left = deadline - time.monotonic()
            if left <= 0 or self._rt.stopping.is_set():
                return
            self._rt.capacity.clear()
            try:
                await asyncio.wait_for(self._rt.capacity.wait(), left)
            except TimeoutError:
                return
