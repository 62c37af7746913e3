"""Running a claimed run's attempt: its journal, the engine's ``Attempt``, what it ended as.

Each claimed run is held (``worker.held``) from its claim until its attempt's task ends,
whatever it ended as; the renewal thread renews its lock meanwhile. A run whose attempt
lost the store is requeued (reason ``store_unavailable``, no crash counted) once the store
answers again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyrula.backoff import backoff_delays
from pyrula.config.worker import WorkerOptions
from pyrula.errors import JournalCorrupt, StaleToken, StoreUnavailable, WorkflowNotFound
from pyrula.metrics import Counter, Histogram, Metrics
from pyrula.workflows.clock import Clock
from pyrula.workflows.compat import Stop as ReplayStop
from pyrula.workflows.compat import check_replay
from pyrula.workflows.definition import WorkflowSpec
from pyrula.workflows.engine import Attempt, AttemptSettings, Outcome, OutcomeKind
from pyrula.workflows.events import Event, EventType
from pyrula.workflows.forks import seed_fork
from pyrula.workflows.frames import failing_frame
from pyrula.workflows.limits import LimitKeyFailed
from pyrula.workflows.operations import StepObserver
from pyrula.workflows.records import ClaimedRun, RunError, RunStatus
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.capabilities import capabilities_of
from pyrula.workflows.worker.cache import JournalCache
from pyrula.workflows.worker.generations import Generation, last_build, refuse
from pyrula.workflows.worker.held import HeldRuns
from pyrula.workflows.worker.pool import StepPool
from pyrula.workflows.worker.runtime import Runtime
from pyrula.workflows.worker.timers import TimerLoop
from pyrula.workflows.worker.usercode import UserCodeTracker

if TYPE_CHECKING:
    from pyrula.workflows.worker.traces import TraceExports

logger = logging.getLogger(__name__)


#: The outcomes that end a run, and the counter each adds to (beyond ``runs.finished``).
_ENDED: dict[OutcomeKind, str | None] = {
    OutcomeKind.COMPLETED: "pyrula.workflows.runs.completed",
    OutcomeKind.FAILED: "pyrula.workflows.runs.failed",
    OutcomeKind.CANCELLED: "pyrula.workflows.runs.cancelled",
    OutcomeKind.CONTINUED: None,
}


#: How long the replay check of a run from another build may take: code that awaits
#: something other than its steps that long is run rather than judged.
REPLAY_CHECK_TIMEOUT_S = 1.0


#: ``report(run_id, workflow, events)``: must not block or raise (it queues).
Reporter = Callable[[str, str, list[Event]], None]


def report_attempt(report: Reporter | None, claimed: ClaimedRun,
                   journal: list[Event] | None = None) -> None:
    """Report the entries the claim returned, or (``journal``, after the attempt) the
    entries written since them."""
    if report is None:
        return
    if journal is None:
        report(claimed.run_id, claimed.name, list(claimed.journal))
        return
    since = max((int(e.get("seq", 0)) for e in claimed.journal), default=claimed.base_seq)
    report(claimed.run_id, claimed.name, [e for e in journal if int(e.get("seq", 0)) > since])


class _Figures:
    """The metric series one workflow's runs record, each found once: a worker records
    them for every run."""

    __slots__ = ("_metrics", "_workflow", "started", "claim_latency", "duration", "ended",
                 "_steps")

    def __init__(self, metrics: Metrics, workflow: str) -> None:
        self._metrics, self._workflow = metrics, workflow
        self.started = metrics.counter("pyrula.workflows.runs.started", workflow=workflow)
        self.claim_latency = metrics.histogram("pyrula.workflows.claim.latency",
                                               workflow=workflow)
        self.duration = metrics.histogram("pyrula.workflows.run.duration", workflow=workflow)
        self.ended = {kind: metrics.counter(name, workflow=workflow)
                      for kind, name in _ENDED.items() if name is not None}
        self._steps: dict[str, Histogram] = {}

    def step(self, name: str) -> Histogram:
        histogram = self._steps.get(name)
        if histogram is None:
            histogram = self._steps[name] = self._metrics.histogram(
                "pyrula.workflows.step.duration", workflow=self._workflow, step=name)
        return histogram


class JournalCacheMismatch(RuntimeError):
    """PYRULA_JOURNAL_CACHE_VERIFY found a cached journal that differs from the store."""


@dataclass(frozen=True, slots=True)
class AttemptParts:
    """What every attempt of one worker is run with."""

    specs: Mapping[str, WorkflowSpec]
    store: Store
    clock: Clock
    options: WorkerOptions
    settings: AttemptSettings
    pool: StepPool
    runs: HeldRuns
    cache: JournalCache
    user_code: UserCodeTracker
    timers: TimerLoop
    metrics: Metrics
    log: Mapping[str, str]
    worker_id: str
    generation: Generation
    #: Exports the trace of each run an attempt ends (``span_exporter``), or None.
    traces: TraceExports | None = None
    #: Hears the journal entries each attempt saw and wrote (the Cloud connector), or None.
    report: Reporter | None = None


class AttemptRunner:
    """Starts the attempt of each claimed run as a task, and sees to what it ended as."""

    def __init__(self, parts: AttemptParts, runtime: Runtime) -> None:
        self._p = parts
        self._rt = runtime
        self.tasks: set[asyncio.Task[None]] = set()
        self.runs_done = 0
        #: The series each workflow's runs record, and each outcome's, found once.
        self._figures: dict[str, _Figures] = {}
        self._outcomes: dict[OutcomeKind, tuple[Counter, Counter]] = {}

    def start(self, claimed: ClaimedRun) -> None:
        p = self._p
        p.runs.claimed(claimed.run_id, claimed.token)
        if claimed.suspect:
            # Claimed alone (``claim_suspect``): the claim loop claims nothing beside it
            # until this attempt ends.
            p.user_code.suspect(claimed.run_id, claimed.token)
        task = asyncio.create_task(self._run(claimed), name=f"pyrula-attempt:{claimed.run_id}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _journal_for(self, claimed: ClaimedRun) -> list[Event]:
        """The claimed run's journal from seq 1; a fork's first attempt seeds it first."""
        journal = await self._read_journal(claimed)
        return await seed_fork(self._p.store, claimed, journal, now=self._p.clock.now(),
                               lock_ttl=self._p.options.lock_ttl)

    async def _read_journal(self, claimed: ClaimedRun) -> list[Event]:
        p = self._p
        if claimed.journal_error is not None:
            raise claimed.journal_error
        if claimed.base_seq == 0:
            return list(claimed.journal)
        cached = p.cache.take(claimed.run_id, claimed.base_seq)
        p.metrics.inc("pyrula.workflows.journal_cache.misses" if cached is None
                      else "pyrula.workflows.journal_cache.hits")
        if cached is None:
            return await p.store.read_events(claimed.run_id)
        journal = cached + list(claimed.journal)
        if p.options.journal_cache_verify:
            fresh = await p.store.read_events(claimed.run_id)
            if fresh != journal:
                raise JournalCacheMismatch(
                    f"journal cache of run {claimed.run_id} differs from the store "
                    f"({len(journal)} cached events vs {len(fresh)} stored)"
                )
        return journal

    async def _run(self, claimed: ClaimedRun) -> None:
        p = self._p
        spec = p.specs[claimed.name]
        run_log = {"run_id": claimed.run_id, "workflow": claimed.name,
                   "attempt": claimed.token, **p.log}
        p.runs.renew(claimed.run_id, claimed.token, self._liveness_bound(spec))
        self._count_start(claimed)
        try:
            try:
                journal = await self._journal_for(claimed)
            except JournalCacheMismatch as exc:
                logger.critical("journal_cache_mismatch: %s", exc, extra=run_log)
                self._rt.fail(exc)
                return
            report_attempt(p.report, claimed)
            if await self._limit_wait(spec, claimed, run_log):
                return
            if await self._refused(spec, claimed, journal, run_log):
                return
            attempt = Attempt(
                spec, claimed, journal, p.store, executor=p.pool, clock=p.clock,
                settings=p.settings, user_code=p.user_code, on_step=self._step_timer(claimed),
            )
            if p.runs.attach(attempt):
                attempt.abandon()  # stood down while its journal was being read
            elif (reason := p.runs.standing_down) is not None:
                attempt.stand_down(reason)  # the shutdown stood the others down meanwhile
            p.generation.hand_back_if_retiring(attempt)  # claimed as the worker retired
            outcome = await attempt.run()
            report_attempt(p.report, claimed, outcome.journal)
            await self._after(claimed, outcome, run_log)
        except JournalCorrupt as exc:
            await self._fail_corrupt(claimed, exc, run_log)
        except StaleToken:  # seeding a fork: another attempt holds the run already
            logger.warning("run %s: lock lost to another attempt while its fork was seeded; "
                           "stood down", claimed.run_id,
                           extra={"event": "run_lock_lost", **run_log})
        except StoreUnavailable as exc:
            logger.warning("run %s: store unavailable before the attempt began (%s)",
                           claimed.run_id, exc, extra=run_log)
            self._rt.store_failed()
            await self._requeue_unavailable(claimed, run_log)
        finally:
            # A newer attempt of the same run may be in flight here already (this one was
            # stood down): forget only this attempt.
            p.user_code.attempt_ended(claimed.run_id, claimed.token)
            p.runs.release(claimed.run_id, claimed.token)
            self._rt.capacity.set()

    async def take(self, run_id: str) -> bool:
        """Claim ``run_id`` by id and run it here to its end (pinned: an upgrade's newer
        code cannot replay it); False if it is no longer claimable."""
        p = self._p
        claimed = await p.store.claim_run(run_id, p.worker_id, now=p.clock.now(),
                                          lock_ttl=p.options.lock_ttl,
                                          build=p.generation.build)
        if claimed is None:
            return False
        p.generation.pinned.add(run_id)
        self.start(claimed)
        return True

    async def _refused(self, spec: WorkflowSpec, claimed: ClaimedRun, journal: list[Event],
                       run_log: dict[str, Any]) -> bool:
        """True if this worker's code cannot replay the run, which last ran on another
        build: it is then handed on rather than failed (``worker.generations``)."""
        generation = self._p.generation
        theirs = last_build(journal)
        if theirs is None or theirs == generation.build:
            return False
        verdict = await check_replay(spec, journal, run_id=claimed.run_id,
                                     timeout=REPLAY_CHECK_TIMEOUT_S)
        if verdict.stop is not ReplayStop.DIVERGED:
            return False
        try:
            await refuse(self._p.store, claimed, journal, theirs, verdict.reason or "",
                         generation, self._p.clock.now(), run_log)
        except (StaleToken, WorkflowNotFound):
            pass  # another attempt holds the run now
        return True

    def _figures_of(self, workflow: str) -> _Figures:
        figures = self._figures.get(workflow)
        if figures is None:
            figures = self._figures[workflow] = _Figures(self._p.metrics, workflow)
        return figures

    def _count_start(self, claimed: ClaimedRun) -> None:
        """Count the attempt begun, and how long the run waited for this claim: from the
        event that made it claimable (its submit, requeue or wake) to its ``run:started``."""
        figures, journal = self._figures_of(claimed.name), claimed.journal
        figures.started.inc()
        if journal and journal[-1].get("type") == EventType.RUN_STARTED:
            ready = journal[-2]["ts"] if len(journal) >= 2 else claimed.created_at
            figures.claim_latency.observe(max(0.0, journal[-1]["ts"] - ready))

    def _step_timer(self, claimed: ClaimedRun) -> StepObserver:
        figures = self._figures_of(claimed.name)

        def observe(step: str, seconds: float, ok: bool) -> None:
            figures.step(step).observe(seconds)

        return observe

    def _outcome(self, kind: OutcomeKind) -> tuple[Counter, Counter]:
        """The counters of attempts that ended as ``kind``, and of runs that ended so."""
        counters = self._outcomes.get(kind)
        if counters is None:
            metrics = self._p.metrics
            counters = self._outcomes[kind] = (
                metrics.counter("pyrula.workflows.attempts", outcome=kind.value),
                metrics.counter("pyrula.workflows.runs.finished", status=kind.value))
        return counters

    def _liveness_bound(self, spec: WorkflowSpec) -> float:
        return max(3 * self._p.options.lock_ttl, spec.timeout or 0.0)

    async def _after(self, claimed: ClaimedRun, outcome: Outcome, run_log: dict[str, Any]) -> None:
        p = self._p
        kind = outcome.kind
        attempts, finished = self._outcome(kind)
        attempts.inc()
        if kind is OutcomeKind.PARKED:
            p.cache.put(claimed.run_id, outcome.journal)
            if outcome.wake_at is not None:
                p.timers.note_timer(outcome.wake_at)
        else:
            p.cache.drop(claimed.run_id)
        if kind in _ENDED:
            self.runs_done += 1
            finished.inc()
            figures = self._figures_of(claimed.name)
            ended = figures.ended.get(kind)
            if ended is not None:
                ended.inc()
            figures.duration.observe(max(0.0, p.clock.now() - claimed.created_at))
            if p.traces is not None:
                p.traces.run_ended(claimed.run_id)
        elif kind is OutcomeKind.REQUEUED:
            p.metrics.inc("pyrula.workflows.runs.requeued", reason=outcome.reason or "unknown")
        if kind is OutcomeKind.FAILED and outcome.error is not None:
            error = outcome.error
            where = failing_frame((error.get("detail") or {}).get("traceback"))
            message, error_type = str(error.get("message")), str(error.get("error_type"))
            logger.warning("run_failed: run %s of %s failed [%s] %s%s", claimed.run_id,
                           claimed.name, error.get("code"),
                           message if error_type in message else f"{error_type}: {message}",
                           f" (at {where})" if where else "",
                           extra={"event": "run_failed", **run_log})
        elif kind is OutcomeKind.LOST:
            logger.warning("run %s: lock lost to another attempt; stood down", claimed.run_id,
                           extra={"event": "run_lock_lost", **run_log})
        elif kind is OutcomeKind.STORE_UNAVAILABLE:
            self._rt.store_failed()
            await self._requeue_unavailable(claimed, run_log)

    async def _fail_corrupt(self, claimed: ClaimedRun, exc: JournalCorrupt,
                            run_log: dict[str, Any]) -> None:
        """Fail a run whose journal holds an entry pyrula did not write: replaying it could
        only crash or run steps again, on every worker and every attempt. Its code is not
        the cause, so this is a failure of the run, not a crash counted toward poison."""
        logger.error("run_journal_corrupt: %s; the run fails", exc,
                     extra={"event": "run_journal_corrupt", **run_log})
        error = RunError("corrupt_journal", "JournalCorrupt", str(exc),
                         {"seq": exc.seq, "reason": exc.reason})
        await self._fail_run(claimed, error, run_log)

    async def _limit_wait(self, spec: WorkflowSpec, claimed: ClaimedRun,
                          run_log: dict[str, Any]) -> bool:
        """For a run of a limited workflow claimed without its keys (submitted where the
        workflow was not imported): compute them and hand them to the store. True if the
        run must not go on here: over its limit, it went back to its key's line; or its
        key function failed, and the run fails (code ``limit_key_failed``)."""
        if claimed.limit_keys is not None or (spec.concurrency is None and spec.rate is None):
            return False  # every run of a workflow without limits: nothing more to read
        limits = capabilities_of(self._p.store).limits
        if limits is None:
            return False
        try:
            keys = spec.limit_keys(claimed.params)
        except LimitKeyFailed as exc:
            logger.error("run_limit_key_failed: %s; the run fails", exc,
                         extra={"event": "run_limit_key_failed", **run_log})
            await self._fail_run(
                claimed, RunError("limit_key_failed", "LimitKeyFailed", str(exc), {}), run_log)
            return True
        assert keys is not None
        if await limits.assign_limit_keys(claimed.run_id, claimed.token, keys,
                                          now=self._p.clock.now()):
            return False
        logger.info("run %s waits: its key is at its limit", claimed.run_id,
                    extra={"event": "run_limit_wait", **run_log})
        self._p.metrics.inc("pyrula.workflows.runs.requeued", reason="limit")
        return True

    async def _fail_run(self, claimed: ClaimedRun, error: RunError,
                        run_log: dict[str, Any]) -> None:
        """End the claimed run failed with ``error`` (not a crash counted to poison)."""
        now = self._p.clock.now()
        try:
            await self._p.store.finish(claimed.run_id, claimed.token, [error.event(now)],
                                       now=now, status=RunStatus.FAILED, error=error.as_dict())
        except (StaleToken, WorkflowNotFound):
            return  # another attempt holds the run (it meets the same entry), or it is gone
        except StoreUnavailable:
            await self._requeue_unavailable(claimed, run_log)
            return
        self.runs_done += 1
        self._p.metrics.inc("pyrula.workflows.runs.finished", status="failed")
        self._p.metrics.inc("pyrula.workflows.runs.failed", workflow=claimed.name)

    async def _requeue_unavailable(self, claimed: ClaimedRun, run_log: dict[str, Any]) -> None:
        """Put the run back (reason store_unavailable) once the store answers again. The
        run stays held meanwhile (the renewal thread renews its lock as soon as the store
        is back), however long the outage: the requeue is fenced, so it lands only if no
        one recovered the run in between, and the run is not charged a crash for it."""
        delays = backoff_delays(0.1, 1.0)
        while True:
            try:
                await self._p.store.requeue(
                    claimed.run_id, claimed.token, now=self._p.clock.now(),
                    reason="store_unavailable",
                )
                logger.warning("run %s requeued: the store was unavailable during its attempt",
                               claimed.run_id, extra={"event": "run_requeued", **run_log})
                self._p.metrics.inc("pyrula.workflows.runs.requeued", reason="store_unavailable")
                return
            except (StaleToken, WorkflowNotFound):
                return
            except StoreUnavailable:
                self._rt.store_failed()
                await asyncio.sleep(delays())
