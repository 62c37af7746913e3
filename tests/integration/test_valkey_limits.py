"""Per-key limits on a sharded ValkeyStore, for what the store contract cannot show: runs
of a limited workflow submitted without keys (by a process that did not know the
workflow, before any worker recorded it as limited) land on shards other than the name's
home, and still share their key's slots with the home's runs; a worker that dies holds
such a slot no longer than its lock. Fake times; two store objects, as two processes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyrula.workflows import RunStatus, ValkeyStore
from pyrula.workflows.limits import LimitKeys, WorkflowLimits
from pyrula.workflows.stores.valkey.limits import LIMITED_SHARD
from tests.conformance.support import T0, complete, info
from tests.integration.valkey_support import opened

NAME = "vk.limited"
TTL = 30.0
KEYS = LimitKeys(concurrency="acme")


def _shard(run_id: str) -> int:
    return int(run_id[12:16], 16)


async def _bare_runs(store: ValkeyStore, count: int) -> list[str]:
    """Runs submitted without keys, as the CLI does, until some land off the home."""
    runs: list[str] = []
    while len([r for r in runs if _shard(r) != LIMITED_SHARD]) < count:
        handle, _ = await store.submit(NAME, {"account": "acme"}, now=T0, owner="a")
        runs.append(handle.run_id)
    return runs


async def _claim(store: ValkeyStore, worker: str, now: float) -> list[Any]:
    """Claim as a worker does: a run claimed without keys gets them (the worker computes
    them); the runs that may run now, not those handed back to their key's line."""
    going = []
    for run in await store.claim(worker, [NAME], limit=50, now=now, lock_ttl=TTL):
        if run.limit_keys is not None or await store.assign_limit_keys(
            run.run_id, run.token, KEYS, now=now
        ):
            going.append(run)
    return going


async def _running(store: ValkeyStore, runs: Sequence[str]) -> list[str]:
    return [r for r in runs if (await info(store, r)).status is RunStatus.RUNNING]


async def test_runs_of_other_shards_share_the_homes_slots(
    valkey_url: str, valkey_namespace: str
) -> None:
    """max=1: of the runs submitted without keys across shards, two workers run one at a
    time; each finish lets the next one in, until all have run."""
    client = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=8)
    workers = [ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=8)
               for _ in range(2)]
    async with opened(client, *workers):
        runs = await _bare_runs(client, 3)
        for w in workers:
            w.use_limits({NAME: WorkflowLimits(max=1)})
        now, done = T0, 0
        while done < len(runs):
            now += 1
            for i, w in enumerate(workers):
                going = await _claim(w, f"w{i}", now)
                assert len(await _running(client, runs)) <= 1, "two runs of one key ran"
                for run in going:
                    await complete(w, run.run_id, run.token, now=now)
                    done += 1
            assert now < T0 + 4 * len(runs), f"{done} of {len(runs)} runs ran"


async def test_a_dead_workers_slot_of_another_shard_expires_with_its_lock(
    valkey_url: str, valkey_namespace: str
) -> None:
    """A run off the home takes its slot there; its worker dies (no renewal, no finish):
    the key's other runs wait until that lock's expiry, then run."""
    client = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=8)
    dead, live = (ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=8)
                  for _ in range(2))
    async with opened(client, dead, live):
        runs = await _bare_runs(client, 2)
        away = [r for r in runs if _shard(r) != LIMITED_SHARD]
        for w in (dead, live):
            w.use_limits({NAME: WorkflowLimits(max=1)})
        first = await dead.claim_run(away[0], "dead", now=T0 + 1, lock_ttl=TTL)
        assert first is not None
        assert await dead.assign_limit_keys(first.run_id, first.token, KEYS, now=T0 + 1)
        assert await _claim(live, "live", T0 + 2) == [], (
            "a run started while a slot of its key was held")
        assert len(await _claim(live, "live", T0 + 2 + TTL)) == 1, (
            "the dead worker's slot did not expire with its lock")


async def test_a_worker_records_its_limited_workflow_so_later_runs_go_home(
    valkey_url: str, valkey_namespace: str
) -> None:
    """Once a worker serving the workflow has started (``prepare``), a process without
    the definition queues its runs at the name's home too, however many shards."""
    worker = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=8)
    client = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=8)
    async with opened(worker, client):
        worker.use_limits({NAME: WorkflowLimits(max=1)})
        await worker.prepare([NAME])
        for _ in range(8):
            handle, _ = await client.submit(NAME, {"account": "acme"}, now=T0, owner="a")
            assert _shard(handle.run_id) == LIMITED_SHARD


async def test_a_resubmit_after_the_workflow_got_limits_finds_the_run_submitted_before(
    valkey_url: str, valkey_namespace: str
) -> None:
    """Runs submitted under idempotency keys before a workflow had limits sit on the
    shards their keys map to; once it has limits its runs go to the home, and a resubmit
    of the same key must still find the earlier run, not start a second one."""
    before = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=8)
    after = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=8)
    async with opened(before, after):
        after.use_limits({NAME: WorkflowLimits(max=1)})
        earlier = {}
        for n in range(16):
            handle, created = await before.submit(NAME, {"account": "acme"}, now=T0,
                                                  owner="a", idempotency_key=f"order-{n}")
            assert created
            earlier[f"order-{n}"] = handle.run_id
        assert {_shard(r) for r in earlier.values()} - {LIMITED_SHARD}, "all on the home"
        for key, run_id in earlier.items():
            for keys in (None, KEYS):
                handle, created = await after.submit(
                    NAME, {"account": "acme"}, now=T0 + 1, owner="a",
                    idempotency_key=key, limit_keys=keys)
                assert (handle.run_id, created) == (run_id, False), key
        fresh, created = await after.submit(NAME, {"account": "acme"}, now=T0 + 1,
                                            owner="a", idempotency_key="order-new")
        assert created and _shard(fresh.run_id) == LIMITED_SHARD
