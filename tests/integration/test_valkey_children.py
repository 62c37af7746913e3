"""A wide fan-out on Valkey: one parent gathers 10,000 children with two real
``WorkflowWorker`` s and completes with every result in order. Its journal records which
children it started and saw end, in batches, never their results; a child's end nudges
the parent through the store (``nudge``), which writes nothing in its journal, so the
journal stays a few hundred events whatever the number of children.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import orjson

from pyrula.workflows import (
    RunStatus,
    ValkeyStore,
    WorkerOptions,
    WorkflowClient,
    WorkflowContext,
    WorkflowWorker,
    workflow,
)
from pyrula.workflows.events import CHILD_SIGNAL


@workflow(name="vk.kid")
async def kid(ctx: WorkflowContext, params: int) -> int:
    return params * 3


@workflow(name="vk.wide")
async def wide(ctx: WorkflowContext, params: dict[str, int]) -> list[int]:
    specs = [(kid, i) for i in range(params["n"])]
    return await ctx.gather_children(specs, max_concurrency=params["limit"])


OPTIONS = WorkerOptions(claim_poll_interval=0.01, timer_poll_interval_s=0.05, lock_ttl=10.0,
                        shutdown_grace=2.0, max_concurrent_runs=64, child_recheck=5.0)


async def _fan_out(url: str, namespace: str, n: int) -> tuple[list[Any], list[Any], float]:
    """Run ``vk.wide`` over ``n`` children on two workers: (result, journal, seconds)."""
    store = ValkeyStore(url, namespace=namespace)
    workers = [WorkflowWorker(store=store, workflows=[kid, wide], cloud=False,
                              options=OPTIONS) for _ in range(2)]
    tasks = [asyncio.create_task(worker.run()) for worker in workers]
    try:
        client = WorkflowClient(store)
        began = time.monotonic()
        run = await client.submit("vk.wide", {"n": n, "limit": 200})
        result = await client.result(run.run_id, timeout=max(120, n / 20))
        seconds = time.monotonic() - began
        info = await client.get(run.run_id)
        assert info.status is RunStatus.COMPLETED
        return result, await client.events(run.run_id), seconds
    finally:
        for worker in workers:
            worker.stop()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        await store.aclose()


N = 10_000


def _is_nudge(event: Any) -> bool:
    return bool(event["type"] == "signal:received" and event.get("name") == CHILD_SIGNAL)


async def test_a_parent_of_ten_thousand_children_journals_no_results(
        valkey_url: str, valkey_namespace: str) -> None:
    result, journal, seconds = await _fan_out(valkey_url, valkey_namespace, N)
    assert result == [i * 3 for i in range(N)]
    size = sum(len(orjson.dumps(event)) for event in journal)
    nudges = [event for event in journal if _is_nudge(event)]
    rest = [event for event in journal if not _is_nudge(event)]
    print(f"children={N} seconds={seconds:.1f} events={len(journal)} nudges={len(nudges)} "
          f"bytes={size}")
    assert len(rest) < 1_000, Counter(event["type"] for event in rest)
    assert len(nudges) <= N
    assert size < 300 * N  # ids and nudges; the results live in the children's runs


async def test_a_parent_of_ten_thousand_children_has_under_a_thousand_events(
        valkey_url: str, valkey_namespace: str) -> None:
    _, journal, _ = await _fan_out(valkey_url, valkey_namespace, N)
    size = sum(len(orjson.dumps(event)) for event in journal)
    print(f"children={N} events={len(journal)} bytes={size}")
    assert len(journal) < 1_000, Counter(event["type"] for event in journal)
    assert not [event for event in journal if _is_nudge(event)]
