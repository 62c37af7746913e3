"""pyrula on uvloop's event loop, the loop uvicorn runs by default where it is installed
(``uvicorn[standard]``): an app that embeds a client or a worker there must work as on
asyncio's own loop. uvloop's transports are not ``asyncio.Transport`` subclasses, which
the Valkey connection once assumed."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from pyrula.workflows import (
    ValkeyStore,
    WorkflowClient,
    WorkflowContext,
    WorkflowWorker,
    step,
    workflow,
)
from tests.unit.worker.worker_support import fast_options, serving

pytestmark = pytest.mark.valkey


@step(name="uvloop.double")
def double(x: int) -> int:
    return 2 * x


@workflow(name="uvloop.flow")
async def flow(ctx: WorkflowContext, params: dict[str, int]) -> int:
    return int(await double(params["x"])) + int(await double(1))


def test_a_client_and_a_worker_on_uvloop(valkey_url: str, valkey_namespace: str) -> None:
    async def main() -> list[int]:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        store = ValkeyStore(url=valkey_url, namespace=valkey_namespace)
        worker = WorkflowWorker(store=store, workflows=[flow], options=fast_options(),
                                cloud=False)
        try:
            async with serving(worker):
                client = WorkflowClient(store)
                handles = [await client.submit(flow, {"x": x}) for x in range(20)]
                return list(await asyncio.gather(
                    *(client.result(h.run_id, timeout=30) for h in handles)))
        finally:
            await store.aclose()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(main()) == [2 * x + 2 for x in range(20)]
