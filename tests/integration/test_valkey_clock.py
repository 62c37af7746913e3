"""A worker on Valkey judges time by the server's clock (``TIME``), not its host's."""

from __future__ import annotations

import time

from pyrula.workflows import ValkeyStore, WorkflowWorker, workflow
from pyrula.workflows.clock import StoreClock


@workflow(name="clock.noop")
async def noop(ctx: object, params: object) -> None:
    return None


async def test_the_store_reads_the_servers_clock(valkey_url: str, valkey_namespace: str) -> None:
    store = ValkeyStore(valkey_url, namespace=valkey_namespace)
    try:
        before = time.time()
        server = await store.server_time()
        after = time.time()
        # One machine: the server's clock is this one, to within the round trip.
        assert before - 1 <= server <= after + 1
    finally:
        await store.aclose()
        store.close()


def test_a_worker_on_valkey_takes_the_servers_clock_unless_given_one(
    valkey_url: str, valkey_namespace: str
) -> None:
    store = ValkeyStore(valkey_url, namespace=valkey_namespace)
    try:
        worker = WorkflowWorker(store=store, workflows=[noop])
        assert isinstance(worker._clock, StoreClock)
        given = StoreClock(store.server_time)
        assert WorkflowWorker(store=store, workflows=[noop], clock=given)._clock is given
    finally:
        store.close()
