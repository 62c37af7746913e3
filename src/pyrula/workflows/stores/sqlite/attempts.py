"""The SQLite store's attempt writes: what the worker holding a run does to it (append,
park, finish, requeue, renew its lock) and putting back the runs of attempts that ended
without a word (reclaim, reclaim_worker, requeue_unheld). Every write is fenced by the
attempt's token inside its transaction."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pyrula.workflows.events import (
    CHILD_SIGNAL,
    INTERRUPT_SIGNAL,
    Event,
    EventType,
    make_event,
    stamp_successor,
)
from pyrula.workflows.records import (
    AppendResult,
    FinishResult,
    ParkResult,
    PoisonPolicy,
    RenewResult,
    RequeueOutcome,
    RunStatus,
)
from pyrula.workflows.stores.common import (
    error_event,
    live_crashes,
    quarantine_error,
    requeued_event,
)
from pyrula.workflows.stores.sqlite.calls import Calls
from pyrula.workflows.stores.sqlite.connection import Database
from pyrula.workflows.stores.sqlite.reads import Wakeups
from pyrula.workflows.stores.sqlite.rows import (
    RUN_COLUMNS,
    append_events,
    end_run,
    enqueue,
    enqueue_suspect,
    fenced_run,
    fenced_update,
    from_json,
    insert_events,
    new_run,
    read_journal,
    to_json,
)

logger = logging.getLogger(__name__)


class Attempts:
    """append, park, finish, requeue, renew, reclaim, reclaim_worker, requeue_unheld."""

    def __init__(self, db: Database, calls: Calls, wakeups: Wakeups) -> None:
        self._db = db
        self._calls = calls
        self._wakeups = wakeups

    async def append(
        self, run_id: str, token: int, events: Sequence[Event], *, now: float, lock_ttl: float
    ) -> AppendResult:
        def op() -> AppendResult:
            with self._db.tx() as conn:
                last, cancel_requested = fenced_update(
                    conn, run_id, token,
                    "journal_len=journal_len+?, updated_at=?, lock_expires=?",
                    (len(events), now, now + lock_ttl), "journal_len, cancel_requested",
                )
                insert_events(conn, run_id, last - len(events), events)
                return AppendResult(last, bool(cancel_requested))

        return await self._calls.call(op, inline=True)

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
        def op() -> ParkResult:
            with self._db.tx() as conn:
                row = fenced_run(conn, run_id, token)
                last = append_events(conn, run_id, row["journal_len"], events, now)
                seen = from_json(row["signal_seq"]) or {}
                arrived = any(int(seen.get(s, 0)) > known_seq for s in signals)
                if row["nudged"]:
                    arrived = arrived or CHILD_SIGNAL in signals
                    conn.execute("UPDATE runs SET nudged=0 WHERE run_id=?", (run_id,))
                if arrived or row["cancel_requested"]:
                    tail = read_journal(conn, run_id, known_seq)
                    return ParkResult(False, last, tail, bool(row["cancel_requested"]))
                conn.execute(
                    # An attempt that parks has completed: no longer a suspect.
                    "UPDATE runs SET status=?, lock_owner=NULL, waiting_for=?, interrupt=?, "
                    "wake_at=?, parked_seq=?, suspect_seq=NULL WHERE run_id=?",
                    (
                        (RunStatus.WAITING if signals else RunStatus.SLEEPING).value,
                        to_json(list(signals)) if signals else None,
                        to_json(interrupt) if INTERRUPT_SIGNAL in signals else None,
                        wake_at,
                        last,
                        run_id,
                    ),
                )
                return ParkResult(True, last)

        return await self._calls.call(op, inline=True)

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
        status = RunStatus(status)

        def op() -> FinishResult:
            with self._db.tx() as conn:
                if status is not RunStatus.CONTINUED:
                    # The fence, the end and the journal length in one statement.
                    (last,) = fenced_update(
                        conn, run_id, token,
                        "status=?, result=?, error=?, lock_owner=NULL, wake_at=NULL, "
                        "waiting_for=NULL, finished_at=?, updated_at=?, queue_seq=NULL, "
                        "suspect_seq=NULL, journal_len=journal_len+?",
                        (status.value, to_json(result), None if error is None else to_json(error),
                         now, now, len(events)),
                        "journal_len",
                    )
                    insert_events(conn, run_id, last - len(events), events)
                    return FinishResult(last, None)
                row = fenced_run(conn, run_id, token)
                batch = [dict(e) for e in events]
                successor_id = new_run(
                    conn, row["name"], successor_params, row["owner"], now, None,
                    row["start_id"], predecessor=run_id, priority=row["priority"],
                )
                conn.execute(
                    "UPDATE runs SET successor_id=? WHERE run_id=?", (successor_id, run_id)
                )
                stamp_successor(batch, successor_id)
                last = append_events(conn, run_id, row["journal_len"], batch, now)
                end_run(conn, run_id, status, now, result, error)
                return FinishResult(last, successor_id)

        finished = await self._calls.call(op, inline=True)
        self._wakeups.notify(run_id)
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
        def op() -> RequeueOutcome:
            with self._db.tx() as conn:
                row = fenced_run(conn, run_id, token)
                length = append_events(conn, run_id, row["journal_len"], events, now)
                return _requeue(conn, row, length, now, reason, crash, poison, crash_detail)

        outcome = await self._calls.call(op, inline=True)
        self._wakeups.notify(run_id)
        return outcome

    async def renew(
        self, worker_id: str, held: Mapping[str, int], *, now: float, lock_ttl: float
    ) -> RenewResult:
        def op() -> RenewResult:
            lost: set[str] = set()
            cancel: set[str] = set()
            with self._db.tx() as conn:
                for run_id, token in held.items():
                    row = conn.execute(
                        "SELECT status, attempt, cancel_requested FROM runs WHERE run_id=?",
                        (run_id,),
                    ).fetchone()
                    if row is None or row[0] != RunStatus.RUNNING or row[1] != token:
                        lost.add(run_id)
                        continue
                    conn.execute(
                        "UPDATE runs SET lock_expires=? WHERE run_id=?", (now + lock_ttl, run_id)
                    )
                    if row[2]:
                        cancel.add(run_id)
            return RenewResult(frozenset(lost), frozenset(cancel))

        if not held:
            return RenewResult()
        return await self._calls.call(op, inline=True)

    async def reclaim(
        self,
        names: Sequence[str] | None,
        *,
        now: float,
        limit: int,
        poison: PoisonPolicy,
    ) -> list[RequeueOutcome]:
        def op() -> list[RequeueOutcome]:
            with self._db.tx() as conn:
                sql = (
                    f"SELECT {RUN_COLUMNS} FROM runs WHERE status='running' "
                    "AND lock_expires<=?"
                )
                args: list[Any] = [now]
                if names is not None:
                    if not names:
                        return []
                    sql += f" AND name IN ({','.join('?' * len(names))})"
                    args.extend(names)
                sql += " ORDER BY lock_expires LIMIT ?"
                args.append(limit)
                out = []
                for row in conn.execute(sql, args).fetchall():
                    detail = {"cause": "worker_crash", "worker": row["lock_owner"],
                              "attempt": row["attempt"]}
                    out.append(_requeue(conn, row, row["journal_len"], now, "orphaned", True,
                                        poison, detail))
                return out

        return self._notified(await self._calls.call(op))

    async def reclaim_worker(
        self,
        worker_id: str,
        *,
        now: float,
        poison: PoisonPolicy,
        crash_detail: Mapping[str, Any] | None = None,
        charge: Collection[str] | None = None,
    ) -> list[RequeueOutcome]:
        charged = None if charge is None else set(charge)

        def op() -> list[RequeueOutcome]:
            with self._db.tx() as conn:
                out = []
                for row in _held_by(conn, worker_id):
                    crash = charged is None or row["run_id"] in charged
                    detail = {"cause": "worker_crash", "worker": worker_id,
                              "attempt": row["attempt"], **dict(crash_detail or {})}
                    out.append(_requeue(conn, row, row["journal_len"], now, "orphaned",
                                        crash, poison, detail))
                return out

        return self._notified(await self._calls.call(op))

    async def requeue_unheld(
        self, worker_id: str, held: Collection[str], *, now: float
    ) -> list[RequeueOutcome]:
        keep = set(held)

        def op() -> list[RequeueOutcome]:
            with self._db.tx() as conn:
                return [
                    _requeue(conn, row, row["journal_len"], now, "store_unavailable",
                             False, None, None)
                    for row in _held_by(conn, worker_id) if row["run_id"] not in keep
                ]

        return self._notified(await self._calls.call(op))

    def _notified(self, outcomes: list[RequeueOutcome]) -> list[RequeueOutcome]:
        """Wake this process's waiters on ``outcomes``' runs (some may have ended)."""
        for outcome in outcomes:
            self._wakeups.notify(outcome.run_id)
        return outcomes


def _held_by(conn: sqlite3.Connection, worker_id: str) -> list[sqlite3.Row]:
    held: list[sqlite3.Row] = conn.execute(
        f"SELECT {RUN_COLUMNS} FROM runs WHERE status='running' AND lock_owner=?",
        (worker_id,),
    ).fetchall()
    return held


def _requeue(
    conn: sqlite3.Connection, row: sqlite3.Row, length: int, now: float, reason: str,
    crash: bool, poison: PoisonPolicy | None, crash_detail: Mapping[str, Any] | None,
) -> RequeueOutcome:
    """Put the run of ``row`` back in its queue, or end it: quarantined (FAILED) once a
    crash brings it past the poison policy's retries, CANCELLED if a cancel is pending. A
    run charged a crash, or a suspect already, is queued apart (``enqueue_suspect``)."""
    run_id = row["run_id"]
    counted = None
    if crash:
        policy = poison or PoisonPolicy()
        crashes = live_crashes(from_json(row["crashes"]) or [], now, policy.retry_ttl_s) + [now]
        conn.execute("UPDATE runs SET crashes=? WHERE run_id=?", (to_json(crashes), run_id))
        counted = len(crashes)
        if counted > policy.max_retries:
            error = quarantine_error(counted, crash_detail)
            append_events(conn, run_id, length, [error_event(now, error)], now)
            end_run(conn, run_id, RunStatus.FAILED, now, error=error)
            return RequeueOutcome(run_id, True)
    if row["cancel_requested"]:
        append_events(conn, run_id, length, [make_event(EventType.RUN_CANCELLED, now)], now)
        end_run(conn, run_id, RunStatus.CANCELLED, now)
        return RequeueOutcome(run_id, False)
    append_events(conn, run_id, length, [requeued_event(now, reason, counted, crash_detail)], now)
    if counted is not None or row["suspect_seq"] is not None:
        enqueue_suspect(conn, run_id, now)
    else:
        enqueue(conn, run_id, row["name"], row["owner"], now)
    return RequeueOutcome(run_id, False)
