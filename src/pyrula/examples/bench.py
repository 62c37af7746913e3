"""The workflow ``pyrula-fleet bench`` runs: ``steps`` journaled steps of ``x + 1``."""

from __future__ import annotations

from typing import Any

from pyrula.workflows import WorkflowContext, step, workflow


@step(name="pyrula.bench.add_one")
async def add_one(x: int) -> int:
    return x + 1


@workflow(name="pyrula.bench")
async def bench(ctx: WorkflowContext, params: dict[str, Any]) -> int:
    x: int = int(params.get("x", 0))
    for _ in range(int(params.get("steps", 1))):
        x = await add_one(x)
    return x
