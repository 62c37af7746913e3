"""An open continue_as_new chain outlives its earlier runs: result(start id) follows it."""

from __future__ import annotations

import asyncio
from typing import Any

from pyrula.workflows import InlineWorkflowRunner, ValkeyStore, WorkflowContext, workflow
from tests.conftest import await_until


@workflow(name="chains.two_legs")
async def two_legs(ctx: WorkflowContext, params: dict[str, Any]) -> str:
    if params["leg"] == 1:
        ctx.continue_as_new({"leg": 2})
    answer = await ctx.wait_for_signal("go")
    return f"done-{answer}"


async def test_result_of_the_start_id_follows_the_chain_after_the_first_run_expired(
    valkey_url: str, valkey_namespace: str
) -> None:
    store = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=1,
                        completed_ttl=1)
    runner = InlineWorkflowRunner(store=store, cloud=False)
    first = await runner.client.submit(two_legs, {"leg": 1})
    await runner.run(first.name, first.run_id)  # ends as continued; its successor is queued
    successor = (await runner.client.get(first.run_id)).successor_id
    assert successor is not None
    await runner.run(first.name, successor)  # the second leg waits for "go"

    # The first run's keys expire completed_ttl after it ended; the chain is still open.
    await await_until(lambda: _gone(store, first.run_id), timeout=10, what="first run expired")
    waiting = asyncio.create_task(runner.client.result(first.run_id, timeout=20))
    await runner.client.signal(successor, "go", "now")
    await runner.run(first.name, successor)
    assert await waiting == "done-now"
    await runner.aclose()
    await store.aclose()


async def _gone(store: ValkeyStore, run_id: str) -> bool:
    return await store.get_run(run_id) is None
