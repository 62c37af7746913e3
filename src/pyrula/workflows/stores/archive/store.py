"""ArchivingStore: a live store (Valkey) whose finished runs are copied to Postgres.

Every Store call goes to the live store (the class is a ``StoreLayer`` over it and
overrides only the calls below). When a call ends a run (``finish``, a
quarantining or cancelling ``requeue``/``reclaim``, ``cancel``, ``fail_stranded``), the
same process archives the run right after (archiver.py): it reads the run and its whole
journal from the live store, upserts them into the archive, then shortens the live copy's
TTL to ``live_ttl_after_archive``. Reads fall back to the archive once the live copy is
gone. ``reconcile_tick`` archives whatever was missed (a Postgres outage, a process that
died right after a terminal write).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pyrula.config.defaults import ARCHIVE_DSN_ENV
from pyrula.config.parse import env_value, parse_float
from pyrula.errors import ConfigurationError, RunNotActive, WorkflowNotFound
from pyrula.workflows.events import Event
from pyrula.workflows.records import (
    FinishResult,
    PoisonPolicy,
    RequeueOutcome,
    RunInfo,
    RunOutcome,
    RunStatus,
)
from pyrula.workflows.stores.archive.archiver import Archiver, ReconcileReport
from pyrula.workflows.stores.archive.pool import ArchiveUnavailable
from pyrula.workflows.stores.archive.postgres import PostgresArchive
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.capabilities import Capabilities, capabilities_of
from pyrula.workflows.stores.layer import StoreLayer

logger = logging.getLogger(__name__)

#: The environment variable of ``reconcile_grace`` for stores built from the environment.
GRACE_ENV = "PYRULA_ARCHIVE_RECONCILE_GRACE"


class ArchivingStore(StoreLayer):
    """``ArchivingStore(live=ValkeyStore(...), archive=PostgresArchive(dsn=...),
    live_ttl_after_archive=300)``.

    Implements the whole Store protocol over ``live``: the calls that end a run archive it
    right after, the reads fall back to the archive, and every other call (``aping``
    included: an archive outage does not make a worker unready) is the live store's. Its
    optional abilities (shard leases, the doorbell...) are the live store's too.
    ``reconcile_grace`` is how long after a run's end reconciliation leaves it to the
    process that ended it (it must exceed the clock skew between hosts);
    ``reconcile_batch`` how many ended runs it reads from the live store at a time.
    """

    def __init__(
        self,
        live: Store,
        archive: PostgresArchive,
        live_ttl_after_archive: float = 300,
        *,
        namespace: str | None = None,
        reconcile_grace: float = 30.0,
        reconcile_batch: int = 500,
    ) -> None:
        if live is None or isinstance(live, ArchivingStore):
            raise ConfigurationError("ArchivingStore needs a live store (e.g. a ValkeyStore)")
        if not isinstance(archive, PostgresArchive):
            raise ConfigurationError(
                f"ArchivingStore archive must be a PostgresArchive, got {type(archive).__name__}"
            )
        for label, value in (("live_ttl_after_archive", live_ttl_after_archive),
                             ("reconcile_grace", reconcile_grace)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                0 <= value < float("inf")
            ):
                raise ConfigurationError(f"{label} must be seconds >= 0, got {value!r}")
        if isinstance(reconcile_batch, bool) or not isinstance(reconcile_batch, int) or (
            reconcile_batch < 1
        ):
            raise ConfigurationError(
                f"reconcile_batch must be an int >= 1, got {reconcile_batch!r}"
            )
        super().__init__(live)
        self.live: Store = live
        #: How the live store reads an outcome of its own (None: through wait_result).
        self._live_outcomes = capabilities_of(live).outcomes
        self.archive = archive
        self.live_ttl_after_archive = float(live_ttl_after_archive)
        self.reconcile_grace = float(reconcile_grace)
        self.reconcile_batch = reconcile_batch
        self.namespace = str(namespace or getattr(live, "namespace", None) or "default")
        self.archiver = Archiver(
            live, archive, namespace=self.namespace,
            live_ttl_after_archive=self.live_ttl_after_archive,
            reconcile_grace=self.reconcile_grace, reconcile_batch=reconcile_batch,
        )

    def capabilities(self) -> Capabilities:
        """The live store's abilities, with this store's own startup checks and reconcile
        loop."""
        live = capabilities_of(self.live)
        # Per-key limits are the live store's (its submit takes the keys through, and
        # a run a hand-back ends, cancelled, is archived by the reconcile loop).
        # Outcome reads fall back to the archive, as wait_result does.
        return replace(live, prepare=self, reconcile=self, outcomes=self,
                       projections=None if live.projections is None else self)

    # --- archiving (archiver.py) ------------------------------------------------------

    async def reconcile(self, *, now: float | None = None, max_batches: int = 20
                        ) -> ReconcileReport:
        """Archive every run that ended up to ``now - reconcile_grace`` and is not archived
        yet, from the archive's cursor on (at most ``max_batches`` batches of
        ``reconcile_batch``). Raises ArchiveUnavailable if Postgres does not answer."""
        return await self.archiver.reconcile(now=now, max_batches=max_batches)

    async def reconcile_tick(
        self, *, worker_id: str, names: Sequence[str], now: float, options: Any = None
    ) -> float | None:
        """The worker's reconcile loop (see Archiver.tick): an archive outage is retried
        with back-off without failing the loop; a schema mismatch is raised."""
        return await self.archiver.tick(worker_id=worker_id, now=now)

    def reconcile_lag(self, now: float) -> float | None:
        """The archive's lag (``Archiver.lag``): ``pyrula_archive_lag_seconds``."""
        return self.archiver.lag(now)

    async def prepare(self, names: Sequence[str]) -> None:
        """The worker's startup checks: the live store's, then the archive schema
        (ArchiveSchemaMismatch). An archive that does not answer yet is checked on its
        first use instead: a Postgres outage does not keep workers from starting."""
        prepare = capabilities_of(self.live).prepare
        if prepare is not None:
            await prepare.prepare(names)
        try:
            await self.archive.check()
        except ArchiveUnavailable as exc:
            self.archiver.failed(exc)

    # --- the calls that end runs: each archives what it ended -------------------------

    async def finish(
        self,
        run_id: str,
        token: int,
        events: Sequence[Event],
        *,
        now: float,
        status: RunStatus,
        result: Any = None,
        error: dict[str, Any] | None = None,
        successor_params: Any = None,
    ) -> FinishResult:
        finished = await self.live.finish(run_id, token, events, now=now, status=status,
                                          result=result, error=error,
                                          successor_params=successor_params)
        await self.archiver.archive_now([run_id])
        return finished

    async def requeue(
        self,
        run_id: str,
        token: int,
        *,
        now: float,
        reason: str,
        events: Sequence[Event] = (),
        crash: bool = False,
        poison: PoisonPolicy | None = None,
        crash_detail: Mapping[str, Any] | None = None,
    ) -> RequeueOutcome:
        outcome = await self.live.requeue(run_id, token, now=now, reason=reason, events=events,
                                          crash=crash, poison=poison, crash_detail=crash_detail)
        # Quarantined, or cancelled while running: the run ended (a requeued one is skipped).
        await self.archiver.archive_now([run_id])
        return outcome

    async def reclaim(
        self,
        names: Sequence[str] | None,
        *,
        now: float,
        limit: int,
        poison: PoisonPolicy,
    ) -> list[RequeueOutcome]:
        outcomes = await self.live.reclaim(names, now=now, limit=limit, poison=poison)
        await self.archiver.archive_now([o.run_id for o in outcomes])
        return outcomes

    async def reclaim_worker(
        self,
        worker_id: str,
        *,
        now: float,
        poison: PoisonPolicy,
        crash_detail: Mapping[str, Any] | None = None,
        charge: Collection[str] | None = None,
    ) -> list[RequeueOutcome]:
        outcomes = await self.live.reclaim_worker(
            worker_id, now=now, poison=poison, crash_detail=crash_detail, charge=charge
        )
        await self.archiver.archive_now([o.run_id for o in outcomes])
        return outcomes

    async def requeue_unheld(
        self, worker_id: str, held: Collection[str], *, now: float
    ) -> list[RequeueOutcome]:
        outcomes = await self.live.requeue_unheld(worker_id, held, now=now)
        await self.archiver.archive_now([o.run_id for o in outcomes])  # the cancelled ones
        return outcomes

    # --- run control ----------------------------------------------------------------

    async def _archived_or_raise(self, run_id: str, exc: WorkflowNotFound) -> RunInfo:
        info = await self.archive.get_run(run_id, self.namespace)
        if info is None:
            raise exc
        return info

    async def signal(self, run_id: str, name: str, payload: Any, *, now: float) -> None:
        try:
            await self.live.signal(run_id, name, payload, now=now)
        except WorkflowNotFound as exc:
            info = await self._archived_or_raise(run_id, exc)
            raise RunNotActive(
                f"run {run_id} has already ended ({info.status.value})"
            ) from None

    async def cancel(self, run_id: str, *, now: float) -> bool:
        try:
            cancelled = await self.live.cancel(run_id, now=now)
        except WorkflowNotFound as exc:
            await self._archived_or_raise(run_id, exc)
            return False
        if cancelled:
            await self.archiver.archive_now([run_id])  # skipped if it was running (only requested)
        return cancelled

    async def wake_run(self, run_id: str, *, now: float) -> bool:
        try:
            return await self.live.wake_run(run_id, now=now)
        except WorkflowNotFound as exc:
            await self._archived_or_raise(run_id, exc)
            return False

    # --- reads ----------------------------------------------------------------------

    async def get_run(self, run_id: str) -> RunInfo | None:
        info = await self.live.get_run(run_id)
        if info is not None:
            return info
        return await self.archive.get_run(run_id, self.namespace)

    async def read_events(self, run_id: str, after_seq: int = 0) -> list[Event]:
        try:
            return await self.live.read_events(run_id, after_seq)
        except WorkflowNotFound:
            return await self.archive.read_events(run_id, after_seq, self.namespace)

    async def list_runs(
        self,
        *,
        name: str | None = None,
        status: RunStatus | None = None,
        owner: str | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[RunInfo]:
        """Both stores' runs, merged newest first (a run in both is shown once, live)."""
        live = await self.live.list_runs(name=name, status=status, owner=owner, limit=limit,
                                         before=before)
        if status is not None and not RunStatus(status).terminal:
            return live  # only finished runs are archived
        archived = await self.archive.list_runs(namespace=self.namespace, name=name,
                                                status=status, owner=owner, limit=limit,
                                                before=before)
        merged = {info.run_id: info for info in archived}
        merged.update((info.run_id, info) for info in live)
        rows = sorted(merged.values(), key=lambda i: (i.created_at, i.run_id), reverse=True)
        return rows[:limit]

    async def ended_infos(
        self, names: Sequence[str], *, after: tuple[float, str] | None, until: float,
        limit: int,
    ) -> list[RunInfo]:
        """The ended runs to fold (Projections) from both stores, merged in (finished_at,
        run_id) order (a run in both is the live one): the archive covers the runs the
        live store let expire. Raises ArchiveUnavailable while Postgres does not answer
        (folding past a run that only the archive holds would skip it)."""
        source = capabilities_of(self.live).projections
        if source is None:
            raise TypeError(f"{self.live!r} keeps no projections")
        live = await source.ended_infos(names, after=after, until=until, limit=limit)
        archived = await self._archived_infos(names, after=after, until=until, limit=limit)
        merged = {info.run_id: info for info in archived}
        merged.update((info.run_id, info) for info in live)
        return sorted(merged.values(), key=_ended_order)[:limit]

    async def _archived_infos(
        self, names: Sequence[str], *, after: tuple[float, str] | None, until: float,
        limit: int,
    ) -> list[RunInfo]:
        """The archive's ended runs, their end times as the live store orders them (a
        Valkey store's index holds them to within a microsecond: ``ended_time``), so one
        checkpoint serves both stores."""
        ordered: Callable[[float], float] = getattr(self.live, "ended_time", float)
        wider = None if after is None else (after[0] - ENDED_SLACK_S, "")
        found = await self.archive.ended_infos(self.namespace, names, after=wider,
                                               until=until + ENDED_SLACK_S,
                                               limit=limit + ENDED_SLACK_ROWS)
        infos = [replace(i, finished_at=ordered(i.finished_at or 0.0)) for i in found]
        return [i for i in infos if (after is None or _ended_order(i) > after)
                and (i.finished_at or 0.0) <= until]

    async def wait_result(self, run_id: str, timeout: float | None) -> RunInfo:
        try:
            return await self.live.wait_result(run_id, timeout)
        except WorkflowNotFound as exc:
            return await self._archived_or_raise(run_id, exc)

    async def wait_outcome(self, run_id: str, timeout: float | None) -> RunOutcome:
        """The live store's outcome read (its ``wait_result`` where it has none), then the
        archive's record, as ``wait_result``."""
        live = self._live_outcomes
        try:
            if live is not None:
                return await live.wait_outcome(run_id, timeout)
            return RunOutcome.of(await self.live.wait_result(run_id, timeout))
        except WorkflowNotFound as exc:
            return RunOutcome.of(await self._archived_or_raise(run_id, exc))

    async def read_outcomes(self, run_ids: Sequence[str]) -> list[RunOutcome | None]:
        """The live store's (None for a run only the archive holds: it is waited for, and
        found there, the usual way)."""
        live = self._live_outcomes
        if live is None:
            return [None] * len(run_ids)
        return await live.read_outcomes(run_ids)

    async def fail_stranded(
        self, name: str, *, older_than: float, now: float, limit: int, error: dict[str, Any]
    ) -> list[str]:
        failed = await self.live.fail_stranded(name, older_than=older_than, now=now,
                                               limit=limit, error=error)
        await self.archiver.archive_now(failed)
        return failed

    # --- lifecycle ------------------------------------------------------------------

    async def aclose(self) -> None:
        try:
            await self.live.aclose()
        finally:
            await self.archive.aclose()

    def close(self) -> None:
        try:
            self.live.close()
        finally:
            self.archive.close()

    def __repr__(self) -> str:
        return f"ArchivingStore(live={self.live!r}, archive={self.archive!r})"


#: How far an end time as the live store orders it may lie from the archived one, and
#: how many more archived rows are read to cover the runs within that slack.
ENDED_SLACK_S = 1e-5
ENDED_SLACK_ROWS = 16


def _ended_order(info: RunInfo) -> tuple[float, str]:
    return (info.finished_at or 0.0, info.run_id)


def make_archiving_postgres(
    dsn: str | None = None,
    valkey_url: str | None = None,
    *,
    live_ttl_after_archive: float = 300,
    schema: str = "pyrula",
    **valkey_options: Any,
) -> ArchivingStore:
    """A ValkeyStore archived to Postgres: ``dsn`` defaults to ``$PYRULA_POSTGRES_DSN``,
    ``valkey_url`` to ``$PYRULA_STORE_URL`` (then ``redis://localhost:6379``);
    ``valkey_options`` go to ValkeyStore (namespace, shard_count, completed_ttl, ...)."""
    from pyrula.workflows.stores.valkey import ValkeyStore

    url = valkey_url or os.environ.get("PYRULA_STORE_URL", "").strip() or "redis://localhost:6379"
    archive = PostgresArchive(dsn=dsn, schema=schema)
    return ArchivingStore(live=ValkeyStore(url=url, **valkey_options), archive=archive,
                          live_ttl_after_archive=live_ttl_after_archive)


def archived_if_configured(store: Store, dsn: str | None = None) -> Store:
    """``store`` wrapped in an ArchivingStore when a DSN is given or PYRULA_POSTGRES_DSN is
    set (the CLI and fleet children open their store through this); else ``store``.
    ``PYRULA_ARCHIVE_RECONCILE_GRACE`` (seconds, default 30) sets its ``reconcile_grace``."""
    dsn = dsn or os.environ.get(ARCHIVE_DSN_ENV, "").strip() or None
    if dsn is None or isinstance(store, ArchivingStore):
        return store
    grace = env_value(GRACE_ENV)
    return ArchivingStore(live=store, archive=PostgresArchive(dsn=dsn),
                          reconcile_grace=30.0 if grace is None
                          else parse_float(GRACE_ENV, grace))
