"""ArchivingStore: a live store (Valkey) whose finished runs are copied to Postgres.

Every Store call goes to the live store. When a call ends a run (``finish``, a
quarantining or cancelling ``requeue``/``reclaim``, ``cancel``, ``fail_stranded``), the
same process archives the run right after: it reads the run and its whole journal from
the live store, upserts them into the archive in one transaction, then shortens the live
copy's TTL to ``live_ttl_after_archive``. Reads fall back to the archive once the live
copy is gone.

Nothing finished is left unarchived: the live store's own index of ended runs (on Valkey,
each shard's ``expiry`` zset; it holds an ended run for ``completed_ttl``) read from a
cursor kept in the archive is the to-archive queue. ``reconcile_tick`` (run by every
worker every ``reconcile_interval``; one worker at a time per namespace, under a Postgres
advisory lock) walks it from the cursor: runs ended more than ``reconcile_grace`` seconds
ago that the archive lacks are archived, and the cursor moves on only past runs that
are. So a run whose archiving failed (Postgres down) or never happened (its worker died
right after the terminal write, or a plain ValkeyStore client cancelled it) is archived
by the next tick after Postgres answers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from pyrula.errors import (
    ArchiveSchemaMismatch,
    ConfigurationError,
    RunNotActive,
    WorkflowNotFound,
)
from pyrula.workflows.events import Event
from pyrula.workflows.records import (
    AppendResult,
    ClaimedRun,
    FinishResult,
    FlowControl,
    ParkResult,
    PoisonPolicy,
    RenewResult,
    RequeueOutcome,
    RunHandle,
    RunInfo,
    RunStatus,
)
from pyrula.workflows.stores.archive.postgres import (
    ArchiveError,
    ArchiveUnavailable,
    PostgresArchive,
)
from pyrula.workflows.stores.base import ArchiveSource, Store

logger = logging.getLogger("pyrula.workflows.archive")

#: Runs per archive transaction and events per archive transaction (whichever first).
CHUNK_RUNS = 100
CHUNK_EVENTS = 5000
#: Inline archiving is skipped for this long after a failure, doubling up to the cap
#: (the reconcile loop archives what was skipped).
BACKOFF_MIN_S = 1.0
BACKOFF_MAX_S = 30.0


@dataclass(slots=True)
class _Group:
    """One event loop's inline archiving: the runs waiting, and the lock of the batch in
    flight."""

    lock: asyncio.Lock
    pending: list[tuple[str, asyncio.Future[None]]]


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    """What one ``reconcile()`` did: ``leader`` False means another process held the
    namespace's reconcile lock and nothing was done."""

    leader: bool
    scanned: int = 0
    archived: int = 0
    lost: int = 0
    failed: int = 0
    caught_up: bool = True
    cursor: tuple[float, str] | None = None


class ArchivingStore:
    """``ArchivingStore(live=ValkeyStore(...), archive=PostgresArchive(dsn=...),
    live_ttl_after_archive=300)``.

    Implements the whole Store protocol by delegating to ``live``; attributes it does not
    define (shard leases, the doorbell, ``shard_count``...) are the live store's.
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
        self.live = live
        self.archive = archive
        self.live_ttl_after_archive = float(live_ttl_after_archive)
        self.reconcile_grace = float(reconcile_grace)
        self.reconcile_batch = reconcile_batch
        self.namespace = str(namespace or getattr(live, "namespace", None) or "default")
        self._down_until = 0.0
        self._backoff = 0.0
        self._outage: str | None = None
        self._no_source_logged = False
        self._groups_lock = threading.Lock()
        self._groups: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Group] = (
            weakref.WeakKeyDictionary()
        )

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes this class lacks: the live store's extras.
        if name in ("live", "archive") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.live, name)

    # --- archiving --------------------------------------------------------------------

    def _archive_failed(self, exc: BaseException) -> float:
        """Note an archive outage: log it once, back inline archiving off; the delay."""
        self._backoff = min(BACKOFF_MAX_S, max(BACKOFF_MIN_S, self._backoff * 2))
        self._down_until = time.monotonic() + self._backoff
        if self._outage is None:
            self._outage = str(exc)
            logger.warning(
                "archive_unavailable: %s; finished runs stay in the live store and are "
                "archived by the reconcile loop once it answers", exc,
                extra={"event": "archive_unavailable", "namespace": self.namespace},
            )
        return self._backoff

    def _archive_ok(self) -> None:
        self._backoff = 0.0
        self._down_until = 0.0
        if self._outage is not None:
            self._outage = None
            logger.info("archive_recovered: the Postgres archive answers again",
                        extra={"event": "archive_recovered", "namespace": self.namespace})

    async def _read_live(self, run_ids: Sequence[str]) -> dict[str, tuple[RunInfo, list[Event]]]:
        """The ended runs among ``run_ids`` with their whole journals (others left out)."""
        reader = getattr(self.live, "read_finished", None)
        if reader is not None:
            return cast(dict[str, tuple[RunInfo, list[Event]]], await reader(run_ids))
        out: dict[str, tuple[RunInfo, list[Event]]] = {}
        for run_id in run_ids:
            info = await self.live.get_run(run_id)
            if info is None or not info.status.terminal:
                continue
            try:
                out[run_id] = (info, await self.live.read_events(run_id))
            except WorkflowNotFound:
                continue
        return out

    async def _expire(self, run_ids: Sequence[str]) -> None:
        expire = getattr(self.live, "expire_finished", None)
        if expire is not None and run_ids:
            await expire(run_ids, self.live_ttl_after_archive)

    async def _upsert(self, records: Mapping[str, tuple[RunInfo, list[Event]]]) -> list[str]:
        """Archive ``records`` in chunks; a run the archive refuses for a reason other than
        an outage is logged (``archive_failed``) and left out. Returns the archived ids."""
        chunks: list[list[tuple[RunInfo, list[Event]]]] = [[]]
        events = 0
        for info, journal in records.values():
            chunk = chunks[-1]
            if chunk and (len(chunk) >= CHUNK_RUNS or events + len(journal) > CHUNK_EVENTS):
                chunks.append([])
                events = 0
            chunks[-1].append((info, journal))
            events += len(journal)
        done: list[str] = []
        for chunk in chunks:
            if await self._write(chunk):
                done.extend(info.run_id for info, _ in chunk)
            elif len(chunk) > 1:  # find the run the archive refuses: one at a time
                for record in chunk:
                    if await self._write([record]):
                        done.append(record[0].run_id)
        return done

    async def _write(self, chunk: Sequence[tuple[RunInfo, list[Event]]]) -> bool:
        """Upsert one chunk; False if the archive refused it (logged for a single run)."""
        if not chunk:
            return True
        try:
            await self.archive.upsert_runs(self.namespace, chunk)
            return True
        except (ArchiveUnavailable, ArchiveSchemaMismatch):
            raise
        except Exception:
            if len(chunk) == 1:
                run_id = chunk[0][0].run_id
                logger.exception("archive_failed: the archive refused run %s; it is skipped",
                                 run_id, extra={"event": "archive_failed", "run_id": run_id})
            return False

    def _group(self) -> _Group:
        loop = asyncio.get_running_loop()
        with self._groups_lock:
            group = self._groups.get(loop)
            if group is None:
                group = self._groups[loop] = _Group(asyncio.Lock(), [])
            return group

    async def _archive_now(self, run_ids: Sequence[str]) -> None:
        """Archive runs this process just ended, best effort: what fails here (Postgres
        down) is archived later by ``reconcile_tick``. Never raises but CancelledError.

        Group commit: while one caller archives a batch, the runs that end meanwhile queue
        up, and the next caller archives all of them at once (one live read, one Postgres
        statement, one expiry per shard), so the cost per run falls as the load rises."""
        if not run_ids or time.monotonic() < self._down_until:
            return
        group = self._group()
        if self._backoff and group.lock.locked():
            return  # the archive failed lately and a batch is probing it: do not queue up
        loop = asyncio.get_running_loop()
        mine = [loop.create_future() for _ in run_ids]
        group.pending.extend(zip(run_ids, mine, strict=True))
        async with group.lock:
            while not all(f.done() for f in mine):
                batch, group.pending = group.pending[:CHUNK_RUNS], group.pending[CHUNK_RUNS:]
                try:
                    if time.monotonic() >= self._down_until:
                        await self._archive_batch([run_id for run_id, _ in batch])
                finally:
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_result(None)

    async def _archive_batch(self, run_ids: Sequence[str]) -> None:
        try:
            records = await self._read_live(run_ids)
            if not records:
                return
            archived = await self._upsert(records)
        except asyncio.CancelledError:
            raise
        except (ArchiveUnavailable, ArchiveSchemaMismatch) as exc:
            self._archive_failed(exc)
            return
        except Exception as exc:  # the live read failed: the reconcile loop will retry
            logger.warning("archive_deferred: %d runs (e.g. %s) left to the reconcile loop: %s",
                           len(run_ids), run_ids[0], exc, extra={"event": "archive_deferred"})
            return
        self._archive_ok()
        try:
            await self._expire(archived)
        except asyncio.CancelledError:
            raise
        except Exception:  # the live copy keeps completed_ttl; reconcile expires it later
            logger.debug("expire_finished failed", exc_info=True)

    async def reconcile(self, *, now: float | None = None, max_batches: int = 20
                        ) -> ReconcileReport:
        """Archive every run that ended up to ``now - reconcile_grace`` and is not archived
        yet, from the cursor on (at most ``max_batches`` batches). Raises ArchiveUnavailable
        if Postgres does not answer (the cursor stays where it was)."""
        if getattr(self.live, "ended_runs", None) is None:
            if not self._no_source_logged:
                self._no_source_logged = True
                logger.warning(
                    "archive_reconcile_unsupported: %r cannot list its ended runs; only runs "
                    "archived as they end are archived", self.live,
                    extra={"event": "archive_reconcile_unsupported"},
                )
            return ReconcileReport(leader=False)
        source = cast(ArchiveSource, self.live)
        now = time.time() if now is None else now
        until = now - self.reconcile_grace
        scanned = archived = lost = failed = 0
        caught_up = False
        async with self.archive.leader(self.namespace) as leading:
            if not leading:
                self._archive_ok()  # it answered: inline archiving may resume
                return ReconcileReport(leader=False)
            cursor = await self.archive.cursor(self.namespace)
            for _ in range(max_batches):
                batch = await source.ended_runs(after=cursor, until=until,
                                                limit=self.reconcile_batch)
                if not batch:
                    caught_up = True
                    break
                ids = [run_id for _, run_id in batch]
                scanned += len(ids)
                have = await self.archive.archived(self.namespace, ids)
                missing = [run_id for run_id in ids if run_id not in have]
                if missing:
                    records = await self._read_live(missing)
                    gone = [run_id for run_id in missing if run_id not in records]
                    if gone:
                        lost += len(gone)
                        logger.error(
                            "archive_lost: %d ended runs expired from the live store before "
                            "they were archived (e.g. %s); raise completed_ttl if Postgres "
                            "outages last longer", len(gone), gone[0],
                            extra={"event": "archive_lost", "namespace": self.namespace},
                        )
                    done = await self._upsert(records)
                    archived += len(done)
                    failed += len(records) - len(done)
                # Also the runs archived before: their process may have died before this.
                await self._expire(ids)
                cursor = batch[-1]
                await self.archive.set_cursor(self.namespace, cursor)
                if len(batch) < self.reconcile_batch:
                    caught_up = True
                    break
        self._archive_ok()
        return ReconcileReport(True, scanned, archived, lost, failed, caught_up, cursor)

    async def reconcile_tick(
        self, *, worker_id: str, names: Sequence[str], now: float, options: Any = None
    ) -> float | None:
        """The worker's reconcile loop. A Postgres outage (or another error of the archive's
        database) is logged and retried with back-off; it does not fail the loop, since live
        work goes on. A schema mismatch is raised (fatal), and so is a live store outage
        (for the loop's own back-off)."""
        try:
            report = await self.reconcile(now=now)
        except ArchiveUnavailable as exc:
            return self._archive_failed(exc)
        except ArchiveError as exc:  # the database refused a statement: retried likewise
            logger.error("archive_reconcile_failed: %s", exc,
                         extra={"event": "archive_reconcile_failed", "worker_id": worker_id})
            return self._archive_failed(exc)
        if report.archived or report.lost or report.failed:
            logger.info(
                "archive_reconciled: %d runs archived, %d lost, %d refused", report.archived,
                report.lost, report.failed,
                extra={"event": "archive_reconciled", "worker_id": worker_id},
            )
        return None if report.caught_up else 0.0

    async def prepare(self, names: Sequence[str]) -> None:
        """The worker's startup checks: the live store's, then the archive schema
        (ArchiveSchemaMismatch). An archive that does not answer yet is checked on its
        first use instead: a Postgres outage does not keep workers from starting."""
        prepare = getattr(self.live, "prepare", None)
        if prepare is not None:
            await prepare(names)
        try:
            await self.archive.check()
        except ArchiveUnavailable as exc:
            self._archive_failed(exc)

    # --- submit and the attempt's writes ----------------------------------------------

    async def submit(
        self,
        name: str,
        params: Any,
        *,
        now: float,
        owner: str | None = None,
        idempotency_key: str | None = None,
    ) -> tuple[RunHandle, bool]:
        return await self.live.submit(name, params, now=now, owner=owner,
                                      idempotency_key=idempotency_key)

    async def append(
        self, run_id: str, token: int, events: Sequence[Event], *, now: float, lock_ttl: float
    ) -> AppendResult:
        return await self.live.append(run_id, token, events, now=now, lock_ttl=lock_ttl)

    async def park(
        self,
        run_id: str,
        token: int,
        events: Sequence[Event],
        *,
        now: float,
        wake_at: float | None,
        signals: Sequence[str],
        known_seq: int,
        interrupt: Any = None,
    ) -> ParkResult:
        return await self.live.park(run_id, token, events, now=now, wake_at=wake_at,
                                    signals=signals, known_seq=known_seq, interrupt=interrupt)

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
        await self._archive_now([run_id])
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
        await self._archive_now([run_id])
        return outcome

    # --- work queue -----------------------------------------------------------------

    async def claim(
        self,
        worker_id: str,
        names: Sequence[str],
        *,
        limit: int,
        now: float,
        lock_ttl: float,
    ) -> list[ClaimedRun]:
        return await self.live.claim(worker_id, names, limit=limit, now=now, lock_ttl=lock_ttl)

    async def claim_run(
        self, run_id: str, worker_id: str, *, now: float, lock_ttl: float
    ) -> ClaimedRun | None:
        return await self.live.claim_run(run_id, worker_id, now=now, lock_ttl=lock_ttl)

    async def renew(
        self, worker_id: str, held: Mapping[str, int], *, now: float, lock_ttl: float
    ) -> RenewResult:
        return await self.live.renew(worker_id, held, now=now, lock_ttl=lock_ttl)

    async def wake_due(self, *, now: float, limit: int) -> int:
        return await self.live.wake_due(now=now, limit=limit)

    async def reclaim(
        self,
        names: Sequence[str] | None,
        *,
        now: float,
        limit: int,
        poison: PoisonPolicy,
    ) -> list[RequeueOutcome]:
        outcomes = await self.live.reclaim(names, now=now, limit=limit, poison=poison)
        await self._archive_now([o.run_id for o in outcomes])
        return outcomes

    def recover_pending_runs(self, name: str) -> int:
        # Runs this quarantines are archived by the next reconcile tick.
        return self.live.recover_pending_runs(name)

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
            await self._archive_now([run_id])  # skipped if it was running (only requested)
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

    async def wait_result(self, run_id: str, timeout: float | None) -> RunInfo:
        try:
            return await self.live.wait_result(run_id, timeout)
        except WorkflowNotFound as exc:
            return await self._archived_or_raise(run_id, exc)

    # --- membership -----------------------------------------------------------------

    async def register_worker(
        self, worker_id: str, names: Sequence[str], *, now: float, ttl: float
    ) -> None:
        await self.live.register_worker(worker_id, names, now=now, ttl=ttl)

    async def unregister_worker(self, worker_id: str) -> None:
        await self.live.unregister_worker(worker_id)

    async def stranded(self, *, now: float) -> list[str]:
        return await self.live.stranded(now=now)

    async def fail_stranded(
        self, name: str, *, older_than: float, now: float, limit: int, error: dict[str, Any]
    ) -> list[str]:
        failed = await self.live.fail_stranded(name, older_than=older_than, now=now,
                                               limit=limit, error=error)
        await self._archive_now(failed)
        return failed

    # --- flow control ---------------------------------------------------------------

    def flow_control_set(
        self,
        owner: str,
        max_concurrent: int | None = None,
        max_starts_per_second: float | None = None,
    ) -> None:
        self.live.flow_control_set(owner, max_concurrent, max_starts_per_second)

    def flow_control_get(self, owner: str) -> FlowControl | None:
        return self.live.flow_control_get(owner)

    def flow_control_delete(self, owner: str) -> bool:
        return self.live.flow_control_delete(owner)

    # --- lifecycle ------------------------------------------------------------------

    async def bind(
        self, project: str | None, environment: str | None
    ) -> tuple[str | None, str | None]:
        return await self.live.bind(project, environment)

    async def aping(self) -> None:
        """The live store's ping: an archive outage does not make a worker unready."""
        await self.live.aping()

    def ping(self) -> None:
        self.live.ping()

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
    set (the CLI and fleet children open their store through this); else ``store``."""
    dsn = dsn or os.environ.get("PYRULA_POSTGRES_DSN", "").strip() or None
    if dsn is None or isinstance(store, ArchivingStore):
        return store
    return ArchivingStore(live=store, archive=PostgresArchive(dsn=dsn))
