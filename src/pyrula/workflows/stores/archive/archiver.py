"""The archiving mechanism behind ArchivingStore: runs archived as they end (group commit),
and the reconcile pass that archives whatever that missed.

Nothing finished is left unarchived: the live store's own index of ended runs (on Valkey,
each shard's ``expiry`` zset; it holds an ended run for ``completed_ttl``) read from a
cursor kept in the archive is the to-archive queue. ``reconcile`` (run by every worker
every ``reconcile_interval``; one worker at a time per namespace, under a Postgres advisory
lock) walks it from the cursor: runs ended more than ``reconcile_grace`` seconds ago that
the archive lacks are archived, and the cursor moves on only past runs that are. So a run
whose archiving failed (Postgres down) or never happened (its worker died right after the
terminal write, or a plain ValkeyStore client cancelled it) is archived by the next pass
after Postgres answers.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyrula.errors import ArchiveSchemaMismatch, JournalCorrupt, WorkflowNotFound
from pyrula.workflows.events import Event
from pyrula.workflows.records import RunInfo
from pyrula.workflows.stores.archive.pool import ArchiveError, ArchiveUnavailable
from pyrula.workflows.stores.archive.postgres import PostgresArchive
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.capabilities import capabilities_of

logger = logging.getLogger(__name__)

#: At most this many runs, or this many events, per archive statement (whichever first).
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


class Archiver:
    """Copies the finished runs of ``live`` (one namespace) to ``archive``; see the module
    docstring. Safe to share between event loops and threads."""

    def __init__(self, live: Store, archive: PostgresArchive, *, namespace: str,
                 live_ttl_after_archive: float, reconcile_grace: float,
                 reconcile_batch: int) -> None:
        self.live = live
        caps = capabilities_of(live)
        self._source, self._finished = caps.archive_source, caps.finished_reader
        self.archive = archive
        self.namespace = namespace
        self.live_ttl_after_archive = live_ttl_after_archive
        self.reconcile_grace = reconcile_grace
        self.reconcile_batch = reconcile_batch
        self._down_until = 0.0
        self._backoff = 0.0
        self._outage: str | None = None
        self._no_source_logged = False
        #: The archive's lag, as this process knows it: whether it last led the reconcile,
        #: and when the oldest ended run that may not be archived yet ended (None: none).
        self._leading = False
        self._behind_since: float | None = None
        self._groups_lock = threading.Lock()
        self._groups: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Group] = (
            weakref.WeakKeyDictionary()
        )

    def failed(self, exc: BaseException) -> float:
        """Note an archive outage: log it once, back inline archiving off; the delay."""
        self._backoff = min(BACKOFF_MAX_S, max(BACKOFF_MIN_S, self._backoff * 2))
        self._down_until = time.monotonic() + self._backoff
        if self._behind_since is None:
            self._behind_since = time.time() - self.reconcile_grace
        if self._outage is None:
            self._outage = str(exc)
            logger.warning(
                "archive_unavailable: %s; finished runs stay in the live store and are "
                "archived by the reconcile loop once it answers", exc,
                extra={"event": "archive_unavailable", "namespace": self.namespace},
            )
        return self._backoff

    def ok(self) -> None:
        """Note that the archive answered: inline archiving resumes at once."""
        self._backoff = 0.0
        self._down_until = 0.0
        if self._outage is not None:
            self._outage = None
            logger.info("archive_recovered: the Postgres archive answers again",
                        extra={"event": "archive_recovered", "namespace": self.namespace})

    async def _read_live(
        self, run_ids: Sequence[str]
    ) -> tuple[dict[str, tuple[RunInfo, list[Event]]], set[str]]:
        """The ended runs among ``run_ids`` with their whole journals (others left out),
        and the ids of those whose journal is corrupt: they are refused (logged
        ``archive_failed``), since what the archive keeps must read back as events."""
        reader = self._finished
        out: dict[str, tuple[RunInfo, list[Event]]] = {}
        refused: set[str] = set()
        if reader is not None:
            try:
                return dict(await reader.read_finished(run_ids)), refused
            except JournalCorrupt:
                pass  # one run's journal is not readable: read the batch one run at a time
            for run_id in run_ids:
                try:
                    out.update(await reader.read_finished([run_id]))
                except JournalCorrupt as exc:
                    self._refuse(exc)
                    refused.add(run_id)
            return out, refused
        for run_id in run_ids:
            info = await self.live.get_run(run_id)
            if info is None or not info.status.terminal:
                continue
            try:
                out[run_id] = (info, await self.live.read_events(run_id))
            except WorkflowNotFound:
                continue
            except JournalCorrupt as exc:
                self._refuse(exc)
                refused.add(run_id)
        return out, refused

    def _refuse(self, exc: JournalCorrupt) -> None:
        logger.error("archive_failed: run %s is not archived: %s", exc.run_id, exc,
                     extra={"event": "archive_failed", "run_id": exc.run_id})

    async def _expire(self, run_ids: Sequence[str]) -> None:
        if self._source is not None and run_ids:
            await self._source.expire_finished(run_ids, self.live_ttl_after_archive)

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

    async def archive_now(self, run_ids: Sequence[str]) -> None:
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
            records, _ = await self._read_live(run_ids)
            if not records:
                return
            archived = await self._upsert(records)
        except asyncio.CancelledError:
            raise
        except (ArchiveUnavailable, ArchiveSchemaMismatch) as exc:
            self.failed(exc)
            return
        except Exception as exc:  # the live read failed: the reconcile loop will retry
            logger.warning("archive_deferred: %d runs (e.g. %s) left to the reconcile loop: %s",
                           len(run_ids), run_ids[0], exc, extra={"event": "archive_deferred"})
            return
        self.ok()
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
        source = self._source
        if source is None:
            if not self._no_source_logged:
                self._no_source_logged = True
                logger.warning(
                    "archive_reconcile_unsupported: %r cannot list its ended runs; only runs "
                    "archived as they end are archived", self.live,
                    extra={"event": "archive_reconcile_unsupported"},
                )
            return ReconcileReport(leader=False)
        now = time.time() if now is None else now
        until = now - self.reconcile_grace
        scanned = archived = lost = failed = 0
        caught_up = False
        async with self.archive.leader(self.namespace) as leading:
            if not leading:
                self._leading = False
                self.ok()  # it answered: inline archiving may resume
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
                    done, gone, refused = await self._archive_missing(missing)
                    archived, lost, failed = archived + done, lost + gone, failed + refused
                # Also the runs archived before: their process may have died before this.
                await self._expire(ids)
                cursor = batch[-1]
                await self.archive.set_cursor(self.namespace, cursor)
                if len(batch) < self.reconcile_batch:
                    caught_up = True
                    break
        self._leading = True
        self._behind_since = None if caught_up else (cursor[0] if cursor else until)
        self.ok()
        return ReconcileReport(True, scanned, archived, lost, failed, caught_up, cursor)

    async def _archive_missing(self, missing: list[str]) -> tuple[int, int, int]:
        """Archive the ended runs ``missing`` from the archive: how many were archived,
        lost (expired from the live store first: logged) and failed."""
        records, refused = await self._read_live(missing)
        gone = [run_id for run_id in missing if run_id not in records and run_id not in refused]
        if gone:
            logger.error(
                "archive_lost: %d ended runs expired from the live store before they were "
                "archived (e.g. %s); raise completed_ttl if Postgres outages last longer",
                len(gone), gone[0], extra={"event": "archive_lost", "namespace": self.namespace},
            )
        done = await self._upsert(records)
        return len(done), len(gone), len(refused) + len(records) - len(done)

    def lag(self, now: float) -> float | None:
        """How long ago the oldest ended run that may not be archived yet ended: 0 once the
        reconcile caught up, growing through an outage; None where this process does not
        know (another process leads the reconcile and the archive answers)."""
        if self._behind_since is None:
            return 0.0 if self._leading or self._outage is not None else None
        return max(0.0, now - self._behind_since)

    async def tick(self, *, worker_id: str, now: float) -> float | None:
        """The worker's reconcile loop. A Postgres outage (or another error of the archive's
        database) is logged and retried with back-off; it does not fail the loop, since live
        work goes on. A schema mismatch is raised (fatal), and so is a live store outage
        (for the loop's own back-off)."""
        try:
            report = await self.reconcile(now=now)
        except ArchiveUnavailable as exc:
            return self.failed(exc)
        except ArchiveError as exc:  # the database refused a statement: retried likewise
            logger.error("archive_reconcile_failed: %s", exc,
                         extra={"event": "archive_reconcile_failed", "worker_id": worker_id})
            return self.failed(exc)
        if report.archived or report.lost or report.failed:
            logger.info(
                "archive_reconciled: %d runs archived, %d lost, %d refused", report.archived,
                report.lost, report.failed,
                extra={"event": "archive_reconciled", "worker_id": worker_id},
            )
        return None if report.caught_up else 0.0
