"""SQLiteStore: one file on one host, shared safely by several processes.

WAL mode; every state change is atomic under SQLite's write lock (``BEGIN IMMEDIATE``),
so claims are atomic across processes and no run is claimed twice. Each store object
holds one connection per process, used from one private thread (``thread``), so async
callers never wait for the file lock on their event loop. The async calls queued on that
thread together run in one transaction, each in its own savepoint (a group commit): each
call is still all or nothing and fenced inside the transaction, and none returns before
the transaction has committed. Short calls (a run's state change, a small claim, a read
of one run) made in one turn of an event loop run the same way on the loop itself, right
after that turn, when the write lock is free at once (``calls``): no thread hop; a lock
held elsewhere sends them to the thread. The semantics are those of MemoryStore, checked
by the same conformance suite.

The modules, one concern each: ``schema`` (tables, migration), ``connection`` (the
connection, transactions, SQLite's failures as StoreUnavailable), ``thread`` and
``checkpoint`` (the store's threads), ``calls`` (where a call runs), ``rows`` (row
helpers), ``queue``, ``attempts``, ``reads``, ``control``, ``membership``, ``flow`` and
``schedules`` (the protocol's operations), ``store`` (SQLiteStore, which joins them).
"""

from __future__ import annotations

import logging

from pyrula.workflows.stores.sqlite.store import SQLiteStore

logger = logging.getLogger(__name__)

__all__ = ["SQLiteStore"]
