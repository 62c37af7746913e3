"""The clients and the inline runner as a user meets them: input checks, lookups, lists."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import (
    ConfigurationError,
    InlineWorkflowRunner,
    MemoryStore,
    PayloadTooLarge,
    RunHandle,
    RunNotActive,
    RunStatus,
    SyncWorkflowClient,
    WorkflowClient,
    WorkflowContext,
    WorkflowNotFound,
    store_from_url,
    workflow,
)
from pyrula.workflows.records import PoisonPolicy

SEEN: list[Any] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    SEEN.clear()


@workflow(name="client.echo")
async def echo(ctx: WorkflowContext, params: Any) -> Any:
    return params


@workflow(name="client.approval")
async def approval(ctx: WorkflowContext, params: Any) -> Any:
    return await ctx.wait_for_signal("approved")


@pytest.mark.parametrize("params", [{1, 2}, {"when": object()}, b"\xff"])
async def test_params_that_are_not_json_are_refused_at_submit(
    store_runner: InlineWorkflowRunner, params: Any
) -> None:
    client = store_runner.client
    with pytest.raises(ValueError, match="client.echo"):
        await client.submit("client.echo", params)
    assert [info async for info in client.list_runs()] == []


async def test_params_above_the_payload_limit_are_refused_at_submit() -> None:
    client = WorkflowClient(MemoryStore(), max_payload_bytes=64)
    with pytest.raises(PayloadTooLarge, match=r"max_payload_bytes \(64\)") as raised:
        await client.submit("client.echo", {"blob": "x" * 100})
    assert isinstance(raised.value, ValueError)
    assert "client.echo" in str(raised.value)
    assert [info async for info in client.list_runs()] == []


async def test_submit_accepts_a_workflow_function_or_its_name(
    runner: InlineWorkflowRunner,
) -> None:
    by_fn = await runner.client.submit(echo, 1)
    by_name = await runner.client.submit("client.echo", 2)
    assert isinstance(by_fn, RunHandle)
    assert by_fn.name == by_name.name == "client.echo"
    assert by_fn.run_id != by_name.run_id


async def test_submit_does_not_consult_the_registry(runner: InlineWorkflowRunner) -> None:
    run = await runner.client.submit("client.nobody_serves_this", {"x": 1})
    info = await runner.client.get(run.run_id)
    assert info.status is RunStatus.QUEUED
    assert await runner.run_next() is None  # the runner serves only registered names


async def test_unknown_run_id_raises_workflow_not_found(store_runner: InlineWorkflowRunner) -> None:
    client = store_runner.client
    with pytest.raises(WorkflowNotFound):
        await client.get("0" * 32)
    with pytest.raises(WorkflowNotFound):
        await client.signal("0" * 32, "approved", True)
    with pytest.raises(WorkflowNotFound):
        await client.events("0" * 32)


async def test_signal_resume_and_cancel_of_an_ended_run(store_runner: InlineWorkflowRunner) -> None:
    runner = store_runner
    run = await runner.client.submit("client.echo", 1)
    await runner.run(run.name, run.run_id)
    assert (await runner.client.get(run.run_id)).status is RunStatus.COMPLETED

    with pytest.raises(RunNotActive):
        await runner.client.signal(run.run_id, "approved", True)
    with pytest.raises(RunNotActive):
        await runner.client.resume(run.run_id, "yes")
    assert await runner.client.cancel(run.run_id) is False


async def test_bad_signal_arguments_are_refused(runner: InlineWorkflowRunner) -> None:
    run = await runner.client.submit("client.approval")
    with pytest.raises(ValueError, match="approved"):
        await runner.client.signal(run.run_id, "approved", {1, 2})
    with pytest.raises(ValueError):
        await runner.client.signal(run.run_id, "", True)
    with pytest.raises(ValueError, match="reserved"):
        await runner.client.signal(run.run_id, "pyrula.interrupt", True)
    assert [e["type"] for e in await runner.client.events(run.run_id)] == ["run:submitted"]


async def test_result_times_out_while_the_run_is_not_done(runner: InlineWorkflowRunner) -> None:
    run = await runner.client.submit("client.approval")
    await runner.run(run.name, run.run_id)
    with pytest.raises(TimeoutError):
        await runner.client.result(run.run_id, timeout=0.01)


def test_store_from_url() -> None:
    assert isinstance(store_from_url("memory://"), MemoryStore)
    with pytest.raises(ConfigurationError, match="foo"):
        store_from_url("foo://x")
    with pytest.raises(ConfigurationError):
        store_from_url("no-scheme-here")


def test_a_sqlite_url_sets_synchronous_and_refuses_other_options(tmp_path: Path) -> None:
    store = store_from_url(f"sqlite:///{tmp_path}/a.db?synchronous=full")
    try:
        with store._db.tx() as conn:  # type: ignore[attr-defined]
            assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    finally:
        store.close()  # type: ignore[attr-defined]
    with pytest.raises(ConfigurationError, match="unknown option 'sync'"):
        store_from_url(f"sqlite:///{tmp_path}/b.db?sync=1")
    with pytest.raises(ConfigurationError, match="synchronous must be"):
        store_from_url(f"sqlite:///{tmp_path}/c.db?synchronous=always")


async def test_idempotency_key_returns_the_first_handle(store_runner: InlineWorkflowRunner) -> None:
    client = store_runner.client
    first = await client.submit("client.echo", {"n": 1}, idempotency_key="order-1")
    again = await client.submit("client.echo", {"n": 2}, idempotency_key="order-1")
    other = await client.submit("client.echo", {"n": 3}, idempotency_key="order-2")

    assert again == first
    assert other.run_id != first.run_id
    assert (await client.get(first.run_id)).params == {"n": 1}
    assert (await client.get(first.run_id)).idempotency_key == "order-1"
    assert len([info async for info in client.list_runs(name="client.echo")]) == 2


async def test_list_runs_filters_by_name_status_and_owner(
    store_runner: InlineWorkflowRunner,
) -> None:
    runner = store_runner
    client = runner.client
    a1 = await client.submit("client.echo", 1, owner="tenant-a")
    a2 = await client.submit("client.approval", 2, owner="tenant-a")
    b1 = await client.submit("client.echo", 3, owner="tenant-b")
    none = await client.submit("client.echo", 4)
    await runner.run(a1.name, a1.run_id)
    await runner.run(a2.name, a2.run_id)

    async def ids(**filters: Any) -> set[str]:
        return {info.run_id async for info in client.list_runs(**filters)}

    assert await ids() == {a1.run_id, a2.run_id, b1.run_id, none.run_id}
    assert await ids(name="client.echo") == {a1.run_id, b1.run_id, none.run_id}
    assert await ids(name=approval) == {a2.run_id}
    assert await ids(owner="tenant-a") == {a1.run_id, a2.run_id}
    assert await ids(status=RunStatus.COMPLETED) == {a1.run_id}
    assert await ids(status="waiting") == {a2.run_id}
    assert await ids(status="queued", owner="tenant-b") == {b1.run_id}
    assert await ids(name="client.echo", status="queued") == {b1.run_id, none.run_id}
    assert await ids(name="client.unknown") == set()
    assert len(await ids(limit=2)) == 2
    runs = [info async for info in client.list_runs()]
    assert [r.created_at for r in runs] == sorted((r.created_at for r in runs), reverse=True)


async def test_list_runs_pages_through_everything(runner: InlineWorkflowRunner) -> None:
    handles = [await runner.client.submit("client.echo", n) for n in range(7)]
    seen = [info.run_id async for info in runner.client.list_runs(page_size=3)]
    assert sorted(seen) == sorted(h.run_id for h in handles)
    assert len(seen) == len(set(seen))


def test_sync_client_mirrors_the_async_one() -> None:
    store = MemoryStore()
    client = SyncWorkflowClient(store)
    runner = InlineWorkflowRunner(store=store, cloud=False)

    run = client.submit("client.approval", None, owner="tenant-s", idempotency_key="k")
    assert client.submit("client.approval", None, idempotency_key="k") == run
    assert client.get(run.run_id).status is RunStatus.QUEUED
    asyncio.run(runner.run(run.name, run.run_id))
    assert client.get(run.run_id).status is RunStatus.WAITING

    client.signal(run.run_id, "approved", {"ok": True})
    assert client.get(run.run_id).status is RunStatus.QUEUED
    asyncio.run(runner.run(run.name, run.run_id))

    assert client.result(run.run_id, timeout=5) == {"ok": True}
    assert [e["type"] for e in client.events(run.run_id)][-1] == "run:completed"
    assert [info.run_id for info in client.list_runs(owner="tenant-s")] == [run.run_id]
    with pytest.raises(WorkflowNotFound):
        client.get("0" * 32)
    with pytest.raises(RunNotActive):
        client.signal(run.run_id, "approved", True)
    assert client.cancel(run.run_id) is False
    asyncio.run(runner.aclose())


def test_sync_client_result_wakes_when_the_run_ends_in_another_thread() -> None:
    store = MemoryStore()
    client = SyncWorkflowClient(store)
    runner = InlineWorkflowRunner(store=store, cloud=False)
    run = client.submit("client.echo", {"v": 1})
    results: list[Any] = []

    waiter = threading.Thread(target=lambda: results.append(client.result(run.run_id, 10)))
    waiter.start()
    try:
        asyncio.run(runner.run(run.name, run.run_id))
    finally:
        waiter.join(10)
    assert results == [{"v": 1}]
    asyncio.run(runner.aclose())


async def test_runner_restricted_to_some_workflows(runner: InlineWorkflowRunner) -> None:
    only = InlineWorkflowRunner(store=runner.store, workflows=[echo], cloud=False)
    waiting = await runner.client.submit("client.approval")
    with pytest.raises(WorkflowNotFound):
        await only.run(waiting.name, waiting.run_id)
    assert await only.run_next() is None
    served = await runner.client.submit("client.echo", 5)
    assert await only.run_next() is not None
    assert await runner.client.result(served.run_id, timeout=5) == 5
    assert (await runner.client.get(waiting.run_id)).status is RunStatus.QUEUED
    await only.aclose()


async def test_run_next_runs_a_suspect_once_no_ordinary_run_is_queued(
    store_runner: InlineWorkflowRunner,
) -> None:
    store, client = store_runner.store, store_runner.client
    crashed = await client.submit("client.echo", "crashed")
    ordinary = await client.submit("client.echo", "ordinary")
    assert await store.claim_run(crashed.run_id, "dead", now=time.time(), lock_ttl=30)
    await store.reclaim_worker("dead", now=time.time(), poison=PoisonPolicy())  # a suspect

    assert await store_runner.run_next() is not None
    assert (await client.get(ordinary.run_id)).status is RunStatus.COMPLETED
    assert (await client.get(crashed.run_id)).status is RunStatus.QUEUED
    assert await store_runner.run_next() is not None
    assert await client.result(crashed.run_id, timeout=5) == "crashed"
    assert await store_runner.run_next() is None


async def test_run_checks_the_name_against_the_run(runner: InlineWorkflowRunner) -> None:
    run = await runner.client.submit("client.echo", 1)
    with pytest.raises(ValueError, match="client.echo"):
        await runner.run("client.approval", run.run_id)
    assert (await runner.client.get(run.run_id)).status is RunStatus.QUEUED


# --- the Deployment Modes page ---------------------------------------------------------


@workflow
async def my_workflow(ctx: WorkflowContext, params: dict[str, Any]) -> dict[str, Any]:
    SEEN.append(params)
    return {"x": params["x"] + 1}


def test_deployment_modes_inline_snippet_runs_as_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYRULA_CLOUD_API_KEY", raising=False)
    # --- verbatim from docs: Deployment Modes, "Embedded" ---
    import asyncio

    from pyrula.workflows import InlineWorkflowRunner, MemoryStore

    async def main() -> None:
        runner = InlineWorkflowRunner(store=MemoryStore())
        run = await runner.client.submit("my_workflow", {"x": 1})
        events = await runner.run(run.name, run.run_id)  # noqa: F841

    asyncio.run(main())
    # --- end of snippet ---
    assert SEEN == [{"x": 1}]


async def test_deployment_modes_runner_returns_the_journal(runner: InlineWorkflowRunner) -> None:
    run = await runner.client.submit("my_workflow", {"x": 1})
    events = await runner.run(run.name, run.run_id)
    assert [e["type"] for e in events][-1] == "run:completed"
    assert events[-1]["result"] == {"x": 2}


def test_cloud_key_that_does_not_parse_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYRULA_CLOUD_API_KEY", "k-123")
    runner = InlineWorkflowRunner(store=MemoryStore())
    with pytest.raises(ConfigurationError, match="PYRULA_CLOUD_API_KEY is not a pyrula Cloud"):
        asyncio.run(runner.start())
    asyncio.run(InlineWorkflowRunner(store=MemoryStore(), cloud=False).start())
