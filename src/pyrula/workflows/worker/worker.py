"""WorkflowWorker: claims runs, wakes sleeping ones, recovers orphans, serves probes.

``run()`` starts the loops and blocks until ``stop()``; then the shutdown sequence runs in
order: stop claiming → wait up to ``shutdown_grace`` for in-flight runs → cancel the rest
together within ``cancel_timeout`` → wait up to ``cancel_timeout`` for sync steps still in
a thread → release shards. The class installs no signal handlers; entry points do.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pyrula.config.cloud import check_cloud
from pyrula.config.worker import WorkerOptions
from pyrula.errors import (
    ConfigurationError,
    JournalCorrupt,
    StaleToken,
    StoreUnavailable,
    WorkflowNotFound,
)
from pyrula.health_http import ProbeServer
from pyrula.workflows.client import WorkflowClient
from pyrula.workflows.clock import SYSTEM_CLOCK, Clock, StoreClock, store_clock
from pyrula.workflows.definition import REGISTRY, Registry, WorkflowSpec, workflow_name
from pyrula.workflows.engine import Attempt, AttemptSettings, Outcome, OutcomeKind
from pyrula.workflows.events import Event, EventType, make_event
from pyrula.workflows.records import ClaimedRun, PoisonPolicy, RunStatus
from pyrula.workflows.stores.base import Store
from pyrula.workflows.worker.cache import JournalCache
from pyrula.workflows.worker.gate import SuspectGate
from pyrula.workflows.worker.loops import LIVENESS_FAILURE_S, LoopState, backoff_delays, run_loop
from pyrula.workflows.worker.metrics import Metrics
from pyrula.workflows.worker.pool import StepPool
from pyrula.workflows.worker.renewal import LockRenewer
from pyrula.workflows.worker.schedules import ScheduleLoop
from pyrula.workflows.worker.usercode import UserCodeTracker

logger = logging.getLogger("pyrula.workflows.worker")

PING_TIMEOUT_S = 2.0
#: A claim completed this recently shows the store answers (``store_reachable``); an idle
#: claim loop completes one about every second.
STORE_SEEN_S = 2.0
HEARTBEAT_INTERVAL_S = 0.1
#: How often a worker on a store with a clock of its own reads it again (``StoreClock``).
CLOCK_SYNC_INTERVAL_S = 30.0


class JournalCacheMismatch(RuntimeError):
    """PYRULA_JOURNAL_CACHE_VERIFY found a cached journal that differs from the store."""


def _default_store() -> Store:
    """PYRULA_STORE_URL's store, archived to Postgres if PYRULA_POSTGRES_DSN is set."""
    from pyrula.workflows.stores import store_from_url
    from pyrula.workflows.stores.archive import archived_if_configured

    url = os.environ.get("PYRULA_STORE_URL", "").strip()
    if not url:
        raise ConfigurationError(
            "WorkflowWorker needs a store: pass store=... or set PYRULA_STORE_URL"
        )
    return archived_if_configured(store_from_url(url))


class WorkflowWorker:
    """Runs workflows from ``store``: every imported ``@workflow``, or only ``workflows``.

    ``on_claimed`` (for a process that reports to a supervisor) is called on the event loop
    with ``held_runs()`` right after a claim returned runs, before any of them starts.
    ``on_user_code`` (likewise) is called on the event loop when the supervisor must hear
    of the runs in user code before a run's code goes on; it sends a report built with
    ``user_code_report()`` before it returns (see ``worker.usercode``).

    A claimed run with a crash counted against it (a suspect) waits for the worker's
    suspect gate before any of its code runs: one suspect in user code at a time.

    ``clock`` defaults to the store's own clock where it has one (a Valkey server's
    ``TIME``, carried forward by the monotonic clock: ``StoreClock``), else the host's: every
    worker then judges locks, leases and timers by one clock, whatever its host's says.
    """

    def __init__(
        self,
        store: Store | None = None,
        workflows: Sequence[Any] | None = None,
        options: WorkerOptions | None = None,
        *,
        cloud: bool = True,
        clock: Clock | None = None,
        registry: Registry = REGISTRY,
        on_claimed: Callable[[dict[str, int]], None] | None = None,
        on_user_code: Callable[[], None] | None = None,
    ) -> None:
        self.options = (options if options is not None else WorkerOptions()).resolve()
        self.store: Store = store if store is not None else _default_store()
        if clock is None:
            clock = store_clock(self.store) or SYSTEM_CLOCK
        available = registry.workflows()
        if workflows is None:
            self._specs = available
        else:
            self._specs = {}
            for wf in workflows:
                name = workflow_name(wf)
                if name not in available:
                    raise WorkflowNotFound(f"no workflow registered under the name {name!r}")
                self._specs[name] = available[name]
        self.worker_id = f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"
        self.client = WorkflowClient(
            self.store, clock=clock, max_payload_bytes=self.options.max_payload_bytes
        )
        self.health_address: tuple[str, int] | None = None
        self.metrics = Metrics()
        self.runs_done = 0
        self._cloud = cloud
        self._clock = clock
        self._settings = AttemptSettings(
            lock_ttl=self.options.lock_ttl,
            step_boundary_durability=self.options.step_boundary_durability,
            event_buffer_size=self.options.event_buffer_size,
            max_payload_bytes=self.options.max_payload_bytes,
        )
        self._poison = PoisonPolicy(
            self.options.poison_max_retries, self.options.poison_retry_ttl_s
        )
        self._log = {"worker_id": self.worker_id}
        self._state = "starting"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._stop_requested = False
        self._fatal: BaseException | None = None
        self._binding_ok = True
        self._loops: dict[str, LoopState] = {}
        self._attempts: dict[str, Attempt] = {}
        # Runs claimed and not yet ended: run id -> token. Set as soon as a claim returns,
        # before the attempt's task (and any user code) runs, so a crash report is complete.
        self._held: dict[str, int] = {}
        self._on_claimed = on_claimed
        self._user_code = UserCodeTracker(on_user_code)
        self._gate = SuspectGate()
        self._run_tasks: set[asyncio.Task[None]] = set()
        self._capacity = asyncio.Event()
        # The soonest timer of a run this worker parked, and the nudge that shortens the
        # timer loop's wait for it.
        self._soonest_timer: float | None = None
        self._timer_nudge = asyncio.Event()
        self._heartbeat = time.monotonic()
        self._claim_progress = time.monotonic()
        self._store_failed_at = float("-inf")
        self._claim_lost = False
        self._stranded_logged: set[str] = set()
        self._backlog = False
        self._cache = JournalCache(self.options.journal_cache_events)
        self._pool: StepPool | None = None
        self._renewer: LockRenewer | None = None
        self._schedules = ScheduleLoop(
            self.store, self.workflow_names, clock, self.metrics, self._log
        )

    # --- public surface -------------------------------------------------------------

    @property
    def workflow_names(self) -> list[str]:
        return sorted(self._specs)

    @property
    def state(self) -> str:
        """starting | ready | draining | stopped."""
        return self._state

    @property
    def in_flight(self) -> int:
        return len(self._attempts)

    @property
    def free_slots(self) -> int:
        return max(0, self.options.max_concurrent_runs - len(self._attempts))

    def held_runs(self) -> dict[str, int]:
        """The runs this worker holds, from the claim that returned them until their attempt
        ends: run id -> attempt (its fencing token)."""
        return dict(self._held)

    def user_code_report(self, *, heartbeat: bool) -> tuple[list[str], list[str]]:
        """(the runs to report as in user code, the suspects among the held runs), for a
        report about to be sent to a supervisor; ``heartbeat`` for the periodic one (it
        names exactly the runs in user code now). See ``worker.usercode``."""
        return self._user_code.snapshot(heartbeat=heartbeat)

    async def store_reachable(self) -> bool:
        """Whether the store answers now: a claim that completed within the last
        ``STORE_SEEN_S`` says so at no cost; otherwise a ``ping()`` within 2 s. (What a
        fleet child reports to its supervisor for the fleet's /readyz.)"""
        claim = self._loops.get("claim")
        if claim is not None and claim.failing_since is None and claim.last_ok is not None \
                and time.monotonic() - claim.last_ok < STORE_SEEN_S:
            return True
        try:
            await asyncio.wait_for(self.store.aping(), PING_TIMEOUT_S)
        except Exception:  # any failure to answer in time: not reachable
            return False
        return True

    def claim_tick_age(self) -> float:
        """Seconds since the claim loop last made progress (a fleet's stall watchdog)."""
        return time.monotonic() - self._claim_progress

    def stop(self) -> None:
        """Begin the graceful shutdown; safe from a signal handler, a coroutine or a thread."""
        self._stop_requested = True
        if self._state in ("starting", "ready"):
            self._state = "draining"
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                stopping.set()
            else:
                loop.call_soon_threadsafe(stopping.set)

    async def run(self) -> None:
        """Serve until ``stop()``. Raises ConfigurationError before any loop starts for
        what only the server can show, and re-raises a fatal loop error after shutdown."""
        check_cloud(self._cloud)
        if not self._specs:
            raise ConfigurationError(
                "no @workflow is registered: import your workflow modules before "
                "constructing the worker, or pass workflows=[...]"
            )
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._capacity = asyncio.Event()
        self._timer_nudge = asyncio.Event()
        if self._stop_requested:
            self._stopping.set()
        await self._prepare_store()
        probe = await self._start_probes()
        self._pool = StepPool(worker_id=self.worker_id)
        self._renewer = LockRenewer(
            self.store, self.worker_id, self._clock, self.options.lock_ttl, self._poison,
            self.options.poison_counts_loop_blocked, self._loop, lambda: self._heartbeat,
            self._cancel_run, self._abandon_run, self._log,
        )
        self._renewer.start()
        background = self._start_loops()
        claim = asyncio.create_task(self._supervise("claim", self._claim_tick,
                                                    self.options.claim_poll_interval))
        if self._binding_ok and not self._stop_requested:
            self._state = "ready"
        logger.info(
            "worker_started: %s serving %s", self.worker_id, ", ".join(self.workflow_names),
            extra={"event": "worker_started", **self._log},
        )
        try:
            await self._stopping.wait()
        finally:
            await self._shutdown(claim, background, probe)
        if self._fatal is not None:
            raise self._fatal

    # --- startup --------------------------------------------------------------------

    async def _prepare_store(self) -> None:
        prepare = getattr(self.store, "prepare", None)
        if prepare is not None:
            # Server-side checks (eviction policy, shard count, cluster mode) come first.
            await prepare(self.workflow_names)
        if isinstance(self._clock, StoreClock):
            await self._clock.sync()  # before the first claim writes a lock
        project, environment = self.options.project, self.options.environment
        recorded = await self.store.bind(project, environment)
        self._binding_ok = all(
            want is None or have is None or want == have
            for want, have in zip((project, environment), recorded, strict=True)
        )
        if not self._binding_ok:
            logger.error(
                "store_binding_mismatch: this store is bound to project=%r environment=%r, "
                "the worker is configured for project=%r environment=%r; not claiming",
                recorded[0], recorded[1], project, environment,
                extra={"event": "store_binding_mismatch", **self._log},
            )

    async def _start_probes(self) -> ProbeServer | None:
        if self.options.health_port is None:
            return None
        probe = ProbeServer(
            {"/livez": self._livez, "/readyz": self._readyz, "/metrics": self._metrics_route},
            self.options.health_host, self.options.health_port,
        )
        self.health_address = await probe.start()
        logger.info("health probes on http://%s:%d", *self.health_address, extra=self._log)
        return probe

    def _start_loops(self) -> list[asyncio.Task[None]]:
        o = self.options
        loops: list[tuple[str, Callable[[], Awaitable[float | None]], float]] = [
            ("timer", self._timer_tick, o.timer_poll_interval_s),
            ("orphan", self._orphan_tick, o.orphan_scan_interval),
        ]
        if hasattr(self.store, "schedules_due"):
            loops.append(("schedule", self._schedule_tick, o.schedule_interval))
        if isinstance(self._clock, StoreClock):
            loops.append(("clock", self._clock_tick, CLOCK_SYNC_INTERVAL_S))
        optional = [
            ("reconcile", "reconcile_tick", o.reconcile_interval),
            ("projection", "projection_tick", o.projection_interval),
            ("shard_lease", "shard_lease_tick", o.shard_lease_interval),
        ]
        for name, method, interval in optional:
            hook = getattr(self.store, method, None)
            if hook is not None:
                loops.append((name, self._store_hook(hook), interval))
        tasks = [asyncio.create_task(self._beat(), name="pyrula-heartbeat")]
        tasks += [
            asyncio.create_task(self._supervise(name, tick, interval), name=f"pyrula-{name}")
            for name, tick, interval in loops
        ]
        return tasks

    def _store_hook(self, hook: Callable[..., Awaitable[Any]]) -> Callable[[], Awaitable[None]]:
        async def tick() -> None:
            await hook(worker_id=self.worker_id, names=self.workflow_names,
                       now=self._clock.now(), options=self.options)

        return tick

    async def _beat(self) -> None:
        """Stamped by the event loop itself: proof for /livez and the watchdog that it turns."""
        while True:
            self._heartbeat = time.monotonic()
            await asyncio.sleep(HEARTBEAT_INTERVAL_S)

    async def _supervise(
        self, name: str, tick: Callable[[], Awaitable[float | None]], interval: float
    ) -> None:
        assert self._stopping is not None
        state = self._loops.setdefault(name, LoopState(name))
        try:
            await run_loop(state, tick, interval, self._stopping, self.metrics, self._log)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # not a store error: the worker stops and run() re-raises
            logger.exception(
                "loop_died: %s loop failed with %s; stopping the worker", name,
                type(exc).__name__, extra={"event": "loop_died", "loop": name, **self._log},
            )
            if self._fatal is None:
                self._fatal = exc
            self.stop()

    # --- loops ----------------------------------------------------------------------

    async def _clock_tick(self) -> float | None:
        """Read the store's clock again: it is the one that counts, should it be stepped."""
        assert isinstance(self._clock, StoreClock)
        await self._clock.sync()
        return None

    async def _claim_tick(self) -> float | None:
        self._claim_progress = time.monotonic()
        if self._stop_requested or not self._binding_ok:
            return self.options.claim_poll_interval
        free = self.options.max_concurrent_runs - len(self._attempts)
        if free <= 0:
            self._capacity.clear()
            assert self._stopping is not None
            await _first(self._capacity.wait(), self._stopping.wait())
            return 0.0
        low_water = max(1, self.options.max_concurrent_runs // 4)
        if self._backlog and free < low_water:
            # Under a backlog, claim in batches: one claim per quarter of the slots freed
            # (or after a short moment), not one store round trip per finished run.
            await self._await_capacity(low_water, self.options.claim_poll_interval / 4)
            free = self.options.max_concurrent_runs - len(self._attempts)
        if self._claim_lost:
            await self._requeue_lost_claims()
        try:
            claimed = await self.store.claim(
                self.worker_id, self.workflow_names, limit=free, now=self._clock.now(),
                lock_ttl=self.options.lock_ttl,
            )
        except StoreUnavailable:
            # The claim may have run with its reply lost (the connection went after the
            # request was sent): its runs are locked by this worker, which does not know
            # them. They are put back before the next claim, once the store answers.
            self._claim_lost = True
            raise
        self._claim_progress = time.monotonic()
        for run in claimed:
            self._start_attempt(run)
        if claimed and self._on_claimed is not None:
            # Before any claimed run starts: whoever watches this process (a fleet's
            # supervisor) then knows every run to requeue should it die from here on, and
            # that the runs other than suspects are about to enter their code.
            self._user_code.claimed(run.run_id for run in claimed)
            self._on_claimed(self.held_runs())
        # A full batch means there is more: claim again at once.
        self._backlog = bool(claimed) and len(claimed) >= free
        if self._backlog:
            return 0.0
        wait_for_work = getattr(self.store, "wait_for_work", None)
        if wait_for_work is not None:
            # A store with a doorbell wakes us as soon as work arrives, instead of a poll:
            # each wait lasts claim_poll_interval, and without a ring the claim looks anyway
            # once a second or so (a ring is lost with a client that dies between its submit
            # and its ring on a cluster), not after every wait.
            assert self._stopping is not None
            look_by = time.monotonic() + max(1.0, self.options.claim_poll_interval)
            while not self._stopping.is_set():
                waiting = asyncio.ensure_future(
                    wait_for_work(self.workflow_names, self.options.claim_poll_interval))
                await _first(waiting, self._stopping.wait())
                self._claim_progress = time.monotonic()
                if waiting.cancelled():
                    break
                if waiting.result() or time.monotonic() >= look_by:  # raises its error
                    break
            return 0.0
        return None

    async def _requeue_lost_claims(self) -> None:
        """Put back (reason store_unavailable, no crash counted) the runs locked by this
        worker that it does not hold: those of a claim whose reply was lost. Without this
        they would wait out their lock and be reclaimed as orphans, each charged a crash."""
        outcomes = await self.store.requeue_unheld(self.worker_id, set(self._held),
                                                   now=self._clock.now())
        self._claim_lost = False
        for outcome in outcomes:
            logger.warning(
                "run %s requeued: claimed by this worker when the store went away, but the "
                "claim's reply was lost", outcome.run_id,
                extra={"event": "run_requeued", "run_id": outcome.run_id, **self._log},
            )

    async def _await_capacity(self, free: int, timeout: float) -> None:
        """Until ``free`` slots are free, the worker stops, or ``timeout`` passes."""
        assert self._stopping is not None
        deadline = time.monotonic() + timeout
        while self.options.max_concurrent_runs - len(self._attempts) < free:
            left = deadline - time.monotonic()
            if left <= 0 or self._stopping.is_set():
                return
            self._capacity.clear()
            try:
                await asyncio.wait_for(self._capacity.wait(), left)
            except TimeoutError:
                return

    async def _timer_tick(self) -> float | None:
        now = self._clock.now()
        if self._soonest_timer is not None and self._soonest_timer <= now:
            self._soonest_timer = None  # this tick wakes it
        woken = await self.store.wake_due(now=now, limit=self.options.timer_max_batch)
        if woken:
            self.metrics.inc("pyrula.workflows.timers.woken", woken)
            # Look again at once: a batch can come back short while more are due (when the
            # store spreads it over shards).
            return 0.0
        # None due: wait the interval, or less, until the soonest timer known: one of a run
        # this worker parked (which nudges this wait), or the store's next one.
        known = [t for t in (self._soonest_timer, self._store_next_wake()) if t is not None]
        wait = self.options.timer_poll_interval_s
        if known:
            wait = min(wait, max(0.0, min(known) - self._clock.now()))
        assert self._stopping is not None
        self._timer_nudge.clear()
        sleeping = asyncio.ensure_future(asyncio.sleep(wait))
        await _first(sleeping, self._timer_nudge.wait(), self._stopping.wait())
        return 0.0

    def _store_next_wake(self) -> float | None:
        next_wake = getattr(self.store, "next_wake_at", None)
        at = next_wake() if next_wake is not None else None
        return None if at is None else float(at)

    def _note_timer(self, wake_at: float) -> None:
        """A run this worker parked falls due at ``wake_at``: the timer loop should not
        sleep past it."""
        if self._soonest_timer is None or wake_at < self._soonest_timer:
            self._soonest_timer = wake_at
            self._timer_nudge.set()

    async def _schedule_tick(self) -> float | None:
        """Fire due schedules (not while draining or bound to another project)."""
        if self._stop_requested or not self._binding_ok:
            return None
        return await self._schedules.tick()

    async def _register(self) -> None:
        """Tell the store which names this worker serves (live for 3 orphan scans)."""
        register = getattr(self.store, "register_worker", None)
        if register is not None:
            ttl = max(3 * self.options.orphan_scan_interval, 30.0)
            await register(self.worker_id, self.workflow_names, now=self._clock.now(), ttl=ttl)

    async def _check_stranded(self) -> None:
        """Queued runs of names no live worker serves: "wait" logs ``run_stranded`` once per
        name; "fail" ends those queued longer than ``stranded_timeout`` (code stranded)."""
        stranded = getattr(self.store, "stranded", None)
        if stranded is None:
            return
        now = self._clock.now()
        for name in await stranded(now=now):
            if name not in self._stranded_logged:
                self._stranded_logged.add(name)
                logger.warning(
                    "run_stranded: runs of workflow %r are queued but no live worker serves "
                    "it (stranded_policy=%s)", name, self.options.stranded_policy,
                    extra={"event": "run_stranded", "workflow": name, **self._log},
                )
            if self.options.stranded_policy != "fail":
                continue
            timeout = self.options.stranded_timeout
            error = {
                "code": "stranded",
                "error_type": "Stranded",
                "message": f"no live worker served workflow {name!r} for {timeout:g} s "
                           "(stranded_policy=fail)",
                "detail": {"stranded_timeout": timeout},
            }
            failed = await self.store.fail_stranded(
                name, older_than=now - timeout, now=now, limit=1000, error=error
            )
            if failed:
                logger.error("run_stranded: %d runs of %r failed (stranded)", len(failed), name,
                             extra={"event": "run_stranded", "workflow": name, **self._log})

    def _store_failed(self) -> None:
        self._store_failed_at = time.monotonic()

    def _store_failed_lately(self) -> bool:
        """Whether a store call of this worker failed within the last ``lock_ttl``."""
        times = [self._store_failed_at] + [
            s.last_failed for s in self._loops.values() if s.last_failed is not None]
        return time.monotonic() - max(times) < self.options.lock_ttl

    async def _orphan_tick(self) -> float | None:
        await self._register()
        await self._check_stranded()
        if self._store_failed_lately():
            # The store was out for this worker a moment ago, so it was for the others: the
            # locks that lapsed meanwhile are those of workers that could not renew, not of
            # dead ones. They get one lock_ttl to renew or put their runs back themselves
            # (reason store_unavailable) before a reclaim would charge each run a crash.
            return None
        outcomes = await self.store.reclaim(
            self.workflow_names, now=self._clock.now(), limit=1000, poison=self._poison
        )
        for outcome in outcomes:
            if outcome.quarantined:
                logger.error(
                    "run_quarantined: run %s crashed its workers more than %d times",
                    outcome.run_id, self.options.poison_max_retries,
                    extra={"event": "run_quarantined", "run_id": outcome.run_id, **self._log},
                )
            else:
                logger.warning(
                    "run_reclaimed: run %s was orphaned (its worker's lock expired); requeued",
                    outcome.run_id,
                    extra={"event": "run_reclaimed", "run_id": outcome.run_id, **self._log},
                )
        if outcomes:
            self.metrics.inc("pyrula.workflows.runs.reclaimed", len(outcomes))
        return None

    # --- runs -----------------------------------------------------------------------

    def _crashes(self, claimed: ClaimedRun) -> int:
        """How many crashes counted against the run still count (a suspect has some)."""
        now, ttl = self._clock.now(), self.options.poison_retry_ttl_s
        return sum(1 for t in claimed.crashes if now - t < ttl)

    def _start_attempt(self, claimed: ClaimedRun) -> None:
        self._held[claimed.run_id] = claimed.token
        crashes = self._crashes(claimed)
        if crashes:
            self._user_code.suspect(claimed.run_id, claimed.token)
        task = asyncio.create_task(
            self._run_attempt(claimed, crashes), name=f"pyrula-attempt:{claimed.run_id}"
        )
        self._run_tasks.add(task)
        task.add_done_callback(self._run_tasks.discard)

    async def _journal_for(self, claimed: ClaimedRun) -> list[Event]:
        if claimed.journal_error is not None:
            raise claimed.journal_error
        if claimed.base_seq == 0:
            return list(claimed.journal)
        cached = self._cache.take(claimed.run_id, claimed.base_seq)
        if cached is None:
            return await self.store.read_events(claimed.run_id)
        journal = cached + list(claimed.journal)
        if self.options.journal_cache_verify:
            fresh = await self.store.read_events(claimed.run_id)
            if fresh != journal:
                raise JournalCacheMismatch(
                    f"journal cache of run {claimed.run_id} differs from the store "
                    f"({len(journal)} cached events vs {len(fresh)} stored)"
                )
        return journal

    async def _run_attempt(self, claimed: ClaimedRun, crashes: int) -> None:
        assert self._renewer is not None
        spec = self._specs[claimed.name]
        run_log = {"run_id": claimed.run_id, "workflow": claimed.name, **self._log}
        self._renewer.hold(claimed.run_id, claimed.token, self._liveness_bound(spec))
        attempt: Attempt | None = None
        try:
            try:
                journal = await self._journal_for(claimed)
            except JournalCacheMismatch as exc:
                logger.critical("journal_cache_mismatch: %s", exc, extra=run_log)
                if self._fatal is None:
                    self._fatal = exc
                self.stop()
                return
            attempt = Attempt(
                spec, claimed, journal, self.store, executor=self._pool, clock=self._clock,
                settings=self._settings, user_code=self._user_code,
            )
            self._attempts[claimed.run_id] = attempt
            if self._renewer.was_stood_down(claimed.run_id, claimed.token):
                attempt.abandon()  # stood down while its journal was being read
            admission = None
            if crashes:
                # A suspect: its code runs apart from the other suspects' (worker.gate).
                admission = self._gate.enter(claimed.run_id, claimed.token, crashes)
            outcome = await attempt.run(admission=admission)
            await self._after(claimed, outcome, run_log)
        except JournalCorrupt as exc:
            await self._fail_corrupt(claimed, exc, run_log)
        except StoreUnavailable as exc:
            logger.warning("run %s: store unavailable before the attempt began (%s)",
                           claimed.run_id, exc, extra=run_log)
            self._store_failed()
            await self._requeue_unavailable(claimed, run_log)
        finally:
            # A newer attempt of the same run may be in flight here already (this one was
            # stood down): forget only this attempt.
            self._gate.leave(claimed.run_id, claimed.token)
            self._user_code.attempt_ended(claimed.run_id, claimed.token)
            if attempt is not None and self._attempts.get(claimed.run_id) is attempt:
                del self._attempts[claimed.run_id]
            if self._held.get(claimed.run_id) == claimed.token:
                del self._held[claimed.run_id]
            if self._renewer.release(claimed.run_id, claimed.token):
                self._cache.drop(claimed.run_id)
            self._capacity.set()

    def _liveness_bound(self, spec: WorkflowSpec) -> float:
        return max(3 * self.options.lock_ttl, spec.timeout or 0.0)

    async def _after(self, claimed: ClaimedRun, outcome: Outcome, run_log: dict[str, Any]) -> None:
        kind = outcome.kind
        self.metrics.inc("pyrula.workflows.attempts", outcome=kind.value)
        if kind is OutcomeKind.PARKED:
            self._cache.put(claimed.run_id, outcome.journal)
            if outcome.wake_at is not None:
                self._note_timer(outcome.wake_at)
        else:
            self._cache.drop(claimed.run_id)
        if kind in (OutcomeKind.COMPLETED, OutcomeKind.FAILED, OutcomeKind.CANCELLED,
                    OutcomeKind.CONTINUED):
            self.runs_done += 1
            self.metrics.inc("pyrula.workflows.runs.finished", status=kind.value)
        if kind is OutcomeKind.FAILED and outcome.error is not None:
            logger.info("run %s failed [%s] %s", claimed.run_id, outcome.error.get("code"),
                        outcome.error.get("message"), extra=run_log)
        elif kind is OutcomeKind.LOST:
            logger.warning("run %s: lock lost to another attempt; stood down", claimed.run_id,
                           extra={"event": "run_lock_lost", **run_log})
        elif kind is OutcomeKind.STORE_UNAVAILABLE:
            self._store_failed()
            await self._requeue_unavailable(claimed, run_log)

    async def _fail_corrupt(self, claimed: ClaimedRun, exc: JournalCorrupt,
                            run_log: dict[str, Any]) -> None:
        """Fail a run whose journal holds an entry pyrula did not write: replaying it could
        only crash or run steps again, on every worker and every attempt. Its code is not
        the cause, so this is a failure of the run, not a crash counted toward poison."""
        logger.error("run_journal_corrupt: %s; the run fails", exc,
                     extra={"event": "run_journal_corrupt", **run_log})
        error = {"code": "corrupt_journal", "error_type": "JournalCorrupt",
                 "message": str(exc), "detail": {"seq": exc.seq, "reason": exc.reason}}
        now = self._clock.now()
        event = make_event(EventType.RUN_ERROR, now, code=error["code"],
                           error_type=error["error_type"], message=error["message"],
                           detail=error["detail"])
        try:
            await self.store.finish(claimed.run_id, claimed.token, [event], now=now,
                                    status=RunStatus.FAILED, error=error)
        except StaleToken:
            return  # another attempt holds the run; it meets the same entry
        except StoreUnavailable:
            await self._requeue_unavailable(claimed, run_log)
            return
        self.runs_done += 1
        self.metrics.inc("pyrula.workflows.runs.finished", status="failed")

    async def _requeue_unavailable(self, claimed: ClaimedRun, run_log: dict[str, Any]) -> None:
        """Put the run back (reason store_unavailable) once the store answers again. The
        run stays held meanwhile (the renewal thread renews its lock as soon as the store
        is back), however long the outage: the requeue is fenced, so it lands only if no
        one recovered the run in between, and the run is not charged a crash for it."""
        delays = backoff_delays(0.1, 1.0)
        while True:
            try:
                await self.store.requeue(
                    claimed.run_id, claimed.token, now=self._clock.now(),
                    reason="store_unavailable",
                )
                logger.warning("run %s requeued: the store was unavailable during its attempt",
                               claimed.run_id, extra={"event": "run_requeued", **run_log})
                return
            except (StaleToken, WorkflowNotFound):
                return
            except StoreUnavailable:
                self._store_failed()
                await asyncio.sleep(delays())

    def _abandon_run(self, run_id: str, token: int) -> None:
        """Called from the renewal thread once it stood this attempt of the run down."""
        attempt = self._attempts.get(run_id)
        if attempt is not None and attempt.token == token:
            attempt.abandon()

    def _cancel_run(self, run_id: str) -> None:
        attempt = self._attempts.get(run_id)
        if attempt is not None:
            attempt.request_cancel()

    # --- probes ---------------------------------------------------------------------

    def _failed_loop(self) -> str | None:
        now = time.monotonic()
        for state in self._loops.values():
            if state.failed_for(now) >= LIVENESS_FAILURE_S:
                return state.name
        return None

    async def _livez(self) -> tuple[int, Any]:
        failed = self._failed_loop()
        if failed is not None or self._fatal is not None:
            return 503, {"status": "loop_failed", "loop": failed, "worker_id": self.worker_id}
        return 200, {"status": "ok", "worker_id": self.worker_id}

    async def _readyz(self) -> tuple[int, Any]:
        body: dict[str, Any] = {"worker_id": self.worker_id}
        if self._stop_requested or self._state in ("draining", "stopped"):
            return 503, {"status": "draining", **body}
        if self._fatal is not None or self._failed_loop() is not None:
            return 503, {"status": "loop_failed", **body}
        if not self._binding_ok:
            return 503, {"status": "store_binding_mismatch", **body}
        if self._state == "starting":
            return 503, {"status": "starting", **body}
        try:
            await asyncio.wait_for(self.store.aping(), PING_TIMEOUT_S)
        except Exception:  # any failure to answer in time means not ready
            return 503, {"status": "store_unreachable", **body}
        return 200, {"status": "ready", "shards": self.shards(), "in_flight": self.in_flight,
                     **body}

    def shards(self) -> dict[str, int]:
        held = getattr(self.store, "shards_held", None)
        return dict(held(self.worker_id)) if held is not None else {}

    async def _metrics_route(self) -> tuple[int, Any]:
        self.metrics.set("pyrula.workflows.runs.in_flight", float(self.in_flight))
        return 200, self.metrics.prometheus({"worker_id": self.worker_id})

    # --- shutdown -------------------------------------------------------------------

    async def _shutdown(
        self,
        claim: asyncio.Task[None],
        background: list[asyncio.Task[None]],
        probe: ProbeServer | None,
    ) -> None:
        o = self.options
        self._state = "draining"
        log = self._log
        logger.info("shutdown: 1/5 stop claiming", extra={"event": "shutdown", **log})
        claim.cancel()
        await asyncio.gather(claim, return_exceptions=True)

        # Every step is logged, with or without work, so the sequence reads the same in
        # every drain.
        pending = set(self._run_tasks)
        logger.info("shutdown: 2/5 waiting up to %.1f s for %d in-flight runs",
                    o.shutdown_grace, len(pending), extra={"event": "shutdown", **log})
        if pending:
            _, pending = await asyncio.wait(pending, timeout=o.shutdown_grace)

        logger.log(logging.WARNING if pending else logging.INFO,
                   "shutdown: 3/5 cancelling %d runs still in flight", len(pending),
                   extra={"event": "shutdown", **log})
        if pending:
            for attempt in list(self._attempts.values()):
                attempt.stand_down("shutdown")
            _, pending = await asyncio.wait(pending, timeout=max(o.cancel_timeout, 0.01))
            for task in pending:  # stuck in a store call: leave it to orphan recovery
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)

        busy = self._pool.busy if self._pool is not None else 0
        logger.info("shutdown: 4/5 waiting up to %.1f s for %d calls still in a thread",
                    o.cancel_timeout, busy, extra={"event": "shutdown", **log})
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            idle = await asyncio.get_running_loop().run_in_executor(
                None, self._pool.all_idle.wait, o.cancel_timeout
            )
            if not idle:
                logger.warning(
                    "worker_thread_calls_still_running: %d sync step calls still running "
                    "after %.1f s; left on daemon threads (their runs were requeued)",
                    self._pool.busy, o.cancel_timeout,
                    extra={"event": "worker_thread_calls_still_running", **log},
                )

        release = getattr(self.store, "release_shards", None)
        if release is None:
            logger.info("shutdown: 5/5 no shards to release (the store is not sharded)",
                        extra={"event": "shutdown", **log})
        else:
            logger.info("shutdown: 5/5 releasing shards", extra={"event": "shutdown", **log})
            try:
                await release(self.worker_id)
            except Exception:  # shards then lapse after shard_lease_ttl
                logger.warning("shard release failed", exc_info=True, extra=log)

        unregister = getattr(self.store, "unregister_worker", None)
        if unregister is not None:
            try:
                await unregister(self.worker_id)
            except Exception:  # the registration lapses by itself
                logger.debug("unregister failed", exc_info=True, extra=log)
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        if self._renewer is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._renewer.stop)
        if probe is not None:
            await probe.close()
        self._state = "stopped"
        logger.info("worker_stopped: %s", self.worker_id, extra={"event": "worker_stopped", **log})


async def _first(*aws: Awaitable[Any]) -> None:
    """Wait until one of ``aws`` is done; cancel the others (a task passed in is cancelled
    too if it is not done)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
