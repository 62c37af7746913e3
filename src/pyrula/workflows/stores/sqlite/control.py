"""The SQLite store's run control: what a client does to a run it does not hold (signal
it, cancel it, wake it from its sleep)."""

from __future__ import annotations

import logging
from typing import Any

from pyrula.workflows.errors import RunNotActive
from pyrula.workflows.events import CHILD_SIGNAL, INTERRUPT_SIGNAL, EventType, make_event
from pyrula.workflows.records import RunStatus
from pyrula.workflows.stores.sqlite.calls import Calls
from pyrula.workflows.stores.sqlite.connection import Database
from pyrula.workflows.stores.sqlite.reads import Wakeups
from pyrula.workflows.stores.sqlite.rows import (
    append_events,
    end_run,
    enqueue,
    from_json,
    require_run,
    to_json,
)

logger = logging.getLogger(__name__)


class RunControl:
    """signal, nudge, cancel and wake_run of the store protocol."""

    def __init__(self, db: Database, calls: Calls, wakeups: Wakeups) -> None:
        self._db = db
        self._calls = calls
        self._wakeups = wakeups

    async def signal(self, run_id: str, name: str, payload: Any, *, now: float) -> None:
        def op() -> None:
            with self._db.tx() as conn:
                row = require_run(conn, run_id)
                # The live run of a continue_as_new chain takes over the chain's inbox.
                while row["status"] == RunStatus.CONTINUED and row["successor_id"]:
                    row = require_run(conn, row["successor_id"])
                live, status = row["run_id"], RunStatus(row["status"])
                if status.terminal:
                    raise RunNotActive(f"run {run_id} has already ended ({status.value})")
                type_ = (
                    EventType.INTERRUPT_RESUMED if name == INTERRUPT_SIGNAL
                    else EventType.SIGNAL_RECEIVED
                )
                event = make_event(type_, now, name=name, payload=payload)
                last = append_events(conn, live, row["journal_len"], [event], now)
                seen = from_json(row["signal_seq"]) or {}
                seen[name] = last
                conn.execute("UPDATE runs SET signal_seq=? WHERE run_id=?", (to_json(seen), live))
                waiting = from_json(row["waiting_for"]) or []
                if status is RunStatus.WAITING and name in waiting:
                    enqueue(conn, live, row["name"], row["owner"], now)

        await self._calls.call(op, inline=True)

    async def nudge(self, run_id: str, *, now: float) -> None:
        def op() -> None:
            with self._db.tx() as conn:
                # Marked only while it runs: the fence of its attempt's park reads the mark.
                marked = conn.execute(
                    "UPDATE runs SET nudged=1 WHERE run_id=? AND status='running'", (run_id,)
                ).rowcount
                if marked:
                    return
                row = conn.execute(
                    "SELECT name, owner, waiting_for FROM runs WHERE run_id=? "
                    "AND status='waiting'", (run_id,),
                ).fetchone()
                if row is not None and CHILD_SIGNAL in (from_json(row["waiting_for"]) or []):
                    enqueue(conn, run_id, row["name"], row["owner"], now)

        await self._calls.call(op, inline=True)

    async def cancel(self, run_id: str, *, now: float) -> bool:
        def op() -> bool:
            with self._db.tx() as conn:
                row = require_run(conn, run_id)
                status = RunStatus(row["status"])
                if status.terminal:
                    return False
                if status is RunStatus.RUNNING:
                    conn.execute(
                        "UPDATE runs SET cancel_requested=1, updated_at=? WHERE run_id=?",
                        (now, run_id),
                    )
                    return True
                cancelled = make_event(EventType.RUN_CANCELLED, now)
                append_events(conn, run_id, row["journal_len"], [cancelled], now)
                end_run(conn, run_id, RunStatus.CANCELLED, now)
                return True

        done = await self._calls.call(op, inline=True)
        self._wakeups.notify(run_id)
        return done

    async def wake_run(self, run_id: str, *, now: float) -> bool:
        def op() -> bool:
            with self._db.tx() as conn:
                row = require_run(conn, run_id)
                if row["status"] != RunStatus.SLEEPING:
                    return False
                woken = make_event(EventType.RUN_WOKEN, now, reason="manual")
                append_events(conn, run_id, row["journal_len"], [woken], now)
                enqueue(conn, run_id, row["name"], row["owner"], now)
                return True

        return await self._calls.call(op, inline=True)
