"""Retention in Valkey: an ended run's keys expire ``completed_ttl`` after it ends (live runs
never do), and ``recover_pending_runs(name)`` requeues the orphans of a name no worker
serves, which the workers' orphan scans leave alone."""

from __future__ import annotations

import asyncio
import time

import redis

from pyrula.workflows import RunStatus, ValkeyStore
from tests.conftest import await_until
from tests.integration.valkey_support import (
    LEDGER,
    make_worker,
    noop,
    one_step,
    opened,
    serving,
)


def _keys_of(url: str, run_id: str) -> list[str]:
    with redis.Redis.from_url(url, decode_responses=True) as client:
        return sorted(client.scan_iter(match=f"*{run_id}*", count=1000))


async def test_ended_runs_expire_after_completed_ttl_and_live_ones_stay(
    valkey_url: str, valkey_namespace: str
) -> None:
    store = ValkeyStore(url=valkey_url, namespace=valkey_namespace, completed_ttl=1)
    async with opened(store):
        worker = make_worker(store, [one_step])
        client = worker.client
        async with serving(worker):
            done = await client.submit(one_step, {"tag": f"{valkey_namespace}-done"},
                                       idempotency_key="once")
            assert await client.result(done.run_id, timeout=10) == f"{valkey_namespace}-done"
        cancelled = await client.submit(one_step, {"tag": "never"})
        assert await client.cancel(cancelled.run_id)
        queued = await client.submit("vk.nobody_serves_this", {})

        with redis.Redis.from_url(valkey_url, decode_responses=True) as admin:
            for run_id in (done.run_id, cancelled.run_id):
                keys = _keys_of(valkey_url, run_id)
                assert any(":run:" in k for k in keys) and any(":jnl:" in k for k in keys)
                assert all(0 < admin.pttl(k) <= 1000 for k in keys), [
                    (k, admin.pttl(k)) for k in keys]
            live = _keys_of(valkey_url, queued.run_id)
            assert live and all(admin.pttl(k) == -1 for k in live)  # no TTL on a live run

        async def gone() -> bool:
            return (await store.get_run(done.run_id) is None
                    and await store.get_run(cancelled.run_id) is None)

        await await_until(gone, timeout=10, what="the ended runs to expire")
        assert _keys_of(valkey_url, done.run_id) == []
        assert _keys_of(valkey_url, cancelled.run_id) == []
        listed = {i.run_id for i in await store.list_runs(limit=100)}
        assert listed == {queued.run_id}
        info = await store.get_run(queued.run_id)
        assert info is not None and info.status is RunStatus.QUEUED
        # The idempotency key expired with its run: the same key makes a new run.
        again, created = await store.submit("vk.one_step", {}, now=time.time(),
                                            idempotency_key="once")
        assert created and again.run_id != done.run_id


async def test_recover_pending_runs_requeues_orphans_of_a_name_no_worker_serves(
    valkey_url: str, valkey_namespace: str
) -> None:
    LEDGER.clear()
    tag = f"{valkey_namespace}-orphan"
    store = ValkeyStore(url=valkey_url, namespace=valkey_namespace)
    async with opened(store):
        served = make_worker(store, [noop])  # orphan scan every 0.2 s, of vk.noop only
        client = served.client
        orphan = await client.submit(one_step, {"tag": tag})
        sibling = await client.submit(noop, {"tag": "sibling"})
        # A worker that died holding both: claimed with a short lock, never finished.
        now = time.time()
        for handle in (orphan, sibling):
            claimed = await store.claim_run(handle.run_id, "dead-worker", now=now, lock_ttl=0.3)
            assert claimed is not None

        async with serving(served):
            # The scan that requeues the served sibling ran after both locks lapsed...
            assert await client.result(sibling.run_id, timeout=10) == "sibling"
            # ...and left the unserved one alone.
            info = await store.get_run(orphan.run_id)
            assert info is not None and info.status is RunStatus.RUNNING

            assert await asyncio.to_thread(store.recover_pending_runs, "vk.one_step") == 1
            info = await store.get_run(orphan.run_id)
            assert info is not None and info.status is RunStatus.QUEUED
            requeued = [e for e in await store.read_events(orphan.run_id)
                        if e["type"] == "run:requeued"]
            assert [e["reason"] for e in requeued] == ["orphaned"]
            assert await asyncio.to_thread(store.recover_pending_runs, "vk.one_step") == 0

            rescuer = make_worker(store, [one_step])
            async with serving(rescuer):
                assert await client.result(orphan.run_id, timeout=10) == tag
    assert LEDGER.count("vk.touch", tag) == 1
