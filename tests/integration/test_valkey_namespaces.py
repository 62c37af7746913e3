"""Namespaces: independent stores on one server. Two ValkeyStores with different namespaces
never see each other's runs, and every key a store writes starts with ``<namespace>:``
(which is what lets an ACL on ``~<namespace>:*`` fence it)."""

from __future__ import annotations

import asyncio
import time

import pytest

from pyrula.workflows import ValkeyStore, WorkflowNotFound
from pyrula.workflows.records import RunStatus
from tests.integration.valkey_support import (
    LEDGER,
    all_keys,
    awaits_signal,
    exercise,
    make_worker,
    one_step,
    opened,
    serving,
    sleeps,
    statuses,
    two_steps,
)
from tests.servers import Server

NAME = "vk.one_step"


async def test_two_namespaces_on_one_server_never_see_each_others_runs(
    valkey_url: str, valkey_namespace: str
) -> None:
    alpha = ValkeyStore(url=valkey_url, namespace=f"{valkey_namespace}a", shard_count=4)
    beta = ValkeyStore(url=valkey_url, namespace=f"{valkey_namespace}b", shard_count=4)
    async with opened(alpha, beta):
        now = time.time()
        mine: dict[ValkeyStore, list[str]] = {alpha: [], beta: []}
        for store in (alpha, beta):
            for i in range(6):
                # The same name, owner and idempotency keys in both namespaces.
                handle, created = await store.submit(NAME, {"tag": f"{i}"}, now=now,
                                                     owner="acme", idempotency_key=f"k{i}")
                assert created
                mine[store].append(handle.run_id)
        await alpha.aflow_control_set("acme", max_concurrent=1)

        for store, other in ((alpha, beta), (beta, alpha)):
            for run_id in mine[other]:
                assert await store.get_run(run_id) is None
                with pytest.raises(WorkflowNotFound):
                    await store.read_events(run_id)
            listed = await store.list_runs(name=NAME, limit=100)
            assert sorted(i.run_id for i in listed) == sorted(mine[store])
            assert {i.run_id for i in await store.list_runs(limit=100)} == set(mine[store])
        assert await beta.aflow_control_get("acme") is None

        # beta's claim takes all of its own runs (alpha's flow control does not apply
        # there), and nothing of alpha's.
        claimed = await beta.claim("w-beta", [NAME], limit=100, now=now, lock_ttl=30)
        assert sorted(c.run_id for c in claimed) == sorted(mine[beta])
        assert await beta.claim("w-beta", [NAME], limit=100, now=now, lock_ttl=30) == []
        # alpha's runs are all still queued, and alpha's own flow control holds: one claim.
        assert await statuses(alpha, mine[alpha]) == {RunStatus.QUEUED: 6}
        [first] = await alpha.claim("w-alpha", [NAME], limit=100, now=now, lock_ttl=30)
        assert first.run_id in mine[alpha]
        assert await alpha.aflow_control_delete("acme")
        rest = await alpha.claim("w-alpha", [NAME], limit=100, now=now, lock_ttl=30)
        assert sorted([first.run_id, *(c.run_id for c in rest)]) == sorted(mine[alpha])


async def test_every_key_written_starts_with_its_namespace(fresh_valkey_server: Server) -> None:
    url = fresh_valkey_server.url
    alpha = ValkeyStore(url=url, namespace="alpha")
    beta = ValkeyStore(url=url, namespace="beta")
    LEDGER.clear()
    async with opened(alpha, beta):
        workers = [make_worker(s, [two_steps, sleeps, awaits_signal], schedule_interval=0.2)
                   for s in (alpha, beta)]
        async with serving(workers[0]), serving(workers[1]):
            await asyncio.gather(exercise(alpha, workers[0], "alpha-"),
                                 exercise(beta, workers[1], "beta-"))
            # Read while the workers hold shard leases too.
            during = all_keys(url)
        after = all_keys(url)
    for keys in (during, after):
        assert [k for k in keys if not k.startswith(("alpha:", "beta:"))] == []
        assert any(k.startswith("alpha:") for k in keys)
        assert any(k.startswith("beta:") for k in keys)
    # A SCAN on each namespace's prefix finds every key there is.
    assert sorted(all_keys(url, "alpha:*") + all_keys(url, "beta:*")) == after
    assert any(":leases" in k for k in during)  # shard leases were among the keys checked
    assert any(":jnl:" in k for k in after) and any(":run:" in k for k in after)
    # Each worker ran only its own namespace's runs.
    assert LEDGER.count("vk.touch", "alpha-a0") == 1
    assert LEDGER.count("vk.touch", "beta-a0") == 1
    assert not [t for _, t in LEDGER.order if not t.startswith(("alpha-", "beta-"))]


async def test_the_namespace_comes_from_the_environment_when_not_passed(
    valkey_url: str, valkey_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYRULA_VALKEY_NAMESPACE", valkey_namespace)
    from_env = ValkeyStore(url=valkey_url)
    explicit = ValkeyStore(url=valkey_url, namespace=f"{valkey_namespace}x")
    assert from_env.namespace == valkey_namespace
    assert explicit.namespace == f"{valkey_namespace}x"  # the argument wins
    async with opened(from_env, explicit):
        worker = make_worker(from_env, [one_step])
        async with serving(worker):
            run = await worker.client.submit(one_step, {"tag": "env"})
            assert await worker.client.result(run.run_id, timeout=10) == "env"
        assert await explicit.get_run(run.run_id) is None
    keys = all_keys(valkey_url, f"*{valkey_namespace}*")
    assert keys and all(k.startswith(f"{valkey_namespace}:") for k in keys)
    monkeypatch.delenv("PYRULA_VALKEY_NAMESPACE")
    assert ValkeyStore(url=valkey_url).namespace == "default"
