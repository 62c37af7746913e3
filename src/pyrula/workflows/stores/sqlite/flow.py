"""The SQLite store's flow control: each owner's limits (``flow_control`` table), set by
an operator and honoured by every claim (:func:`flow_allows`)."""

from __future__ import annotations

import logging
import sqlite3

from pyrula.workflows.records import FlowControl
from pyrula.workflows.stores.common import TokenBucket, validate_flow_control
from pyrula.workflows.stores.sqlite.calls import Calls
from pyrula.workflows.stores.sqlite.connection import Database

logger = logging.getLogger(__name__)


def flow_allows(conn: sqlite3.Connection, owner: str, now: float) -> bool:
    """May a claim start a run of ``owner`` now? Takes a token of its rate if so."""
    row = conn.execute(
        "SELECT max_concurrent, max_starts_per_second, tokens, stamp FROM flow_control "
        "WHERE owner=?",
        (owner,),
    ).fetchone()
    if row is None:
        return True
    max_concurrent, rate, tokens, stamp = row
    if max_concurrent is not None:
        running = conn.execute(
            "SELECT COUNT(*) FROM runs WHERE owner=? AND status='running'", (owner,)
        ).fetchone()[0]
        if running >= max_concurrent:
            return False
    if rate is not None:
        bucket = TokenBucket(1.0 if tokens is None else tokens, now if stamp is None else stamp)
        allowed = bucket.take(rate, now)
        conn.execute(
            "UPDATE flow_control SET tokens=?, stamp=? WHERE owner=?",
            (bucket.tokens, bucket.stamp, owner),
        )
        return allowed
    return True


class FlowLimits:
    """Setting, reading and dropping an owner's limits."""

    def __init__(self, db: Database, calls: Calls) -> None:
        self._db = db
        self._calls = calls

    async def aflow_control_set(
        self,
        owner: str,
        max_concurrent: int | None = None,
        max_starts_per_second: float | None = None,
    ) -> None:
        validate_flow_control(owner, max_concurrent, max_starts_per_second)

        def op() -> None:
            with self._db.tx() as conn:
                conn.execute(
                    "INSERT INTO flow_control(owner, max_concurrent, max_starts_per_second, "
                    "tokens, stamp) VALUES (?, ?, ?, NULL, NULL) ON CONFLICT(owner) DO UPDATE "
                    "SET max_concurrent=excluded.max_concurrent, "
                    "max_starts_per_second=excluded.max_starts_per_second, tokens=NULL, "
                    "stamp=NULL",
                    (owner, max_concurrent, max_starts_per_second),
                )

        await self._calls.call(op)

    async def aflow_control_get(self, owner: str) -> FlowControl | None:
        row = await self._calls.call(lambda: self._db.read(
            lambda conn: conn.execute(
                "SELECT max_concurrent, max_starts_per_second FROM flow_control WHERE owner=?",
                (owner,),
            ).fetchone()
        ))
        return None if row is None else FlowControl(owner, row[0], row[1])

    async def aflow_control_delete(self, owner: str) -> bool:
        def op() -> bool:
            with self._db.tx() as conn:
                deleted = conn.execute("DELETE FROM flow_control WHERE owner=?", (owner,))
                return deleted.rowcount > 0

        return await self._calls.call(op)
