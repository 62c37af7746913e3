"""The workflow ``pyrula-fleet bench`` runs: ``steps`` journaled steps of ``x + 1``.

``params``: ``x`` (the start value), ``steps`` (how many steps), ``kind`` (``"async"``, the
default: an ``async def`` step on the worker's event loop; ``"sync"``: a ``def`` step on the
worker's thread pool) and, optionally, ``payload``: a string that only rides along in the
params, to measure what their size costs, and ``until``: a Unix time the run first sleeps
until on a durable timer (to measure timers falling due together). The result is
``x + steps``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pyrula.workflows import WorkflowContext, step, workflow


@step(name="pyrula.bench.add_one")
async def add_one(x: int) -> int:
    return x + 1


@step(name="pyrula.bench.add_one_sync")
def add_one_sync(x: int) -> int:
    return x + 1


@workflow(name="pyrula.bench")
async def bench(ctx: WorkflowContext, params: dict[str, Any]) -> int:
    x: int = int(params.get("x", 0))
    if params.get("until") is not None:
        await ctx.sleep_until(datetime.fromtimestamp(float(params["until"]), UTC))
    add = add_one_sync if params.get("kind") == "sync" else add_one
    for _ in range(int(params.get("steps", 1))):
        x = int(await add(x))
    return x
