"""The workflows the benchmarks run: one step (x + 1) and five steps."""

from __future__ import annotations

from typing import Any

from pyrula.workflows import WorkflowContext, step, workflow


@step
async def add_one(x: int) -> int:
    return x + 1


@workflow(name="bench_1step")
async def bench_1step(ctx: WorkflowContext, params: dict[str, Any]) -> int:
    result: int = await add_one(params["x"])
    return result


@workflow(name="bench_5step")
async def bench_5step(ctx: WorkflowContext, params: dict[str, Any]) -> int:
    x: int = params["x"]
    for _ in range(5):
        x = await add_one(x)
    return x
