"""The workflow ``pyrula-fleet bench`` runs: ``steps`` journaled steps of ``x + 1``.

``params``: ``x`` (the start value), ``steps`` (how many steps), ``kind`` (``"async"``, the
default: an ``async def`` step on the worker's event loop; ``"sync"``: a ``def`` step on the
worker's thread pool) and, optionally, ``payload``: a string that only rides along in the
params, to measure what their size costs, and ``until``: a Unix time the run first sleeps
until on a durable timer (to measure timers falling due together). The result is
``x + steps``.

Two more make it the load of ``bench --verify`` and the chaos suite: ``ledger``, a
directory where each step execution records itself in the side-effect ledger
(:mod:`pyrula.invariants`), and ``hold``: seconds each step takes (so faults find steps in
flight).
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from pyrula.workflows import WorkflowContext, step, workflow

_ledgers: dict[str, Any] = {}


def _record(ledger: str, result: int, started: float) -> None:
    book = _ledgers.get(ledger)
    if book is None:
        from pyrula.invariants import Ledger

        book = _ledgers[ledger] = Ledger(ledger)
    book.record(result, started=started)


@step(name="pyrula.bench.add_one")
async def add_one(x: int, ledger: str | None = None, hold: float = 0.0) -> int:
    if ledger is None and not hold:
        return x + 1
    started = time.time()
    if hold:
        await asyncio.sleep(hold)
    if ledger is not None:
        _record(ledger, x + 1, started)
    return x + 1


@step(name="pyrula.bench.add_one_sync")
def add_one_sync(x: int, ledger: str | None = None, hold: float = 0.0) -> int:
    if ledger is None and not hold:
        return x + 1
    started = time.time()
    if hold:
        time.sleep(hold)
    if ledger is not None:
        _record(ledger, x + 1, started)
    return x + 1


@workflow(name="pyrula.bench")
async def bench(ctx: WorkflowContext, params: dict[str, Any]) -> int:
    x: int = int(params.get("x", 0))
    if params.get("until") is not None:
        await ctx.sleep_until(datetime.fromtimestamp(float(params["until"]), UTC))
    add = add_one_sync if params.get("kind") == "sync" else add_one
    ledger, hold = params.get("ledger"), float(params.get("hold") or 0.0)
    for _ in range(int(params.get("steps", 1))):
        x = int(await (add(x) if ledger is None and not hold else add(x, ledger, hold)))
    return x
