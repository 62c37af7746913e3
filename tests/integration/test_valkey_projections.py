"""Projections on Valkey beyond the store contract: a server killed and restarted (AOF,
fsync always) while a worker folds runs that end loses no fold and doubles none."""

from __future__ import annotations

from typing import Any

from pyrula.workflows import (
    RunInfo,
    ValkeyStore,
    WorkflowClient,
    WorkflowContext,
    WorkflowWorker,
    projection,
    workflow,
)
from tests.conftest import await_until
from tests.integration.test_valkey_triggers import _answers
from tests.integration.valkey_support import opened, options, serving


@workflow(name="vp.echo")
async def echo(ctx: WorkflowContext, params: Any) -> Any:
    return params


@projection("vp.ids", on=[echo])
def ids(state: Any, run: RunInfo) -> Any:
    return [*(state or []), run.run_id]


async def test_a_server_restart_under_load_loses_no_fold(valkey_server_factory: Any) -> None:
    server = valkey_server_factory(appendonly="yes", appendfsync="always")
    store = ValkeyStore(url=server.url, namespace="vp", shard_count=4, socket_timeout=2.0)
    submitter = ValkeyStore(url=server.url, namespace="vp", shard_count=4, socket_timeout=2.0)
    async with opened(store, submitter):
        worker = WorkflowWorker(store=store, workflows=[echo], projections=[ids], cloud=False,
                                options=options(projection_interval=0.02,
                                                projection_grace=0.5, lock_ttl=5.0))
        client = WorkflowClient(submitter)
        submitted: list[str] = []

        async def submit(n: int) -> None:
            for i in range(n):
                submitted.append((await client.submit("vp.echo", i)).run_id)

        async def all_folded() -> bool:
            return set(await client.projection("vp.ids") or []) >= set(submitted)

        async with serving(worker):
            await submit(40)
            server.kill()
            server.restart()
            await await_until(_answers(submitter), timeout=20, what="the server back")
            await submit(40)
            await await_until(all_folded, timeout=60, what="every run folded")
        folded = await client.projection("vp.ids")
        assert sorted(folded) == sorted(submitted)
