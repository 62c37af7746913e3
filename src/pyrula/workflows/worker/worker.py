"""WorkflowWorker: claims runs, wakes sleeping ones, recovers orphans, serves probes.

``run()`` starts the loops and blocks until ``stop()``; then the shutdown sequence runs in
order: stop claiming → wait up to ``shutdown_grace`` for in-flight runs → cancel the rest
together within ``cancel_timeout`` → wait up to ``cancel_timeout`` for store calls and sync
steps still going → release shards → give the Cloud connector (when a key is set)
``PYRULA_CLOUD_DRAIN_DEADLINE_S`` to send what it holds (``worker.shutdown``). The class
installs no signal handlers; entry points do.

The probe server outlives ``run()``: /livez answers for as long as the process (its event
loop) lives, so an app that embeds the worker is not read as dead once the worker has
stopped. ``aclose()`` releases the port; so does the end of the event loop, whose runner
(``asyncio.run``) cancels the task that holds the server.

This module wires the parts: each loop is a class of its own (``claim``, ``timers``,
``orphans``, ``schedules``, ``store_loops``), attempts run in ``attempts``, the runs held
are in one registry (``held``) shared with the renewal thread (``renewal``), and what the
store can do beyond the core protocol is resolved once, when the worker is built
(``pyrula.workflows.stores.capabilities``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pyrula.config.cloud import cloud_config
from pyrula.config.worker import WorkerOptions
from pyrula.errors import ConfigurationError, StoreUnavailable, WorkflowNotFound
from pyrula.health_http import ProbeServer
from pyrula.logs import WORKER_FIELDS
from pyrula.metrics import Metrics
from pyrula.store_wait import until_reachable
from pyrula.wire import WorkerState
from pyrula.workflows.build import serving_build
from pyrula.workflows.client import WorkflowClient
from pyrula.workflows.clock import SYSTEM_CLOCK, Clock, StoreClock
from pyrula.workflows.definition import REGISTRY, Registry, WorkflowSpec, workflow_name
from pyrula.workflows.engine import AttemptSettings
from pyrula.workflows.projections import PROJECTIONS, ProjectionSpec, projection_spec
from pyrula.workflows.records import PoisonPolicy
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.capabilities import capabilities_of
from pyrula.workflows.worker.attempts import AttemptParts, AttemptRunner, JournalCacheMismatch
from pyrula.workflows.worker.cache import JournalCache
from pyrula.workflows.worker.claim import ClaimLoop, ClaimParts
from pyrula.workflows.worker.generations import Generation, open_runs_of
from pyrula.workflows.worker.held import HeldRuns
from pyrula.workflows.worker.loops import Loop, LoopState, run_loop
from pyrula.workflows.worker.orphans import OrphanLoop, Serving
from pyrula.workflows.worker.pool import StepPool
from pyrula.workflows.worker.probes import Probes
from pyrula.workflows.worker.projections import projection_loops
from pyrula.workflows.worker.renewal import LockRenewer, RenewalSettings
from pyrula.workflows.worker.runtime import Runtime
from pyrula.workflows.worker.schedules import ScheduleLoop
from pyrula.workflows.worker.shutdown import Draining, shut_down
from pyrula.workflows.worker.store_loops import ClockLoop, ReconcileLoop, ShardLeaseLoop
from pyrula.workflows.worker.timers import TimerLoop
from pyrula.workflows.worker.triggers import trigger_loops
from pyrula.workflows.worker.usercode import UserCodeTracker

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from pyrula.cloud.connector import CloudConnector
    from pyrula.workflows.worker.traces import TraceExports

__all__ = ["JournalCacheMismatch", "WorkflowWorker"]

logger = logging.getLogger(__name__)

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


def _projections(given: Sequence[Any] | None) -> dict[str, ProjectionSpec]:
    """The projections a worker folds: ``given`` (@projection folds), or every one
    imported. TypeError naming what is not a projection."""
    if given is None:
        return PROJECTIONS.all()
    if isinstance(given, str) or not isinstance(given, Sequence):
        raise TypeError(f"projections= must be a list of @projection folds, got {given!r}")
    return {spec.name: spec for spec in map(projection_spec, given)}


class WorkflowWorker:
    """Runs workflows from ``store``: every imported ``@workflow``, or only ``workflows``.

    ``on_claimed`` (for a process that reports to a supervisor) is called on the event loop
    with ``held_runs()`` right after a claim returned runs, before any of them starts.
    ``on_user_code`` (likewise) is called on the event loop when the supervisor must hear
    of the runs in user code before a run's code goes on; it sends a report built with
    ``user_code_report()`` before it returns (see ``worker.usercode``).

    A run with a crash counted against it that has not completed an attempt since (a
    suspect) runs alone: the store never returns one to an ordinary claim; once the worker
    learns that suspects wait, it claims nothing more, lets the runs it holds end or park,
    claims one suspect (``claim_suspect``) and claims nothing else until its attempt ends
    (``worker.claim``).

    ``clock`` defaults to the store's own clock where it has one (a Valkey server's
    ``TIME``, carried forward by the monotonic clock: ``StoreClock``), else the host's: every
    worker then judges locks, leases and timers by one clock, whatever its host's says.

    ``span_exporter`` (an OpenTelemetry ``SpanExporter``; needs ``pyrula[otel]``): when an
    attempt ends its run, the run's trace is built from its journal and exported, in the
    background (``pyrula.workflows.tracing``, ``worker.traces``).

    ``projections`` (``@projection`` folds) are the projections its projection loop keeps
    up to date (``pyrula.workflows.projections``); None: every one imported.

    ``build`` names the code it serves instead of ``PYRULA_BUILD_ID`` or its fingerprint
    (``pyrula.workflows.build``): every run:started it writes records it.
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
        span_exporter: SpanExporter | None = None,
        build: str | None = None,
        projections: Sequence[Any] | None = None,
    ) -> None:
        self.options = o = (options if options is not None else WorkerOptions()).resolve()
        self.store: Store = store if store is not None else _default_store()
        #: How logs and errors name the store (the CLI sets its URL; else its repr).
        self.store_shown: str | None = None
        self._caps = capabilities_of(self.store)
        if clock is None:
            server = self._caps.server_clock
            clock = StoreClock(server.server_time) if server is not None else SYSTEM_CLOCK
        self._specs = _served(workflows, registry.workflows())
        self._projections = _projections(projections)
        self.worker_id = f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"
        #: The code it serves (``pyrula.workflows.build``), in every run:started it writes.
        self.build = serving_build(self._specs.values(), registry, build)
        self.client = WorkflowClient(self.store, clock=clock, max_payload_bytes=o.max_payload_bytes)
        self.health_address: tuple[str, int] | None = None
        #: The task that holds the probe server until ``aclose()`` or the loop's end.
        self._probes_held: asyncio.Task[None] | None = None
        self._closing: asyncio.Event | None = None
        self.metrics = Metrics()
        self._cloud = cloud
        #: The Cloud connector while ``run()`` serves with a key set (``worker.cloud``).
        self._connector: CloudConnector | None = None
        #: The fleet this worker is a child of (its Cloud reports group by it), or None.
        self.fleet: str | None = None
        self._clock = clock
        self._poison = PoisonPolicy(o.poison_max_retries, o.poison_retry_ttl_s)
        self._log = {"worker_id": self.worker_id}
        self._rt = Runtime()
        self._loops: dict[str, LoopState] = self._rt.loops
        self._cache = JournalCache(o.journal_cache_events)
        # Runs claimed and not yet ended, from the moment a claim returns, before the
        # attempt's task (and any user code) runs, so a crash report is complete.
        self._runs = HeldRuns(self._cache)
        self.generation = Generation(self.build)
        self._on_claimed = on_claimed
        self._user_code = UserCodeTracker(on_user_code)
        self._created = time.monotonic()
        self._pool: StepPool | None = None
        self._renewer: LockRenewer | None = None
        self._runner: AttemptRunner | None = None
        self._claim: ClaimLoop | None = None
        self._make_loops(clock)
        self._probes = Probes(self, self._rt, self._caps.queue_stats)
        self._traces = _trace_exports(self.store, span_exporter, self._log)

    def _make_loops(self, clock: Clock) -> None:
        """The timer, orphan and schedule loops (started by ``run()``)."""
        o = self.options
        self._timers = TimerLoop(self.store, self._caps.timers, clock,
                                 interval=o.timer_poll_interval_s, batch=o.timer_max_batch,
                                 runtime=self._rt, metrics=self.metrics)
        serving = Serving(self.store, self.worker_id, self.workflow_names, o, self._log)
        self._orphans = OrphanLoop(serving, self._poison, self._rt, self.metrics)
        self._schedules = ScheduleLoop(self.store, self.workflow_names, self.metrics, self._log,
                                       interval=o.schedule_interval, runtime=self._rt)

    # --- public surface -------------------------------------------------------------

    @property
    def workflow_names(self) -> list[str]:
        return sorted(self._specs)

    @property
    def state(self) -> WorkerState:
        """starting | ready | draining | stopped."""
        return self._rt.state

    @property
    def in_flight(self) -> int:
        return self._runs.in_flight()

    @property
    def step_threads_busy(self) -> int:
        """Sync-step threads running a step now."""
        return self._pool.busy if self._pool is not None else 0

    # --- upgrades (``worker.generations``) -------------------------------------------

    def retire(self) -> None:
        """An older generation's worker during an upgrade: claim nothing new, hand back
        each held run at its next step boundary."""
        self._rt.retiring = True
        self.generation.retire(self._runs.attempts())

    async def take(self, run_id: str) -> bool:
        """Claim ``run_id`` by id and run it to its end here (a run newer code cannot
        replay); False if it is no longer claimable."""
        if self._runner is None:
            return False
        return await self._runner.take(run_id)

    async def open_runs_of(self, build: str) -> list[str]:
        """The open runs that last ran on ``build`` and that this worker's code cannot
        replay: while there are any, an upgrade keeps a worker of ``build`` alive
        (``worker.generations``)."""
        return await open_runs_of(self.client, self._specs, build)

    def now(self) -> float:
        """The time by the worker's clock: the store's, where it has one."""
        return self._clock.now()

    @property
    def free_slots(self) -> int:
        return max(0, self.options.max_concurrent_runs - self.in_flight)

    @property
    def runs_done(self) -> int:
        """Runs this worker ended (completed, failed, cancelled, continued as new)."""
        return self._runner.runs_done if self._runner is not None else 0

    def held_runs(self) -> dict[str, int]:
        """The runs this worker holds, from the claim that returned them until their attempt
        ends: run id -> attempt (its fencing token)."""
        return self._runs.held()

    def user_code_report(self, *, heartbeat: bool) -> tuple[list[str], list[str]]:
        """(the runs to report as in user code, the suspects among the held runs), for a
        report about to be sent to a supervisor; ``heartbeat`` for the periodic one (it
        names exactly the runs in user code now). See ``worker.usercode``."""
        return self._user_code.snapshot(heartbeat=heartbeat)

    @property
    def store_waiting(self) -> bool:
        """Whether the worker is starting and its store has not answered yet."""
        return self._rt.store_waiting

    async def store_reachable(self) -> bool:
        """Whether the store answers now: a claim that completed within the last
        ``STORE_SEEN_S`` says so at no cost; otherwise a ``ping()`` within 2 s. (What a
        fleet child reports to its supervisor for the fleet's /readyz.)"""
        return await self._probes.store_reachable()

    def claim_tick_age(self) -> float:
        """Seconds since the claim loop last made progress (a fleet's stall watchdog)."""
        progress = self._claim.progress if self._claim is not None else self._created
        return time.monotonic() - progress

    def stop(self) -> None:
        """Begin the graceful shutdown; safe from a signal handler, a coroutine or a thread."""
        self._rt.stop()

    def _use_limits(self) -> None:
        """Hand the served workflows' per-key limits to the store; ConfigurationError
        naming the workflow and the store if the store cannot enforce them (a limit is
        never silently ignored)."""
        limits = {n: spec.limits for n, spec in self._specs.items() if spec.limits is not None}
        if not limits:
            return
        if self._caps.limits is None:
            name = next(iter(limits))
            raise ConfigurationError(
                f"workflow {name!r} has a concurrency or rate limit, which the store "
                f"{self.store_shown or self.store!r} cannot enforce (per-key limits need "
                "a store with that ability: memory, SQLite, Valkey, or an archiving store "
                "over one of them)"
            )
        self._caps.limits.use_limits(limits)

    async def wait_ready(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for ``run()`` to start serving (state
        ``ready``); whether it has. For a process that reports the moment to a supervisor."""
        rt = self._rt
        if not rt.serving.is_set():
            try:
                await asyncio.wait_for(rt.serving.wait(), timeout)
            except TimeoutError:
                return False
        return rt.state is WorkerState.READY

    async def aclose(self) -> None:
        """Close the probe server, which otherwise answers after ``run()`` returned until
        the event loop ends (call it after ``run()``, from the loop that ran it)."""
        held, self._probes_held = self._probes_held, None
        if held is not None and self._closing is not None:
            self._closing.set()
            await asyncio.gather(held, return_exceptions=True)
        self.health_address = None

    async def run(self) -> None:
        """Serve until ``stop()``. Raises ConfigurationError before any loop starts for
        what only the server can show, and re-raises a fatal loop error after shutdown."""
        cloud = cloud_config(self._cloud)
        if not self._specs:
            raise ConfigurationError(
                "no @workflow is registered: import your workflow modules before "
                "constructing the worker, or pass workflows=[...]"
            )
        self._use_limits()
        loop = asyncio.get_running_loop()
        # Every task started from here on (loops, attempts) logs as this worker's.
        WORKER_FIELDS.set({"worker_id": self.worker_id})
        rt = self._rt
        rt.start(loop)
        self._timers.start()
        # The probes first: while the store does not answer, /readyz says so.
        await self._start_probes()
        if not await self._store_ready():  # stopped while waiting for the store
            rt.state = WorkerState.STOPPED
            return
        if cloud is not None:
            from pyrula.workflows.worker.cloud import worker_connector

            self._connector = worker_connector(cloud, self)
            await self._connector.start()
        self._pool = StepPool(worker_id=self.worker_id, on_saturated=lambda: self.metrics.inc(
            "pyrula.workflows.step_threads.saturated"))
        self._runner = self._attempt_runner(self._pool)
        self._renewer = self._lock_renewer(loop)
        self._renewer.start()
        background = self._start_loops()
        self._claim = ClaimLoop(ClaimParts(
            store=self.store, doorbell=self._caps.doorbell, clock=self._clock,
            options=self.options, worker_id=self.worker_id, names=self.workflow_names,
            build=self.build, runs=self._runs, user_code=self._user_code, start=self._runner.start,
            on_claimed=self._on_claimed, metrics=self.metrics, log=self._log,
        ), rt)
        claim = asyncio.create_task(self._supervise(self._claim))
        if rt.binding_ok and not rt.stop_requested:
            rt.mark_ready()
        logger.info(
            "worker_started: %s serving %s (build %s)", self.worker_id,
            ", ".join(self.workflow_names), self.build,
            extra={"event": "worker_started", "build": self.build, **self._log},
        )
        try:
            await rt.stopping.wait()
        finally:
            await self._shutdown(claim, background)
        if rt.fatal is not None:
            raise rt.fatal

    # --- startup --------------------------------------------------------------------

    async def _store_ready(self) -> bool:
        """Wait for the store to answer and pass its checks (``store_wait`` at most);
        False if stopped meanwhile. A refusal (or a store away too long) closes the probes,
        the only thing started so far, and is raised."""
        rt = self._rt
        rt.store_waiting = True
        try:
            return await until_reachable(
                self._prepare_store, where=self.store_shown or repr(self.store),
                bound=self.options.store_wait, stopping=rt.stopping, log=self._log,
            )
        except BaseException:
            await self.aclose()
            raise
        finally:
            rt.store_waiting = False

    def _lock_renewer(self, loop: asyncio.AbstractEventLoop) -> LockRenewer:
        o = self.options
        return LockRenewer(
            store=self.store, clock=self._clock, loop=loop, runs=self._runs, watch=self._rt,
            metrics=self.metrics,
            settings=RenewalSettings(
                worker_id=self.worker_id, lock_ttl=o.lock_ttl, poison=self._poison,
                charge_loop_blocked=o.poison_counts_loop_blocked, log_extra=self._log,
            ),
        )

    def _attempt_runner(self, pool: StepPool) -> AttemptRunner:
        o = self.options
        settings = AttemptSettings(
            lock_ttl=o.lock_ttl,
            step_boundary_durability=o.step_boundary_durability,
            event_buffer_size=o.event_buffer_size,
            max_payload_bytes=o.max_payload_bytes,
            child_recheck=o.child_recheck,
        )
        return AttemptRunner(AttemptParts(
            specs=self._specs, store=self.store, clock=self._clock, options=o,
            settings=settings, pool=pool, runs=self._runs, cache=self._cache,
            user_code=self._user_code, timers=self._timers,
            metrics=self.metrics, log=self._log, worker_id=self.worker_id,
            generation=self.generation, traces=self._traces,
            report=self._connector.report if self._connector is not None else None,
        ), self._rt)

    async def _prepare_store(self) -> None:
        if self._caps.prepare is not None:
            # Server-side checks (eviction policy, shard count, cluster mode) come first.
            await self._caps.prepare.prepare(self.workflow_names)
        project, environment = self.options.project, self.options.environment
        if isinstance(self._clock, StoreClock):
            # The clock before the first claim writes a lock; read beside the binding.
            _, recorded = await asyncio.gather(self._clock.sync(),
                                               self.store.bind(project, environment))
        else:
            recorded = await self.store.bind(project, environment)
        self._rt.binding_ok = all(
            want is None or have is None or want == have
            for want, have in zip((project, environment), recorded, strict=True)
        )
        if not self._rt.binding_ok:
            logger.error(
                "store_binding_mismatch: this store is bound to project=%r environment=%r, "
                "the worker is configured for project=%r environment=%r; not claiming",
                recorded[0], recorded[1], project, environment,
                extra={"event": "store_binding_mismatch", **self._log},
            )

    async def _start_probes(self) -> None:
        """Serve the probes, held by a task of their own until ``aclose()`` or the loop's
        end (a server kept from an earlier ``run()`` serves on)."""
        if self.options.health_port is None or self._probes_held is not None:
            return
        probe, self.health_address = await self._probes.start(
            self.options.health_host, self.options.health_port
        )
        self._closing = asyncio.Event()
        self._probes_held = asyncio.create_task(self._hold_probes(probe, self._closing),
                                                name="pyrula-probes")

    @staticmethod
    async def _hold_probes(probe: ProbeServer, closing: asyncio.Event) -> None:
        try:
            await closing.wait()
        finally:  # aclose(), or cancelled as the event loop ends
            await probe.close()

    def _start_loops(self) -> list[asyncio.Task[None]]:
        o, caps = self.options, self._caps
        names = self.workflow_names
        loops: list[Loop] = [self._timers, self._orphans, self._schedules]
        if isinstance(self._clock, StoreClock):
            loops.append(ClockLoop(self._clock))
        if caps.reconcile is not None:
            loops.append(ReconcileLoop(caps.reconcile, self.worker_id, names, o, self.metrics))
        if caps.shard_leases is not None:
            loops.append(ShardLeaseLoop(caps.shard_leases, self.worker_id, names, o))
        loops += trigger_loops(self._specs, caps.triggers, self.metrics, self._log,
                               interval=o.trigger_interval, runtime=self._rt,
                               store_shown=repr(self.store))
        loops += projection_loops(self._projections, caps.projections, self.metrics, self._log,
                                  interval=o.projection_interval, grace=o.projection_grace,
                                  runtime=self._rt, store_shown=repr(self.store))
        tasks = [asyncio.create_task(self._rt.beat(), name="pyrula-heartbeat")]
        tasks += [
            asyncio.create_task(self._supervise(loop), name=f"pyrula-{loop.name}")
            for loop in loops
        ]
        return tasks

    async def _supervise(self, loop: Loop) -> None:
        state = self._loops.setdefault(loop.name, LoopState(loop.name))
        try:
            await run_loop(state, loop, self._clock, self._rt.stopping, self.metrics, self._log)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # not a store error: the worker stops and run() re-raises
            logger.exception(
                "loop_died: %s loop failed with %s; stopping the worker", loop.name,
                type(exc).__name__, extra={"event": "loop_died", "loop": loop.name, **self._log},
            )
            self._rt.fail(exc, loop.name)

    def shards(self) -> dict[str, int]:
        """The shards this worker leases: workflow name -> how many, every name it serves
        listed (0 before its first lease) on a sharded store; empty on any other."""
        leases = self._caps.shard_leases
        if leases is None:
            return {}
        return {**dict.fromkeys(self.workflow_names, 0), **leases.shards_held(self.worker_id)}

    # --- shutdown -------------------------------------------------------------------

    async def _shutdown(
        self, claim: asyncio.Task[None], background: list[asyncio.Task[None]]
    ) -> None:
        self._rt.state = WorkerState.DRAINING
        await shut_down(Draining(
            options=self.options, log=self._log, claim=claim, claim_loop=self._claim,
            runner=self._runner, runs=self._runs, pool=self._pool, renewer=self._renewer,
            traces=self._traces, background=background, release=self._release,
            sharded=self._caps.shard_leases is not None, cloud=self._connector,
        ))
        self._connector = None
        self._rt.state = WorkerState.STOPPED
        logger.info("worker_stopped: %s", self.worker_id,
                    extra={"event": "worker_stopped", **self._log})

    async def _release(self) -> None:
        """Step 5's store calls: release the shards, unregister."""
        leases = self._caps.shard_leases
        if leases is not None:
            try:
                await leases.release_shards(self.worker_id)
            except StoreUnavailable as exc:
                logger.warning("shard release failed: %s; a fleet's supervisor releases "
                               "them once the store answers, else they lapse after "
                               "shard_lease_ttl", exc, extra=self._log)
            except Exception:  # shards then lapse after shard_lease_ttl
                logger.warning("shard release failed", exc_info=True, extra=self._log)
        try:
            await self._orphans.membership.leave()
        except Exception:  # the registration lapses by itself
            logger.debug("unregister failed", exc_info=True, extra=self._log)


def _served(workflows: Sequence[Any] | None,
            available: dict[str, WorkflowSpec]) -> dict[str, WorkflowSpec]:
    """The workflows a worker serves: every registered one, or those named."""
    if workflows is None:
        return available
    chosen = {}
    for wf in workflows:
        name = workflow_name(wf)
        if name not in available:
            raise WorkflowNotFound(f"no workflow registered under the name {name!r}")
        chosen[name] = available[name]
    return chosen


def _trace_exports(store: Store, exporter: SpanExporter | None,
                   log: dict[str, str]) -> TraceExports | None:
    """The exporter of ended runs' traces (needs pyrula[otel]: says so at construction)."""
    if exporter is None:
        return None
    from pyrula.workflows.tracing import require_otel
    from pyrula.workflows.worker.traces import TraceExports

    require_otel()
    return TraceExports(store, exporter, log)
