"""A worker's /metrics: the documented Prometheus names, as a scrape reads them."""

from __future__ import annotations

import asyncio
from typing import Any

from pyrula.workflows import RunStatus, WorkflowContext, WorkflowWorker, step, workflow
from tests.conftest import await_until
from tests.promtext import maybe, samples, value
from tests.unit.worker.worker_support import fast_options, http_text, serving


@step(name="wmetrics_ok")
async def wmetrics_ok(x: int) -> int:
    return x + 1


@step(name="wmetrics_boom")
async def wmetrics_boom() -> None:
    raise ValueError("boom")


@workflow(name="wmetrics_flow")
async def wmetrics_flow(ctx: WorkflowContext, params: Any) -> Any:
    first = await wmetrics_ok(params["x"])
    await ctx.sleep(0.05)  # parks: the resumed attempt reads its journal from the cache
    return await wmetrics_ok(first)


@workflow(name="wmetrics_fails")
async def wmetrics_fails(ctx: WorkflowContext, params: Any) -> Any:
    await wmetrics_boom()


async def scrape(address: tuple[str, int] | None) -> str:
    status, body = await http_text(address, "/metrics")
    assert status == 200, body
    return body


async def test_metrics_name_runs_steps_durations_claims_and_the_journal_cache(
    store: Any,
) -> None:
    worker = WorkflowWorker(store=store, workflows=[wmetrics_flow, wmetrics_fails],
                            options=fast_options(health_port=0))
    async with serving(worker):
        client = worker.client
        ok = [await client.submit(wmetrics_flow, {"x": i}) for i in range(3)]
        bad = await client.submit(wmetrics_fails, {})
        for i, run in enumerate(ok):
            assert await client.result(run.run_id, timeout=10) == i + 2
        await await_until(lambda: worker.runs_done == 4, what="the failing run ended")
        assert (await client.get(bad.run_id)).status is RunStatus.FAILED
        text = await scrape(worker.health_address)

    assert samples(text)  # every line parses as a Prometheus sample
    flow, fails = {"workflow": "wmetrics_flow"}, {"workflow": "wmetrics_fails"}
    # Each flow run: one attempt, then one more after its sleep.
    assert value(text, "pyrula_runs_started_total", **flow) == 6
    assert value(text, "pyrula_runs_completed_total", **flow) == 3
    assert value(text, "pyrula_runs_failed_total", **fails) == 1
    assert maybe(text, "pyrula_runs_completed_total", **fails) is None  # it never completed
    assert value(text, "pyrula_step_duration_seconds_count", step="wmetrics_ok", **flow) == 6
    assert value(text, "pyrula_step_duration_seconds_count", step="wmetrics_boom",
                 **fails) == 1
    assert value(text, "pyrula_run_duration_seconds_count", **flow) == 3
    # the sleep is inside the run's duration
    assert value(text, "pyrula_run_duration_seconds_bucket", le="0.025", **flow) == 0
    assert value(text, "pyrula_claim_latency_seconds_count", **flow) == 6
    assert value(text, "pyrula_journal_cache_hits_total") == 3
    # A counter is exposed from its first count on: no resumed run missed the cache.
    assert maybe(text, "pyrula_journal_cache_misses_total") is None
    assert value(text, "pyrula_runs_in_flight") == 0
    assert "# TYPE pyrula_step_duration_seconds histogram" in text


GATE: dict[str, asyncio.Event] = {}


@step(name="wmetrics_hold")
async def wmetrics_hold(key: str) -> str:
    await GATE[key].wait()
    return key


@workflow(name="wmetrics_queued")
async def wmetrics_queued(ctx: WorkflowContext, params: Any) -> Any:
    return await wmetrics_hold(params["key"])


async def test_metrics_show_the_queue_depth_and_its_oldest_age_per_workflow(store: Any) -> None:
    GATE["q"] = asyncio.Event()
    worker = WorkflowWorker(store=store, workflows=[wmetrics_queued],
                            options=fast_options(health_port=0, max_concurrent_runs=1))
    async with serving(worker):
        client = worker.client
        runs = [await client.submit(wmetrics_queued, {"key": "q"}) for _ in range(3)]
        await await_until(lambda: worker.in_flight == 1, what="one run held")
        text = await scrape(worker.health_address)
        queued = {"workflow": "wmetrics_queued"}
        assert value(text, "pyrula_queue_depth", **queued) == 2
        assert value(text, "pyrula_runs_in_flight") == 1
        waited = value(text, "pyrula_queue_oldest_age_seconds", **queued)
        assert waited > 0
        later = await scrape(worker.health_address)
        assert value(later, "pyrula_queue_oldest_age_seconds", **queued) >= waited
        GATE["q"].set()
        for run in runs:
            assert await client.result(run.run_id, timeout=10) == "q"
        text = await scrape(worker.health_address)
        assert value(text, "pyrula_queue_depth", **queued) == 0
        assert value(text, "pyrula_queue_oldest_age_seconds", **queued) == 0
