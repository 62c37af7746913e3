"""Params that are not JSON are refused at submit with nothing written; what a workflow's
own code hands back that is not JSON, or is over ``max_payload_bytes``, fails the step (or
the run) at once with an error naming the step and the type or the limit: no retry of the
step, no requeue, no crash counted; and the worker goes on serving. Over a real worker on
SQLite and on Valkey."""

from __future__ import annotations

import asyncio
import datetime
import sqlite3
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from pyrula.workflows import (
    PayloadTooLarge,
    RunFailed,
    RunStatus,
    SQLiteStore,
    SyncWorkflowClient,
    ValkeyStore,
    WorkflowClient,
    WorkflowContext,
    step,
    workflow,
)
from tests.conftest import await_until
from tests.integration.valkey_support import (
    awaits_signal,
    captured_logs,
    make_worker,
    one_step,
    serving,
)

CALLS: Counter[str] = Counter()
_calls_lock = threading.Lock()


def _count(name: str) -> None:
    with _calls_lock:
        CALLS[name] += 1


@step(name="bp.returns_a_set", retries=3, retry_backoff=0)
async def returns_a_set(tag: str) -> Any:
    _count(f"set-{tag}")
    return {"ids": {1, 2, 3}}


@step(name="bp.returns_a_datetime", retries=3, retry_backoff=0)
def returns_a_datetime(tag: str) -> Any:  # a sync step, on the worker's threads
    _count(f"datetime-{tag}")
    return datetime.datetime(2024, 1, 1)


@step(name="bp.returns_too_much", retries=3, retry_backoff=0)
async def returns_too_much(tag: str) -> str:
    _count(f"big-{tag}")
    return "x" * 5000


STEPS = {"set": returns_a_set, "datetime": returns_a_datetime, "big": returns_too_much}
STEP_NAMES = {"set": "bp.returns_a_set", "datetime": "bp.returns_a_datetime",
              "big": "bp.returns_too_much"}


@workflow(name="bp.calls")
async def calls(ctx: WorkflowContext, params: dict[str, Any]) -> Any:
    return await STEPS[params["kind"]](params["tag"])


@workflow(name="bp.returns_bytes")
async def returns_bytes(ctx: WorkflowContext, params: dict[str, Any]) -> Any:
    return b"raw"


@pytest.fixture(params=["sqlite", pytest.param("valkey", marks=pytest.mark.valkey)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        s: Any = SQLiteStore(str(tmp_path / "store.db"))
    else:
        s = ValkeyStore(url=request.getfixturevalue("valkey_url"),
                        namespace=request.getfixturevalue("valkey_namespace"), shard_count=2)
    try:
        yield s
    finally:
        s.close()


@pytest.mark.parametrize(("kind", "named"), [
    ("set", "builtins.set"),
    ("datetime", "datetime.datetime"),
    ("big", "above max_payload_bytes (4096)"),
])
async def test_a_step_result_that_cannot_be_stored_fails_the_step_once(
    store: Any, kind: str, named: str, valkey_namespace: str
) -> None:
    tag = valkey_namespace  # unique per test
    client = WorkflowClient(store)
    worker = make_worker(store, [calls, returns_bytes, one_step], max_payload_bytes=4096)
    with captured_logs() as logs:
        async with serving(worker):
            run = await client.submit(calls, {"kind": kind, "tag": tag})
            with pytest.raises(RunFailed) as failed:
                await client.result(run.run_id, timeout=20)
            error = failed.value.error
            assert error["code"] == "step_failed"
            assert f"the result of step {STEP_NAMES[kind]!r} is" in error["message"]
            assert named in error["message"]

            # The workflow's own result: code serialization, naming the workflow.
            other = await client.submit(returns_bytes, {})
            with pytest.raises(RunFailed) as failed:
                await client.result(other.run_id, timeout=20)
            assert failed.value.error["code"] == "serialization"
            assert "workflow 'bp.returns_bytes'" in failed.value.error["message"]
            assert "builtins.bytes" in failed.value.error["message"]

            after = await client.submit(one_step, {"tag": "after"})
            assert await client.result(after.run_id, timeout=20) == "after"
    # Ran once, though it may retry 3 times: the step failed with will_retry false.
    assert CALLS[f"{kind}-{tag}"] == 1
    events = await client.events(run.run_id)
    [failure] = [e for e in events if e["type"] == "step:failed"]
    assert failure["will_retry"] is False and named in failure["message"]
    assert not [e for e in events if e["type"] in ("step:completed", "run:requeued")]
    info = await client.get(run.run_id)
    assert info.status is RunStatus.FAILED and info.attempt == 1
    assert not logs.events("run_quarantined") and not logs.events("loop_died")


async def test_a_signal_payload_over_the_limit_is_refused_and_the_run_goes_on(
    store: Any,
) -> None:
    client = WorkflowClient(store, max_payload_bytes=1024)
    worker = make_worker(store, [awaits_signal])
    async with serving(worker):
        run = await client.submit(awaits_signal, {"tag": "sig"})

        async def waiting() -> bool:
            return (await client.get(run.run_id)).status is RunStatus.WAITING

        await await_until(waiting, timeout=20, what="the run to wait")
        with pytest.raises(PayloadTooLarge, match=r"above max_payload_bytes \(1024\)"):
            await client.signal(run.run_id, "go", "y" * 2000)
        assert (await client.get(run.run_id)).status is RunStatus.WAITING
        await client.signal(run.run_id, "go", "small")
        assert await client.result(run.run_id, timeout=20) == "small"


NOT_JSON_PARAMS = [{1, 2}, datetime.datetime(2024, 1, 1), b"raw", object(),
                   {"ratio": float("nan")}, [float("inf")], 2**64]


def _footprint(store: Any) -> Any:
    """What the store holds: every key of a Valkey namespace, every row of SQLite's runs
    and events tables. Less the projections' heads on Valkey: the serving worker folds
    every projection registered in this process (other tests' too), each head written
    when first folded, whenever that comes; a submit never writes one."""
    if isinstance(store, ValkeyStore):
        with redis.Redis.from_url(store.url, decode_responses=True) as client:
            keys = client.scan_iter(match=f"{store.namespace}:*", count=1000)
            return sorted(k for k in keys if not k.startswith(f"{store.namespace}:{{pj."))
    conn = sqlite3.connect(store.path)
    try:
        return [conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                for table in ("runs", "events")]
    finally:
        conn.close()


async def test_params_that_are_not_json_are_refused_and_nothing_is_written(
    store: Any,
) -> None:
    client = WorkflowClient(store)
    sync_client = SyncWorkflowClient(store)
    worker = make_worker(store, [one_step])
    async with serving(worker):
        warm = await client.submit(one_step, {"tag": "before"})
        assert await client.result(warm.run_id, timeout=20) == "before"
        before = _footprint(store)
        for params in NOT_JSON_PARAMS:
            with pytest.raises(ValueError, match="params for workflow 'vk.one_step' is not JSON"):
                await client.submit(one_step, params)
            with pytest.raises(ValueError, match="not JSON-serialisable"):
                await asyncio.to_thread(sync_client.submit, one_step, params)
        small = WorkflowClient(store, max_payload_bytes=1000)
        with pytest.raises(PayloadTooLarge, match=r"params for workflow 'vk.one_step' is "
                                                  r"\d+ bytes, above max_payload_bytes \(1000\)"):
            await small.submit(one_step, {"tag": "x" * 2000})
        assert _footprint(store) == before
        after = await client.submit(one_step, {"tag": "after"})
        assert await client.result(after.run_id, timeout=20) == "after"
