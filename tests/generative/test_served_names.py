"""A worker claims every name it serves, whatever the names, their order and their number.

The names (any character a name may hold, up to its longest), the order the worker is
given them in, how many runs of each, the shard count and when the runs are submitted
(before the worker starts, while it starts, once it serves; through the worker's store
object or another one on the same store) are drawn by Hypothesis, on every store.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyrula.workflows import RunStatus, WorkflowClient, WorkflowWorker
from tests.conftest import await_until
from tests.generative.harness import other_store
from tests.generative.strategies import echo_registry, names
from tests.unit.worker.worker_support import fast_options

#: Seconds every run has to complete once submitted and the worker serves.
BOUND = 20.0

served = st.lists(names, min_size=1, max_size=6, unique=True)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), order=served, runs=st.integers(1, 3),
       shard_count=st.sampled_from([1, 2, 5, 64]),
       when=st.sampled_from(["before", "during", "after"]), separate=st.booleans())
def test_every_served_name_is_claimed(new_store: Any, data: st.DataObject, order: list[str],
                                      runs: int, shard_count: int, when: str,
                                      separate: bool) -> None:
    asyncio.run(_claims_all(new_store(shard_count=shard_count), order, runs, when, separate))


async def _claims_all(store: Any, order: list[str], runs: int, when: str,
                      separate: bool) -> None:
    submitter = other_store(store) if separate else store
    client = WorkflowClient(submitter)
    worker = WorkflowWorker(store=store, workflows=order, registry=echo_registry(order),
                            options=fast_options(), cloud=False)
    handles: list[Any] = []

    async def submit_all() -> None:
        for i in range(runs):
            for name in order:
                handles.append((name, i, await client.submit(name, {"i": i})))

    if when == "before":
        await submit_all()
    task = asyncio.create_task(worker.run())
    try:
        if when == "during":
            await submit_all()
        await await_until(lambda: worker.state != "starting" or task.done(), what="start")
        if task.done():
            task.result()
        if when == "after":
            await submit_all()

        async def all_completed() -> bool:
            infos = [await client.get(h.run_id) for _, _, h in handles]
            return all(info.status == RunStatus.COMPLETED for info in infos)

        try:
            await await_until(all_completed, timeout=BOUND, interval=0.05)
        except AssertionError:
            left = [(n, (await client.get(h.run_id)).status.value) for n, _, h in handles]
            raise AssertionError(f"runs not completed within {BOUND} s: {left}") from None
        for name, i, handle in handles:
            assert await client.result(handle.run_id, timeout=1) == {
                "name": name, "params": {"i": i}}
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)
        if submitter is not store:
            await submitter.aclose()
        await store.aclose()
